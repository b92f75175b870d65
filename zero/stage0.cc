#include "zero/stage0.h"

namespace zerostep {

Stage0::Stage0(const StageOptions& options, FlatBuffers buffers,
               Communicator* comm)
    : FlatStage(options, buffers, comm, /*partitioned=*/false,
                {Span{0, options.layout.padded_numel}}) {
  set_owned_grad(buf_.grads);
}

void Stage0::reduce_window(int64_t window_backwards, int64_t global_steps,
                           const char* phase) {
  internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                            window_backwards, global_steps);
  comm_->all_reduce(buffer(buf_.grads, layout_.padded_numel),
                    {ReduceOp::kAvg, phase});
}

// Note [Transactional update]: local and last, so nothing to undo.
void Stage0::apply_update(const OptimizerHyper& hyper) {
  update_owned(hyper, buf_.params);
  optimizer_.commit();  // nothing to wait for at stage 0
}

}  // namespace zerostep
