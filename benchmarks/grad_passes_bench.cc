// grad_passes_bench: the passes every step makes over the gradient besides
// the optimizer's, on the host (zero/kernels.h), each against its
// alternatives, timed alternately in one benchmark so that their ratios
// are taken under the same machine conditions (this is a shared 2-core
// VM).
//
// BM_GradNorm: the gradient norm (Kernels::sum_of_squares and
// divide_and_sum_of_squares) on each instruction set, against the fastest
// plain read of the same bytes:
//   scalar    Isa::kScalar: the plain loop, eight double partial sums the
//             compiler keeps in memory (the only path before 2026-12-02)
//   avx2      Isa::kAvx2: the partial sums in two registers, prefetching
//   avx512    Isa::kAvx512: in one register, prefetching
//   read      a loop that only reads the span (AVX-512 or AVX2, four float
//             accumulators, the same software prefetch): the ceiling
//
//   ./bazelw run //benchmarks:grad_passes_bench --
//       --benchmark_min_time=0.5 --benchmark_out=/tmp/passes.json
//       --benchmark_out_format=json
//   (one command line)
//
// One benchmark per (elements, divides): BM_GradNorm/elements:N/divides:D.
// N is a gradient's length: 1,132,384, 6,856,704 and 26,298,880, the
// 1M, 7M and 26M models of benchmarks/peers. D = 0 times sum_of_squares
// (read only: the step's pass when nothing divides the gradient), D = 1
// divide_and_sum_of_squares (read, divide, write back; the read loop is
// then the ceiling of its reads alone), dividing by 2 and by 0.5 in turn,
// so the values stay where they started. Each alternative has its own
// span, first-touched before timing with the same values; every iteration
// runs each alternative once, rotating which goes first; the manual time
// is the best ISA's ("best": the one kAuto picks, the widest this CPU
// has).
// Counters:
//   GBps_scalar, GBps_avx2, GBps_avx512, GBps_read   bytes read / median time
//   best_over_scalar     median over iterations of scalar time / best time
//   best_over_read       median of read time / best time (1.0: the pass
//                        reads as fast as a plain read)
//   ms_scalar, ms_avx2, ms_avx512, ms_read           median times
//   same_bits            1 when every ISA returned the same bits in every
//                        iteration (0 would be a bug)
//
// BM_ZeroGrad: clearing the gradient after a step (Kernels::zero; Note
// [Zeroing around the caches] in zero/kernels.cc), two ways, each followed
// by what the next backward does first to that memory, an accumulation
// pass (x[i] += y[i]), timed apart:
//   memset    std::memset, what zero() did before 2026-12-02
//   zero      host_kernels().zero(): streamed from 64 MiB on
// One benchmark per length (the same three). Counters:
//   ms_memset, ms_zero                   median times of the clearing
//   ms_add_after_memset, ms_add_after_zero   of the accumulation after it
//   zero_over_memset     median of memset time / zero time
//   total_over_memset    median of (memset + its add) / (zero + its add)
//
// Benchmarks never run under `bazel test`: the target is tagged
// "benchmark" and is a cc_binary.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "offload/fused_adam.h"
#include "zero/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZS_BENCH_X86 1
#else
#define ZS_BENCH_X86 0
#endif

namespace zerostep {
namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Span = std::unique_ptr<float[], FreeDeleter>;

// 64-byte aligned, as the engine's flat buffers are; first-touched with
// gradient-like values of both signs, magnitudes 2^-20 to 2^20 (large
// enough that halving them for every iteration stays normal).
Span make_span(size_t n, uint64_t seed) {
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  Span s(static_cast<float*>(std::aligned_alloc(64, bytes)));
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const float m = static_cast<float>((x >> 40) & 0xFFFFFF) / 16777216.0f;
    const int e = static_cast<int>((x >> 20) % 41) - 20;
    s[i] = std::ldexp((x & 1) ? -0.5f - m / 2 : 0.5f + m / 2, e + 40);
  }
  return s;
}

// The ceiling: read every byte, as little arithmetic as keeps the loads
// (float sums into four accumulators), the kernels' prefetch distance.
#if ZS_BENCH_X86
__attribute__((target("avx512f"))) float read_avx512(const float* x, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 + 256 <= n; i += 64) {
    __builtin_prefetch(x + i + 256, 0, 3);
    __builtin_prefetch(x + i + 256 + 16, 0, 3);
    __builtin_prefetch(x + i + 256 + 32, 0, 3);
    __builtin_prefetch(x + i + 256 + 48, 0, 3);
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
  }
  // Not _mm512_reduce_add_ps: GCC 12 warns inside its own header there.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes,
                  _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += x[i];
  return s;
}

__attribute__((target("avx2"))) float read_avx2(const float* x, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 + 256 <= n; i += 32) {
    __builtin_prefetch(x + i + 256, 0, 3);
    __builtin_prefetch(x + i + 256 + 16, 0, 3);
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes,
                  _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += x[i];
  return s;
}
#endif

float read_plain(const float* x, size_t n) {
  float s = 0;
  for (size_t i = 0; i < n; ++i) s += x[i];
  return s;
}

float read_span(const float* x, size_t n) {
#if ZS_BENCH_X86
  if (fused_adam_best_isa() == Isa::kAvx512) return read_avx512(x, n);
  if (fused_adam_best_isa() == Isa::kAvx2) return read_avx2(x, n);
#endif
  return read_plain(x, n);
}

using bench::median;
using bench::seconds;

void BM_GradNorm(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const bool divides = state.range(1) != 0;
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (fused_adam_isa_supported(isa)) isas.push_back(isa);
  const size_t alts = isas.size() + 1;  // the ISAs, then the read loop
  std::vector<Span> spans;
  for (size_t a = 0; a < alts; ++a) spans.push_back(make_span(n, 7));
  std::vector<std::vector<double>> t(alts);
  std::vector<double> best_over_scalar, best_over_read;
  std::vector<double> result(isas.size());
  bool same = true;
  volatile float sink = 0;
  double divisor = 2.0;
  auto run = [&](size_t a) {
    float* x = spans[a].get();
    if (a == isas.size()) {
      sink = sink + read_span(x, n);
      return;
    }
    result[a] = divides ? internal::host_divide_and_sum_of_squares(
                              x, n, divisor, 1.0, isas[a])
                        : internal::host_sum_of_squares(x, n, isas[a]);
  };
  auto check = [&] {
    for (double r : result) same = same && std::memcmp(&r, &result[0], 8) == 0;
    divisor = 1.0 / divisor;
  };
  for (size_t a = 0; a < alts; ++a) run(a);  // warm-up
  check();
  size_t round = 0;
  for (auto _ : state) {
    std::vector<double> now(alts);
    for (size_t k = 0; k < alts; ++k) {
      const size_t a = (k + round) % alts;
      now[a] = seconds([&] { run(a); });
      t[a].push_back(now[a]);
    }
    ++round;
    check();
    const size_t best = isas.size() - 1;
    best_over_scalar.push_back(now[0] / now[best]);
    best_over_read.push_back(now[isas.size()] / now[best]);
    state.SetIterationTime(now[best]);
  }
  const double bytes = static_cast<double>(n) * sizeof(float);
  for (size_t a = 0; a < alts; ++a) {
    const std::string name =
        a == isas.size() ? "read" : fused_adam_isa_name(isas[a]);
    state.counters["GBps_" + name] = bytes / median(t[a]) / 1e9;
    state.counters["ms_" + name] = median(t[a]) * 1e3;
  }
  state.counters["best_over_scalar"] = median(best_over_scalar);
  state.counters["best_over_read"] = median(best_over_read);
  state.counters["same_bits"] = same ? 1 : 0;
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

BENCHMARK(BM_GradNorm)
    ->ArgNames({"elements", "divides"})
    ->ArgsProduct({{1132384, 6856704, 26298880}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void add_into(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}

void BM_ZeroGrad(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  Span a = make_span(n, 3), b = make_span(n, 3), y = make_span(n, 5);
  std::vector<double> tm, tz, am, az, zero_over, total_over;
  size_t round = 0;
  for (auto _ : state) {
    double m = 0, z = 0, m_add = 0, z_add = 0;
    auto by_memset = [&] {
      m = seconds([&] { std::memset(a.get(), 0, n * sizeof(float)); });
      m_add = seconds([&] { add_into(a.get(), y.get(), n); });
    };
    auto by_zero = [&] {
      z = seconds([&] { host_kernels().zero(b.get(), n); });
      z_add = seconds([&] { add_into(b.get(), y.get(), n); });
    };
    if (round++ % 2 == 0) {
      by_memset();
      by_zero();
    } else {
      by_zero();
      by_memset();
    }
    tm.push_back(m);
    tz.push_back(z);
    am.push_back(m_add);
    az.push_back(z_add);
    zero_over.push_back(m / z);
    total_over.push_back((m + m_add) / (z + z_add));
    state.SetIterationTime(z);
  }
  state.counters["ms_memset"] = median(tm) * 1e3;
  state.counters["ms_zero"] = median(tz) * 1e3;
  state.counters["ms_add_after_memset"] = median(am) * 1e3;
  state.counters["ms_add_after_zero"] = median(az) * 1e3;
  state.counters["zero_over_memset"] = median(zero_over);
  state.counters["total_over_memset"] = median(total_over);
  state.SetBytesProcessed(static_cast<int64_t>(n * sizeof(float)) *
                          state.iterations());
}

BENCHMARK(BM_ZeroGrad)
    ->ArgNames({"elements"})
    ->Arg(1132384)
    ->Arg(6856704)
    ->Arg(26298880)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

BENCHMARK_MAIN();
