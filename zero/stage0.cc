#include "zero/stage0.h"

#include <cmath>
#include <cstring>

namespace zerostep {

Stage0::Stage0(const StageOptions& options, FlatBuffers buffers,
               Communicator* comm)
    : layout_(options.layout),
      buf_(buffers),
      comm_(comm),
      optimizer_(options.optimizer, options.layout.padded_numel) {}

void Stage0::reduce_window(int64_t window_backwards, int64_t global_steps,
                           Phase phase) {
  internal::agree_on_window(*comm_, window_backwards, global_steps);
  comm_->all_reduce(Buffer::of(buf_.grads, layout_.padded_numel),
                    {ReduceOp::kAvg, phase});
}

GradStats Stage0::finalize(double divisor, double clip) {
  const size_t n = layout_.padded_numel;
  internal::divide(buf_.grads, n, divisor);
  GradStats stats;
  // Every rank holds the same reduced gradient: the local norm is global.
  stats.global_norm = std::sqrt(internal::sum_of_squares(buf_.grads, n));
  const float coef = internal::clip_coefficient(stats.global_norm, clip);
  if (coef < 1.0f) {
    internal::scale(buf_.grads, n, coef);
    stats.clipped = true;
  }
  return stats;
}

void Stage0::apply_update(const OptimizerHyper& hyper) {
  optimizer_.step(buf_.params, buf_.grads, hyper);
}

void Stage0::zero_grad() {
  std::memset(buf_.grads, 0, layout_.padded_numel * sizeof(float));
}

MemoryStats Stage0::memory() const {
  MemoryStats m;
  m.param_bytes = layout_.padded_numel * sizeof(float);
  m.grad_bytes = layout_.padded_numel * sizeof(float);
  m.optimizer_state_bytes = optimizer_.state_bytes();
  return m;
}

}  // namespace zerostep
