#include "zero/stage.h"

#include <cmath>
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
      throw UsageError("zero_optimization.stage = " +
                       std::to_string(options.stage) +
                       " is not available in this build (stages 0 and 1 "
                       "are). Fix: use stage 0 or 1");
  }
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
       << " backward() call" << (all[2 * r] == 1 ? "" : "s") << " at global step "
       << all[2 * r + 1];
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
