#include "zero/stage0.h"

#include <algorithm>

#include "common/errors.h"
#include "zero/stage2.h"

namespace zerostep {

Stage0::Stage0(const StageOptions& options, FlatBuffers buffers,
               Communicator* comm)
    : FlatStage(options, buffers, comm, /*partitioned=*/false,
                {Span{0, options.layout.padded_numel}}),
      overlap_comm_(options.overlap_comm),
      buckets_(internal::make_buckets(options.layout,
                                      options.reduce_bucket_size)) {
  set_owned_grad(buf_.grads);
  internal::index_buckets(layout_, buckets_, &buckets_of_param_,
                          &params_in_bucket_);
  launched_.assign(buckets_.size(), false);
}

// Note [Stage 0 buckets]: managed mode with overlap_comm agrees before the
// boundary backward's autograd pass, so that its buckets can go during it.
void Stage0::begin_boundary_backward(int64_t window_backwards,
                                     int64_t global_steps) {
  if (!overlap_comm_) return;
  internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                            window_backwards, global_steps);
  begun_ = true;
  pending_ = params_in_bucket_;
  std::fill(launched_.begin(), launched_.end(), false);
  works_.clear();
}

void Stage0::launch(size_t k, const char* phase) {
  const Span& b = buckets_[k];
  launched_[k] = true;
  works_.push_back(comm_->all_reduce_async(buffer(buf_.grads + b.offset, b.numel),
                                           {ReduceOp::kAvg, phase}));
}

void Stage0::on_grad_ready(size_t param_index) {
  if (!begun_) return;  // not the boundary backward
  ZS_CHECK(param_index < buckets_of_param_.size());
  for (size_t k : buckets_of_param_[param_index]) {
    ZS_CHECK(pending_[k] > 0);
    if (--pending_[k] == 0 && !launched_[k]) launch(k, phase::kBackward);
  }
}

void Stage0::reduce_window(int64_t window_backwards, int64_t global_steps,
                           const char* phase) {
  if (!begun_) {
    internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                              window_backwards, global_steps);
    std::fill(launched_.begin(), launched_.end(), false);
    works_.clear();
  }
  begun_ = false;
  // Buckets not launched during autograd (all of them, but with
  // overlap_comm's boundary backward) go now, in bucket order.
  for (size_t k = 0; k < buckets_.size(); ++k)
    if (!launched_[k]) launch(k, phase);
  for (const std::shared_ptr<Work>& w : works_) w->wait();
  works_.clear();
}

// Note [Transactional update]: local and last, so nothing to undo.
void Stage0::apply_update(const OptimizerHyper& hyper) {
  update_owned(hyper, buf_.params);
  optimizer_.commit();  // nothing to wait for at stage 0
}

}  // namespace zerostep
