// The statistics the benchmarks share: the median of their samples and the
// wall time of one call. Header-only and free of LibTorch.
#ifndef ZEROSTEP_BENCHMARKS_BENCH_STATS_H_
#define ZEROSTEP_BENCHMARKS_BENCH_STATS_H_

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace zerostep {
namespace bench {

// The middle sample, or the mean of the two middle ones for an even count;
// 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double hi = v[mid];
  if (v.size() % 2 == 1) return hi;
  return (hi + *std::max_element(v.begin(), v.begin() + mid)) / 2.0;
}

// Seconds of wall time (steady clock) that f() takes.
template <typename F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  std::forward<F>(f)();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace bench
}  // namespace zerostep

#endif  // ZEROSTEP_BENCHMARKS_BENCH_STATS_H_
