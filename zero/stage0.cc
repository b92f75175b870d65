#include "zero/stage0.h"

#include "common/errors.h"
#include "zero/stage2.h"

namespace zerostep {

Stage0::Stage0(const StageOptions& options, const Stage0Options& own,
               FlatBuffers buffers, Communicator* comm)
    : FlatStage(options, buffers, comm, /*stage=*/0,
                {Span{0, options.layout.padded_numel}}),
      overlap_comm_(own.overlap_comm),
      launcher_(options.layout, own.reduce_bucket_size,
                [this](size_t k, const char* phase) {
                  const Span& b = launcher_.buckets()[k];
                  // Note [Gradient averaging] in zero/averaging.h.
                  scale_before_sum(k_, averaging_, buf_.grads + b.offset,
                                   b.numel);
                  return comm_->all_reduce_async(
                      buffer(buf_.grads + b.offset, b.numel),
                      {averaging_.scaled ? ReduceOp::kSum : ReduceOp::kAvg,
                       phase});
                }) {
  set_owned_grad(buf_.grads);
}

// Note [Stage 0 buckets]: managed mode with overlap_comm agrees before the
// boundary backward's autograd pass, so that its buckets can go during it.
void Stage0::begin_boundary_backward(int64_t window_backwards,
                                     int64_t global_steps) {
  if (!overlap_comm_) return;
  internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                            window_backwards, global_steps);
  begun_ = true;
  launcher_.begin();
}

void Stage0::on_grad_ready(size_t param_index) {
  if (!begun_) return;  // not the boundary backward
  launcher_.ready(param_index, phase::kBackward);
}

void Stage0::reduce_window(int64_t window_backwards, int64_t global_steps,
                           const char* phase) {
  if (!begun_) {
    internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                              window_backwards, global_steps);
    launcher_.begin();
  }
  begun_ = false;
  // Buckets not launched during autograd (all of them, but with
  // overlap_comm's boundary backward) go now, in bucket order.
  launcher_.finish(phase);
}

// Note [Transactional update]: local and last, so nothing to undo.
void Stage0::apply_update(const OptimizerHyper& hyper) {
  update_owned(hyper, buf_.params);
  optimizer_.commit();  // nothing to wait for at stage 0
}

}  // namespace zerostep
