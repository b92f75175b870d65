// sim_comm_bench: the simulator's float32 all-reduce against a memcpy of the
// same number of bytes, both timed in the same benchmark run.
//
//   ./bazelw run -c opt //benchmarks:sim_comm_bench --
//       --benchmark_min_time=0.2 --benchmark_format=json
//       --benchmark_out=/tmp/sim_comm.json
//   (one command line)
//
// One benchmark per (MiB per rank, world size). Every buffer is allocated
// and first-touched before timing (first-touching fresh pages is an order of
// magnitude slower than copying touched memory). Each iteration:
//   - one SimWorld::run in which every rank enters a barrier, then an
//     all_reduce (kAvg, the op the ZeRO stages use) of its own buffer of
//     `bytes`; rank 0 times from the end of the barrier to the return of the
//     all-reduce (every rank is released at the same moment);
//   - one std::memcpy of `bytes` between two touched buffers on the
//     benchmark thread.
// The manual iteration time is the all-reduce's, so bytes_per_second is the
// all-reduce's algorithm bandwidth (bytes per rank / time). Counters:
//   allreduce_bytes_per_second, memcpy_bytes_per_second
//   allreduce_over_memcpy   allreduce bandwidth / memcpy bandwidth
//                           (= total memcpy time / total all-reduce time)
//   allreduce_ms, memcpy_ms mean times
//
// Benchmarks never run under `bazel test`: the target is tagged "benchmark"
// and is a cc_binary.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "sim/sim_world.h"

namespace zerostep {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void BM_AllReduceVsMemcpy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  const int world_size = static_cast<int>(state.range(1));
  const size_t numel = bytes / sizeof(float);

  SimWorld world(SimOptions{world_size, 0});
  // Value-initialisation writes every element: all pages are touched here.
  // Ones stay ones under kAvg, so the values never drift.
  std::vector<std::vector<float>> bufs(world_size,
                                       std::vector<float>(numel, 1.0f));
  std::vector<char> src(bytes, 1), dst(bytes, 0);

  auto all_reduce = [&]() {
    double elapsed = 0.0;
    world.run([&](int r) {
      Communicator& comm = world.comm(r);
      comm.barrier();
      const Clock::time_point t0 = Clock::now();
      comm.all_reduce(Buffer::of(bufs[r].data(), numel),
                      {ReduceOp::kAvg, "step"});
      const Clock::time_point t1 = Clock::now();
      if (r == 0) elapsed = seconds(t0, t1);
    });
    return elapsed;
  };
  auto copy = [&]() {
    const Clock::time_point t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
    const Clock::time_point t1 = Clock::now();
    return seconds(t0, t1);
  };

  // Warm-up: one of each (the allocator's state for the simulator's
  // temporaries, the caches).
  all_reduce();
  copy();

  double total_ar = 0.0, total_mc = 0.0;
  int64_t n = 0;
  for (auto _ : state) {
    const double ar = all_reduce();
    const double mc = copy();
    total_ar += ar;
    total_mc += mc;
    ++n;
    state.SetIterationTime(ar);
  }
  benchmark::DoNotOptimize(dst.data());
  for (int r = 0; r < world_size; ++r) world.mutable_ledger(r).clear();
  if (n == 0) return;

  state.SetBytesProcessed(static_cast<int64_t>(bytes) * n);
  const double moved = static_cast<double>(bytes) * static_cast<double>(n);
  state.counters["allreduce_bytes_per_second"] = moved / total_ar;
  state.counters["memcpy_bytes_per_second"] = moved / total_mc;
  state.counters["allreduce_over_memcpy"] = total_mc / total_ar;
  state.counters["allreduce_ms"] = total_ar / static_cast<double>(n) * 1e3;
  state.counters["memcpy_ms"] = total_mc / static_cast<double>(n) * 1e3;
}

BENCHMARK(BM_AllReduceVsMemcpy)
    ->ArgNames({"MiB", "world"})
    ->ArgsProduct({benchmark::CreateRange(1, 64, /*multi=*/2), {2, 4}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

// main() comes from //third_party:benchmark_main.
