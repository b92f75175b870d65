#include "zero/stage.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "common/errors.h"
#include "zero/stage0.h"
#include "zero/stage1.h"

namespace zerostep {

std::unique_ptr<Stage> make_stage(const StageOptions& options,
                                  FlatBuffers buffers, Communicator* comm) {
  ZS_CHECK(comm != nullptr);
  ZS_CHECK(buffers.params != nullptr);
  ZS_CHECK(buffers.grads != nullptr);
  ZS_CHECK(options.layout.world_size == comm->world_size());
  switch (options.stage) {
    case 0:
      return std::make_unique<Stage0>(options, buffers, comm);
    case 1:
      return std::make_unique<Stage1>(options, buffers, comm);
    default:
      throw UsageError(
          "zero_optimization.stage = " + std::to_string(options.stage) +
          " is not available in this build (stages 0 and 1 "
          "are). Fix: use stage 0 or 1");
  }
}

FlatStage::FlatStage(const StageOptions& options, FlatBuffers buffers,
                     Communicator* comm, bool partitioned, size_t owned_offset,
                     size_t owned_numel)
    : layout_(options.layout),
      buf_(buffers),
      comm_(comm),
      partitioned_(partitioned),
      owned_offset_(owned_offset),
      owned_numel_(owned_numel),
      optimizer_(options.optimizer, owned_numel) {
  ZS_CHECK(owned_offset + owned_numel <= layout_.padded_numel);
}

GradStats FlatStage::finalize(double divisor, double clip) {
  ZS_CHECK(owned_grad_ != nullptr);
  internal::divide(owned_grad_, owned_numel_, divisor);
  GradStats stats;
  double sq = internal::sum_of_squares(owned_grad_, owned_numel_);
  // A replicated gradient's local norm is the global one; a partition's is
  // not (one 8-byte all-reduce per step, in both modes).
  if (partitioned_)
    comm_->all_reduce(Buffer::of(&sq, 1), {ReduceOp::kSum, Phase::kStep});
  stats.global_norm = std::sqrt(sq);
  const float coef = internal::clip_coefficient(stats.global_norm, clip);
  if (coef < 1.0f) {
    internal::scale(owned_grad_, owned_numel_, coef);
    stats.clipped = true;
  }
  return stats;
}

void FlatStage::update_owned(const OptimizerHyper& hyper) {
  optimizer_.step(buf_.params + owned_offset_, owned_grad_, hyper);
}

void FlatStage::zero_grad() {
  std::memset(buf_.grads, 0, layout_.padded_numel * sizeof(float));
  if (partitioned_) std::memset(owned_grad_, 0, owned_numel_ * sizeof(float));
}

MemoryStats FlatStage::memory() const {
  MemoryStats m;
  m.param_bytes = layout_.padded_numel * sizeof(float);
  m.grad_bytes = layout_.padded_numel * sizeof(float) +
                 (partitioned_ ? owned_numel_ * sizeof(float) : 0);
  m.optimizer_state_bytes = optimizer_.state_bytes();
  return m;
}

namespace internal {

void agree_on_window(Communicator& comm, int64_t window_backwards,
                     int64_t global_steps) {
  const int w = comm.world_size();
  int64_t mine[2] = {window_backwards, global_steps};
  std::vector<int64_t> all(2 * w);
  comm.all_gather(Buffer::of(mine, 2), Buffer::of(all.data(), all.size()),
                  {Phase::kStep});
  bool agree = true;
  for (int r = 1; r < w; ++r)
    agree = agree && all[2 * r] == all[0] && all[2 * r + 1] == all[1];
  if (agree) return;
  std::ostringstream os;
  os << "ranks disagree on the accumulation window (rank " << comm.rank()
     << " reporting): ";
  for (int r = 0; r < w; ++r) {
    os << (r ? ", " : "") << "rank " << r << " ran " << all[2 * r]
       << " backward() call" << (all[2 * r] == 1 ? "" : "s")
       << " at global step " << all[2 * r + 1];
  }
  os << ". Every rank must call backward() the same number of times before "
        "each step(); no gradient was reduced and no parameter was updated";
  throw UsageError(os.str());
}

double sum_of_squares(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void divide(float* x, size_t n, double divisor) {
  if (divisor == 1.0) return;
  const float d = static_cast<float>(divisor);
  for (size_t i = 0; i < n; ++i) x[i] = x[i] / d;
}

void scale(float* x, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace internal
}  // namespace zerostep
