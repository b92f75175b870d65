#include "zero/stage1.h"

#include <cmath>
#include <cstring>

namespace zerostep {

Stage1::Stage1(const StageOptions& options, FlatBuffers buffers,
               Communicator* comm)
    : layout_(options.layout),
      buf_(buffers),
      comm_(comm),
      optimizer_(options.optimizer, options.layout.partition_numel),
      grad_partition_(options.layout.partition_numel, 0.0f) {}

void Stage1::reduce_window(int64_t window_backwards, int64_t global_steps,
                           Phase phase) {
  internal::agree_on_window(*comm_, window_backwards, global_steps);
  comm_->reduce_scatter(
      Buffer::of(buf_.grads, layout_.padded_numel),
      Buffer::of(grad_partition_.data(), layout_.partition_numel),
      {ReduceOp::kAvg, phase});
}

GradStats Stage1::finalize(double divisor, double clip) {
  const size_t n = layout_.partition_numel;
  internal::divide(grad_partition_.data(), n, divisor);
  GradStats stats;
  // The norm spans every partition: one 8-byte all-reduce per step (both
  // modes), so get_global_grad_norm() is always available.
  double sq = internal::sum_of_squares(grad_partition_.data(), n);
  comm_->all_reduce(Buffer::of(&sq, 1), {ReduceOp::kSum, Phase::kStep});
  stats.global_norm = std::sqrt(sq);
  const float coef = internal::clip_coefficient(stats.global_norm, clip);
  if (coef < 1.0f) {
    internal::scale(grad_partition_.data(), n, coef);
    stats.clipped = true;
  }
  return stats;
}

void Stage1::apply_update(const OptimizerHyper& hyper) {
  float* mine = buf_.params + layout_.partition_begin(comm_->rank());
  optimizer_.step(mine, grad_partition_.data(), hyper);
  comm_->all_gather(Buffer::of(mine, layout_.partition_numel),
                    Buffer::of(buf_.params, layout_.padded_numel),
                    {Phase::kStep});
}

void Stage1::zero_grad() {
  std::memset(buf_.grads, 0, layout_.padded_numel * sizeof(float));
  std::fill(grad_partition_.begin(), grad_partition_.end(), 0.0f);
}

MemoryStats Stage1::memory() const {
  MemoryStats m;
  m.param_bytes = layout_.padded_numel * sizeof(float);
  m.grad_bytes =
      (layout_.padded_numel + layout_.partition_numel) * sizeof(float);
  m.optimizer_state_bytes = optimizer_.state_bytes();
  return m;
}

}  // namespace zerostep
