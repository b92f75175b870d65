// fused_adam_bench: parameters per second of one AdamW step over a flat
// float32 span, three ways, timed alternately in the same benchmark so that
// their ratios are taken under the same machine conditions (this is a
// shared 2-core VM):
//   kernel    zerostep::fused_adam_step (offload/fused_adam.h), ISA kAuto
//   torch     torch::optim::AdamW::step() on one 1-D tensor of the same
//             size, with torch::set_num_threads(threads)
//   roofline  a loop with Adam's memory traffic and no arithmetic: load p,
//             g, m, v, store p, m, v (28 bytes per parameter), split over
//             threads by the kernel's own parallel_chunks, with the kernel's
//             vector width
//   roofline_prefetch  the same loop with the kernel's software prefetch
//             (1 KiB ahead per stream). The kernel prefetches and the plain
//             loop does not, so the plain loop alone could flatter the
//             kernel; this is the fairer ceiling.
//
//   ./bazelw run //benchmarks:fused_adam_bench --
//       --benchmark_min_time=0.5 --benchmark_format=json
//       --benchmark_out=/tmp/fused.json --benchmark_out_format=json
//   (one command line)
//
// One benchmark per (size, threads): BM_AdamStep/mparams:M/threads:T, M in
// Mi parameters (2^20). Each allocates and first-touches every buffer (and
// lets torch allocate its state with a warm-up step) before timing, then
// every iteration runs one step of each alternative, rotating which goes
// first. The iteration's manual time is the kernel's alone, so the
// reported time is the kernel's step time; the other two are counters.
// Counters (see docs/benchmarks.md):
//   params_per_second            the kernel: params / median step time
//   torch_params_per_second, roofline_params_per_second,
//   roofline_prefetch_params_per_second
//   kernel_bytes_per_second, roofline_bytes_per_second,
//   roofline_prefetch_bytes_per_second          28 B/param
//   kernel_over_roofline, kernel_over_roofline_prefetch, kernel_over_torch
//                                the median over iterations of the paired
//                                ratio of the other's time to the kernel's
//   kernel_ms, torch_ms, roofline_ms, roofline_prefetch_ms   median times
//   max_rel_diff_vs_torch        the kernel's and LibTorch's parameters
//                                after the run (same steps, same data)
//
// Benchmarks never run under `bazel test`: the target is tagged "benchmark"
// and is a cc_binary.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "offload/fused_adam.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZS_BENCH_X86 1
#else
#define ZS_BENCH_X86 0
#endif

namespace zerostep {
namespace {

constexpr double kLr = 1e-3;
constexpr double kWeightDecay = 0.01;
constexpr double kBytesPerParam = 28.0;  // read p, g, m, v; write p, m, v

// ----- The roofline loop ---------------------------------------------------
// The empty asm statements claim to read g and rewrite p, m and v in
// registers, so the compiler must keep all four loads and three stores and
// cannot prove that a store writes back the value it loaded. No arithmetic
// instruction is emitted.

#if ZS_BENCH_X86
#define ZS_FLOAT_REG "x"  // an SSE register
#else
#define ZS_FLOAT_REG "r"
#endif

void roofline_scalar(float* p, const float* g, float* m, float* v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float a = p[i], b = g[i], c = m[i], d = v[i];
    asm volatile(""
                 : "+" ZS_FLOAT_REG(a), "+" ZS_FLOAT_REG(c), "+" ZS_FLOAT_REG(d)
                 : ZS_FLOAT_REG(b));
    p[i] = a;
    m[i] = c;
    v[i] = d;
  }
}

#if ZS_BENCH_X86
// With kPrefetch, one prefetch per stream per 64-byte line, 256 floats ahead,
// as offload/fused_adam.cc does (its loop bounds too).
constexpr size_t kPrefetchAhead = 256;

inline void prefetch4(const float* p, const float* g, const float* m,
                      const float* v) {
  __builtin_prefetch(p, 0, 3);
  __builtin_prefetch(g, 0, 3);
  __builtin_prefetch(m, 0, 3);
  __builtin_prefetch(v, 0, 3);
}

template <bool kPrefetch>
__attribute__((target("avx2"))) void roofline_avx2(float* p, const float* g,
                                                   float* m, float* v,
                                                   size_t n) {
  size_t i = 0;
  for (; kPrefetch && i + 16 + kPrefetchAhead <= n; i += 16) {
    const size_t f = i + kPrefetchAhead;
    prefetch4(p + f, g + f, m + f, v + f);
    for (size_t j = i; j < i + 16; j += 8) {
      __m256 a = _mm256_loadu_ps(p + j), b = _mm256_loadu_ps(g + j);
      __m256 c = _mm256_loadu_ps(m + j), d = _mm256_loadu_ps(v + j);
      asm volatile("" : "+x"(a), "+x"(c), "+x"(d) : "x"(b));
      _mm256_storeu_ps(p + j, a);
      _mm256_storeu_ps(m + j, c);
      _mm256_storeu_ps(v + j, d);
    }
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(g + i);
    __m256 c = _mm256_loadu_ps(m + i), d = _mm256_loadu_ps(v + i);
    asm volatile("" : "+x"(a), "+x"(c), "+x"(d) : "x"(b));
    _mm256_storeu_ps(p + i, a);
    _mm256_storeu_ps(m + i, c);
    _mm256_storeu_ps(v + i, d);
  }
  roofline_scalar(p + i, g + i, m + i, v + i, n - i);
}

template <bool kPrefetch>
__attribute__((target("avx512f"))) void roofline_avx512(float* p,
                                                        const float* g,
                                                        float* m, float* v,
                                                        size_t n) {
  size_t i = 0;
  for (; kPrefetch && i + 16 + kPrefetchAhead <= n; i += 16) {
    const size_t f = i + kPrefetchAhead;
    prefetch4(p + f, g + f, m + f, v + f);
    __m512 a = _mm512_loadu_ps(p + i), b = _mm512_loadu_ps(g + i);
    __m512 c = _mm512_loadu_ps(m + i), d = _mm512_loadu_ps(v + i);
    asm volatile("" : "+v"(a), "+v"(c), "+v"(d) : "v"(b));
    _mm512_storeu_ps(p + i, a);
    _mm512_storeu_ps(m + i, c);
    _mm512_storeu_ps(v + i, d);
  }
  for (; i + 16 <= n; i += 16) {
    __m512 a = _mm512_loadu_ps(p + i), b = _mm512_loadu_ps(g + i);
    __m512 c = _mm512_loadu_ps(m + i), d = _mm512_loadu_ps(v + i);
    asm volatile("" : "+v"(a), "+v"(c), "+v"(d) : "v"(b));
    _mm512_storeu_ps(p + i, a);
    _mm512_storeu_ps(m + i, c);
    _mm512_storeu_ps(v + i, d);
  }
  roofline_scalar(p + i, g + i, m + i, v + i, n - i);
}
#endif

using RooflineFn = void (*)(float*, const float*, float*, float*, size_t);

RooflineFn roofline_for(Isa isa, bool prefetch) {
#if ZS_BENCH_X86
  if (isa == Isa::kAvx512)
    return prefetch ? &roofline_avx512<true> : &roofline_avx512<false>;
  if (isa == Isa::kAvx2)
    return prefetch ? &roofline_avx2<true> : &roofline_avx2<false>;
#endif
  return &roofline_scalar;
}

// ----- Buffers -------------------------------------------------------------

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

// 64-byte aligned, so parallel_chunks' boundaries fall on cache lines.
Buffer allocate(size_t n) {
  const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// A deterministic value in [lo, hi) * (random sign): a hash of the index.
float value_at(size_t i, uint64_t seed, float lo, float hi) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  const float u = static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
  const float mag = lo + (hi - lo) * u;
  return (x & 1) ? -mag : mag;
}

// p, g, m, v of one alternative, first-touched by the threads that will
// use them (one NUMA node here, but it costs nothing).
struct Span {
  size_t n;
  Buffer p, g, m, v;
  Span(size_t n, int threads)
      : n(n), p(allocate(n)), g(allocate(n)), m(allocate(n)), v(allocate(n)) {
    // Gradients of magnitude [1e-3, 1e-2): g*g and v stay far from float32
    // subnormals, whose microcode assists would slow every alternative.
    parallel_chunks(n, threads, [this](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        p[i] = value_at(i, 1, 0.0f, 1.0f);
        g[i] = value_at(i, 2, 1e-3f, 1e-2f);
        m[i] = 0.0f;
        v[i] = 0.0f;
      }
    });
  }
};

using bench::median;
using bench::seconds;

void BM_AdamStep(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) << 20;
  const int threads = static_cast<int>(state.range(1));
  torch::set_num_threads(threads);

  // Every alternative has its own buffers, so none finds another's data in
  // the caches.
  Span kernel_span(n, threads);
  Span roof_span(n, threads);
  Span roof_pf_span(n, threads);
  // LibTorch's copies of the same initial values (clone() writes, and so
  // first-touches, them).
  torch::Tensor tp =
      torch::from_blob(kernel_span.p.get(), {static_cast<int64_t>(n)}).clone();
  tp.mutable_grad() =
      torch::from_blob(kernel_span.g.get(), {static_cast<int64_t>(n)}).clone();
  torch::optim::AdamW torch_opt(
      {tp}, torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));

  AdamStepParams hyper;
  hyper.lr = kLr;
  hyper.weight_decay = kWeightDecay;
  hyper.decoupled = true;
  const FusedAdamOptions options{threads, Isa::kAuto};

  auto run_kernel = [&] {
    fused_adam_step(kernel_span.p.get(), kernel_span.g.get(),
                    kernel_span.m.get(), kernel_span.v.get(), n, hyper,
                    options);
    ++hyper.step;
  };
  auto run_torch = [&] { torch_opt.step(); };
  auto roofline_runner = [&](Span& s, RooflineFn fn) {
    return [&s, fn, n, threads] {
      parallel_chunks(n, threads, [&s, fn](size_t b, size_t e) {
        fn(s.p.get() + b, s.g.get() + b, s.m.get() + b, s.v.get() + b, e - b);
      });
      benchmark::ClobberMemory();
    };
  };
  const auto run_roofline =
      roofline_runner(roof_span, roofline_for(fused_adam_best_isa(), false));
  const auto run_roofline_pf =
      roofline_runner(roof_pf_span, roofline_for(fused_adam_best_isa(), true));

  // Warm-up: torch's first step allocates exp_avg and exp_avg_sq. Both
  // optimizers take the same steps, for the agreement check at the end.
  for (int i = 0; i < 2; ++i) {
    run_kernel();
    run_torch();
    run_roofline();
    run_roofline_pf();
  }

  // Times per alternative: kernel, torch, roofline, roofline with prefetch.
  constexpr int kAlternatives = 4;
  std::vector<double> times[kAlternatives];
  std::vector<double> over_roof, over_roof_pf, over_torch;
  int rotation = 0;
  for (auto _ : state) {
    double t[kAlternatives] = {};
    // Rotate the order so that none always follows the same neighbour:
    // what one leaves in the caches or the memory controller's queues then
    // affects each alike.
    for (int j = 0; j < kAlternatives; ++j) {
      switch ((rotation + j) % kAlternatives) {
        case 0:
          t[0] = seconds(run_kernel);
          break;
        case 1:
          t[1] = seconds(run_torch);
          break;
        case 2:
          t[2] = seconds(run_roofline);
          break;
        default:
          t[3] = seconds(run_roofline_pf);
          break;
      }
    }
    rotation = (rotation + 1) % kAlternatives;
    for (int a = 0; a < kAlternatives; ++a) times[a].push_back(t[a]);
    over_torch.push_back(t[1] / t[0]);
    over_roof.push_back(t[2] / t[0]);
    over_roof_pf.push_back(t[3] / t[0]);
    state.SetIterationTime(t[0]);
  }
  if (over_torch.empty()) return;

  const double params = static_cast<double>(n);
  const double mk = median(times[0]), mt = median(times[1]),
               mr = median(times[2]), mrp = median(times[3]);
  state.counters["params"] = params;
  state.counters["threads"] = threads;
  state.counters["params_per_second"] = params / mk;
  state.counters["torch_params_per_second"] = params / mt;
  state.counters["roofline_params_per_second"] = params / mr;
  state.counters["roofline_prefetch_params_per_second"] = params / mrp;
  state.counters["kernel_bytes_per_second"] = kBytesPerParam * params / mk;
  state.counters["roofline_bytes_per_second"] = kBytesPerParam * params / mr;
  state.counters["roofline_prefetch_bytes_per_second"] =
      kBytesPerParam * params / mrp;
  state.counters["kernel_over_roofline"] = median(over_roof);
  state.counters["kernel_over_roofline_prefetch"] = median(over_roof_pf);
  state.counters["kernel_over_torch"] = median(over_torch);
  state.counters["kernel_ms"] = mk * 1e3;
  state.counters["torch_ms"] = mt * 1e3;
  state.counters["roofline_ms"] = mr * 1e3;
  state.counters["roofline_prefetch_ms"] = mrp * 1e3;
  // Both optimizers ran the same number of steps on the same data, so they
  // must still agree (a broken kernel must not look fast): LibTorch's
  // rounding differs by a few ulps (offload/fused_adam_test.cc).
  const torch::Tensor ours =
      torch::from_blob(kernel_span.p.get(), {static_cast<int64_t>(n)});
  const double rel =
      ((ours - tp.detach()).abs().max() / tp.detach().abs().max())
          .item<double>();
  state.counters["max_rel_diff_vs_torch"] = rel;
  if (!(rel < 1e-4)) state.SkipWithError("kernel and torch disagree");
}

BENCHMARK(BM_AdamStep)
    ->ArgNames({"mparams", "threads"})
    ->ArgsProduct({{16, 64}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Note [Update out of place] (offload/fused_adam.h): what an update that
// can be undone costs, three ways on their own buffers, alternately:
//   in_place  the plain update, which cannot be undone (the floor)
//   copy      the old way: copy m and v aside and p to a staging buffer,
//             then the update in place there (what stages 1-3 did)
//   apart     the update reading the old p, m, v and writing the new ones
//             to a second set (streamed stores), the sets flipping every
//             step (what they do now)
// Manual time: apart's. Counters: the median paired ratios
// apart_over_in_place and copy_over_apart (time / time), the medians
// in_place_ms, copy_ms, apart_ms, and identical_bits (1 when copy's and
// apart's parameters and moments agree bit for bit after the run).
void BM_AdamStepUndoable(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) << 20;
  const int threads = static_cast<int>(state.range(1));
  Span plain(n, threads), copied(n, threads), apart(n, threads),
      other(n, threads);
  Span aside(n, threads);  // copy's saved m, v and its staged p
  AdamStepParams hyper;
  hyper.lr = kLr;
  hyper.weight_decay = kWeightDecay;
  hyper.decoupled = true;
  const FusedAdamOptions options{threads, Isa::kAuto};
  int64_t step_plain = 0, step_copy = 0, step_apart = 0;
  auto run_in_place = [&] {
    hyper.step = ++step_plain;
    fused_adam_step(plain.p.get(), plain.g.get(), plain.m.get(), plain.v.get(),
                    n, hyper, options);
  };
  auto run_copy = [&] {
    hyper.step = ++step_copy;
    std::memcpy(aside.m.get(), copied.m.get(), n * sizeof(float));
    std::memcpy(aside.v.get(), copied.v.get(), n * sizeof(float));
    std::memcpy(aside.p.get(), copied.p.get(), n * sizeof(float));
    fused_adam_step(aside.p.get(), copied.g.get(), copied.m.get(),
                    copied.v.get(), n, hyper, options);
    std::swap(aside.p, copied.p);  // the staged values are the parameters
  };
  Span* from = &apart;
  Span* to = &other;
  auto run_apart = [&] {
    hyper.step = ++step_apart;
    fused_adam_step(AdamArrays{from->p.get(), to->p.get(), apart.g.get(),
                               from->m.get(), to->m.get(), from->v.get(),
                               to->v.get()},
                    n, hyper, options);
    std::swap(from, to);
  };
  for (int i = 0; i < 2; ++i) {
    run_in_place();
    run_copy();
    run_apart();
  }
  constexpr int kAlternatives = 3;
  std::vector<double> times[kAlternatives];
  std::vector<double> apart_over_in_place, copy_over_apart;
  int rotation = 0;
  for (auto _ : state) {
    double t[kAlternatives] = {};
    for (int j = 0; j < kAlternatives; ++j) {
      const int a = (rotation + j) % kAlternatives;
      t[a] = seconds(a == 0 ? std::function<void()>(run_in_place)
                 : a == 1   ? std::function<void()>(run_copy)
                            : std::function<void()>(run_apart));
    }
    rotation = (rotation + 1) % kAlternatives;
    for (int a = 0; a < kAlternatives; ++a) times[a].push_back(t[a]);
    apart_over_in_place.push_back(t[2] / t[0]);
    copy_over_apart.push_back(t[1] / t[2]);
    state.SetIterationTime(t[2]);
  }
  if (times[0].empty()) return;
  state.counters["params"] = static_cast<double>(n);
  state.counters["threads"] = threads;
  state.counters["in_place_ms"] = median(times[0]) * 1e3;
  state.counters["copy_ms"] = median(times[1]) * 1e3;
  state.counters["apart_ms"] = median(times[2]) * 1e3;
  state.counters["apart_over_in_place"] = median(apart_over_in_place);
  state.counters["copy_over_apart"] = median(copy_over_apart);
  // The same steps on the same data: the same bits, or the figures mean
  // nothing.
  const bool same =
      step_copy == step_apart &&
      std::memcmp(copied.p.get(), from->p.get(), n * sizeof(float)) == 0 &&
      std::memcmp(copied.m.get(), from->m.get(), n * sizeof(float)) == 0 &&
      std::memcmp(copied.v.get(), from->v.get(), n * sizeof(float)) == 0;
  state.counters["identical_bits"] = same ? 1 : 0;
  if (!same) state.SkipWithError("apart and copy disagree");
}

BENCHMARK(BM_AdamStepUndoable)
    ->ArgNames({"mparams", "threads"})
    ->ArgsProduct({{16}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("fused_adam_isa", zerostep::fused_adam_isa());
  benchmark::AddCustomContext("workload",
                              "AdamW lr=1e-3 weight_decay=0.01, float32, "
                              "one flat span; 28 bytes/param");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
