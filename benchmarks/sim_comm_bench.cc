// sim_comm_bench: the simulator's float32 all-reduce and reduce-scatter
// against a memcpy of the same number of bytes, timed in the same run.
//
//   ./bazelw run -c opt //benchmarks:sim_comm_bench --
//       --benchmark_min_time=0.2 --benchmark_format=json
//       --benchmark_out=/tmp/sim_comm.json
//   (one command line)
//
// One benchmark per (collective, MiB per rank, world size): 1, 16 and
// 64 MiB per rank at worlds 2, 4 and 8. Every buffer is allocated and
// first-touched before timing (first-touching fresh pages is an order of
// magnitude slower than copying touched memory). Each iteration:
//   - one SimWorld::run in which every rank enters a barrier, then the
//     collective (kAvg, the op the ZeRO stages use) on its own buffer of
//     `bytes`: an in-place all_reduce, or a reduce_scatter of `bytes` of
//     input into bytes / world of output; rank 0 times from the end of the
//     barrier to the return of the collective (every rank is released at
//     the same moment);
//   - one std::memcpy of `bytes` between two touched buffers on the
//     benchmark thread.
// The manual iteration time is the collective's, so bytes_per_second is its
// algorithm bandwidth (input bytes per rank / time). Counters, with
// PREFIX = allreduce or reducescatter:
//   PREFIX_bytes_per_second, memcpy_bytes_per_second
//   PREFIX_over_memcpy      collective bandwidth / memcpy bandwidth
//                           (= total memcpy time / total collective time):
//                           the algorithm-bandwidth ratio
//   PREFIX_traffic_over_memcpy
//                           memory traffic per second of the collective /
//                           that of the memcpy. An all-reduce of n bytes
//                           per rank reads W·n and writes W·n bytes, a
//                           reduce-scatter reads W·n and writes n, a memcpy
//                           reads n and writes n; so this is W (all-reduce)
//                           or (W + 1) / 2 (reduce-scatter) times the
//                           algorithm-bandwidth ratio
//   PREFIX_ms, memcpy_ms    mean times
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

enum class Kind { kAllReduce, kReduceScatter };

void run_vs_memcpy(benchmark::State& state, Kind kind) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  const int world_size = static_cast<int>(state.range(1));
  const size_t numel = bytes / sizeof(float);
  const size_t out_numel = numel / static_cast<size_t>(world_size);
  const std::string prefix =
      kind == Kind::kAllReduce ? "allreduce" : "reducescatter";

  SimWorld world(SimOptions{world_size, 0});
  // Value-initialisation writes every element: all pages are touched here.
  // Ones stay ones under kAvg, so the values never drift.
  std::vector<std::vector<float>> bufs(world_size,
                                       std::vector<float>(numel, 1.0f));
  std::vector<std::vector<float>> outs(
      kind == Kind::kReduceScatter ? world_size : 0,
      std::vector<float>(out_numel, 0.0f));
  std::vector<char> src(bytes, 1), dst(bytes, 0);

  auto collective = [&]() {
    double elapsed = 0.0;
    world.run([&](int r) {
      Communicator& comm = world.comm(r);
      comm.barrier();
      const Clock::time_point t0 = Clock::now();
      if (kind == Kind::kAllReduce) {
        comm.all_reduce(Buffer::of(bufs[r].data(), numel),
                        {ReduceOp::kAvg, "step"});
      } else {
        comm.reduce_scatter(Buffer::of(bufs[r].data(), out_numel * world_size),
                            Buffer::of(outs[r].data(), out_numel),
                            {ReduceOp::kAvg, "step"});
      }
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
  collective();
  copy();

  double total_co = 0.0, total_mc = 0.0;
  int64_t n = 0;
  for (auto _ : state) {
    const double co = collective();
    const double mc = copy();
    total_co += co;
    total_mc += mc;
    ++n;
    state.SetIterationTime(co);
  }
  benchmark::DoNotOptimize(dst.data());
  for (int r = 0; r < world_size; ++r) world.mutable_ledger(r).clear();
  if (n == 0) return;

  state.SetBytesProcessed(static_cast<int64_t>(bytes) * n);
  const double moved = static_cast<double>(bytes) * static_cast<double>(n);
  state.counters[prefix + "_bytes_per_second"] = moved / total_co;
  state.counters["memcpy_bytes_per_second"] = moved / total_mc;
  state.counters[prefix + "_over_memcpy"] = total_mc / total_co;
  const double w = static_cast<double>(world_size);
  const double traffic_per_memcpy =  // (reads + writes) / (n + n)
      kind == Kind::kAllReduce ? (w + w) / 2.0 : (w + 1.0) / 2.0;
  state.counters[prefix + "_traffic_over_memcpy"] =
      traffic_per_memcpy * total_mc / total_co;
  state.counters[prefix + "_ms"] = total_co / static_cast<double>(n) * 1e3;
  state.counters["memcpy_ms"] = total_mc / static_cast<double>(n) * 1e3;
}

void BM_AllReduceVsMemcpy(benchmark::State& state) {
  run_vs_memcpy(state, Kind::kAllReduce);
}

void BM_ReduceScatterVsMemcpy(benchmark::State& state) {
  run_vs_memcpy(state, Kind::kReduceScatter);
}

BENCHMARK(BM_AllReduceVsMemcpy)
    ->ArgNames({"MiB", "world"})
    ->ArgsProduct({{1, 16, 64}, {2, 4, 8}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_ReduceScatterVsMemcpy)
    ->ArgNames({"MiB", "world"})
    ->ArgsProduct({{1, 16, 64}, {2, 4, 8}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

// main() comes from //third_party:benchmark_main.
