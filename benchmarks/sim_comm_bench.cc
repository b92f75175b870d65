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
// BM_ReadBound/MiB:M/world:W: the bound of both collectives' row (M, W),
// which no implementation of them can pass on this machine as far as no
// read is quicker than ours (Note [Read bound] below). Counters:
//   read_bound_over_memcpy  memcpy time / time to read the W inputs
//   read_threads            the threads that read them: min(W, CPUs)
//   read_ms, memcpy_ms      mean times
//
// Benchmarks never run under `bazel test`: the target is tagged "benchmark"
// and is a cc_binary.
#include <benchmark/benchmark.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
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

// Seconds of one std::memcpy of `src` into `*dst` (as large), the
// benchmarks' yardstick.
double memcpy_seconds(std::vector<char>* dst, const std::vector<char>& src) {
  const Clock::time_point t0 = Clock::now();
  std::memcpy(dst->data(), src.data(), src.size());
  benchmark::ClobberMemory();
  return seconds(t0, Clock::now());
}

// Note [Read bound]
// ~~~~~~~~~~~~~~~~~
// Whatever its algorithm, an all-reduce or reduce-scatter of n bytes per
// rank reads every rank's input at least once: W·n bytes. The quickest way
// we know to read them here is one thread per core, each reading an equal
// share at once (read_span below), started together and with nothing else
// to do: no writes, which the collective also needs (W·n for an
// all-reduce, n for a reduce-scatter), no rendezvous, no arithmetic beyond
// keeping the loads. So memcpy time / that read time bounds the
// collective's ratio to memcpy from above, for the simulator and for any
// other implementation on the same cores, as far as no read of those bytes
// is quicker than read_span. It is measured in a benchmark of its own, at
// another moment than the collectives on a shared machine, so a collective
// that runs at the bound can come out a little above it in one run; a row
// whose bound is well below the target cannot reach the target on this
// machine. (A tighter bound for the all-reduce, which also writes W·n
// bytes, was tried: a pass writing every element back unchanged, by the
// same threads. The simulator's all-reduce of 16 MiB at world 4 ran faster
// than that pass on an AMD EPYC, so it bounds nothing and is not kept.)
// The threads are min(W, usable CPUs): with a core per rank (W at most the
// CPUs) the bound grows with W, as a machine with more cores would show.

// The CPUs this thread may run on (its affinity mask, which the simulator
// counts too: sim/sim_world.cc), in order; empty if unknown.
std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Binds the calling thread to one CPU (no-op for an unknown one, -1).
void pin_to(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Vectors of 8 and 16 floats (GCC's vector extension).
typedef float Floats8 __attribute__((vector_size(32)));
typedef float Floats16 __attribute__((vector_size(64)));

// The read of Note [Read bound]: x[0, n) as four streams at once (its
// quarters), in the widest vector loads the CPU has, summed into four
// accumulators so that the loads stay, with no software prefetch. Of the
// reads tried on an AMD EPYC with 2 threads (one stream with the host
// kernels' prefetch, one without, these four streams) this was the fastest
// or level at 4 and 8 MiB (from the caches) and at 128 MiB (from memory);
// the prefetching one was the slowest, by up to 25% in the caches. Each
// load is one Vec; inlined into a caller compiled for the instruction set
// of that width.
template <typename Vec>
__attribute__((always_inline)) inline float read_lanes(const float* x,
                                                       size_t n) {
  constexpr size_t kLanes = sizeof(Vec) / sizeof(float);
  const size_t q = n / 4 / kLanes * kLanes;
  const float *p0 = x, *p1 = x + q, *p2 = x + 2 * q, *p3 = x + 3 * q;
  Vec a0 = {}, a1 = {}, a2 = {}, a3 = {}, v;
  for (size_t i = 0; i < q; i += kLanes) {
    std::memcpy(&v, p0 + i, sizeof(v));
    a0 += v;
    std::memcpy(&v, p1 + i, sizeof(v));
    a1 += v;
    std::memcpy(&v, p2 + i, sizeof(v));
    a2 += v;
    std::memcpy(&v, p3 + i, sizeof(v));
    a3 += v;
  }
  const Vec a = (a0 + a1) + (a2 + a3);
  float s = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) s += a[l];
  for (size_t i = 4 * q; i < n; ++i) s += x[i];
  return s;
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) float read_avx512(const float* x, size_t n) {
  return read_lanes<Floats16>(x, n);
}

__attribute__((target("avx2"))) float read_avx2(const float* x, size_t n) {
  return read_lanes<Floats8>(x, n);
}
#endif

// Without AVX2 a plain loop (scalar loads: the bound is then low, and says
// so only of this loop).
float read_span(const float* x, size_t n) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx512) return read_avx512(x, n);
  if (avx2) return read_avx2(x, n);
#endif
  float s = 0.0f;
  for (size_t i = 0; i < n; ++i) s += x[i];
  return s;
}

// Reads elements [begin, end) of the buffers laid end to end; returns
// their sum (kept by the caller so that the loads stay).
float read_range(const std::vector<std::vector<float>>& bufs, size_t begin,
                 size_t end) {
  float sum = 0.0f;
  size_t base = 0;
  for (const std::vector<float>& b : bufs) {
    const size_t lo = std::max(begin, base);
    const size_t hi = std::min(end, base + b.size());
    if (lo < hi) sum += read_span(b.data() + (lo - base), hi - lo);
    base += b.size();
  }
  return sum;
}

// Seconds for one thread on each of `cpus` to read every element of `bufs`
// once, an equal share each (Note [Read bound]). Each thread is bound to its
// CPU (a new thread starts on its creator's CPU, and two there would take
// turns by the scheduler's tick); the calling thread takes the first and
// gets its own mask back after. The clock starts when every thread is
// running and waiting, and stops when the last share is read.
double parallel_read_seconds(const std::vector<std::vector<float>>& bufs,
                             const std::vector<int>& cpus) {
  const int threads = static_cast<int>(std::max<size_t>(1, cpus.size()));
  const auto cpu = [&](int t) { return cpus.empty() ? -1 : cpus[t]; };
  cpu_set_t saved;
  const bool restore =
      pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved) == 0;
  pin_to(cpu(0));
  size_t total = 0;
  for (const std::vector<float>& b : bufs) total += b.size();
  const auto share = [&](int t) {
    const size_t tt = static_cast<size_t>(threads);
    return read_range(bufs, total * t / tt, total * (t + 1) / tt);
  };
  std::vector<float> sums(threads, 0.0f);
  std::atomic<int> ready{0}, done{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> crew;
  for (int t = 1; t < threads; ++t) {
    crew.emplace_back([&, t] {
      pin_to(cpu(t));
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      sums[t] = share(t);
      done.fetch_add(1, std::memory_order_release);
    });
  }
  while (ready.load() < threads - 1) std::this_thread::yield();
  const Clock::time_point t0 = Clock::now();
  go.store(true, std::memory_order_release);
  sums[0] = share(0);
  while (done.load(std::memory_order_acquire) < threads - 1) {
  }
  const Clock::time_point t1 = Clock::now();
  for (std::thread& th : crew) th.join();
  // The simulator's rank threads inherit this thread's mask.
  if (restore) pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  benchmark::DoNotOptimize(sums.data());
  return seconds(t0, t1);
}

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
  auto copy = [&]() { return memcpy_seconds(&dst, src); };

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

// Note [Read bound]: W buffers of `MiB` each, read by min(W, CPUs) pinned
// threads, against a memcpy of one buffer, alternately. A benchmark of its
// own: a read between the collectives of run_vs_memcpy slowed them (the
// in-place all-reduce of 1 MiB at world 2 ran at about half its speed on an
// AMD EPYC; likely, not measured: its buffers were then shared between the
// cores' caches).
void BM_ReadBound(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  const int world_size = static_cast<int>(state.range(1));
  std::vector<std::vector<float>> bufs(
      world_size, std::vector<float>(bytes / sizeof(float), 1.0f));
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::vector<int> cpus = usable_cpus();
  if (cpus.size() > static_cast<size_t>(world_size)) cpus.resize(world_size);
  auto copy = [&]() { return memcpy_seconds(&dst, src); };
  copy();  // warm-up
  parallel_read_seconds(bufs, cpus);
  double total_rd = 0.0, total_mc = 0.0;
  int64_t n = 0;
  for (auto _ : state) {
    const double rd = parallel_read_seconds(bufs, cpus);
    total_mc += copy();
    total_rd += rd;
    ++n;
    state.SetIterationTime(rd);
  }
  benchmark::DoNotOptimize(dst.data());
  if (n == 0) return;
  state.counters["read_bound_over_memcpy"] = total_mc / total_rd;
  state.counters["read_threads"] =
      static_cast<double>(std::max<size_t>(1, cpus.size()));
  state.counters["read_ms"] = total_rd / static_cast<double>(n) * 1e3;
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

BENCHMARK(BM_ReadBound)
    ->ArgNames({"MiB", "world"})
    ->ArgsProduct({{1, 16, 64}, {2, 4, 8}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

// main() comes from //third_party:benchmark_main.
