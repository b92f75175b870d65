#include "zero/kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "offload/fused_adam.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZS_KERNELS_X86 1
#else
#define ZS_KERNELS_X86 0
#endif

namespace zerostep {
namespace {

// Note [Sum of squares order]: element i goes into partial sum i % 8, and
// the eight partial sums are added pairwise at the end. One fixed order, so
// every build, every instruction set and every run gives the same bits.
// Eight independent additions in flight instead of one chain: a single
// chain is bound by the latency of a double addition per element, several
// times slower than reading the gradient from memory.
//
// The vector paths keep the eight partial sums in registers (one vector of
// 8 doubles with AVX-512, two of 4 with AVX2) and add each 8 elements'
// squares to them in element order, so partial sum j still receives
// elements j, j + 8, j + 16, ... one after the other. A float's square is
// exact in double (24 significant bits squared fit in 53), so a fused
// multiply-add, where a compiler makes one, rounds as the multiply and the
// add do. They prefetch as the fused Adam kernel does. The plain loop,
// whose partial sums the compiler keeps in memory, read the 26M model's
// gradient in 19.5 ms on the development machine, about as long as the
// whole Adam update after it; the AVX-512 path in 8.5 ms, 0.9 of a plain
// read of the same bytes (docs/benchmarks.md, grad_passes_bench).

// What a pass divides each element by before squaring it, as divide()
// does: in float, by `a` and then by `b`, where kA / kB say so.
struct Divisors {
  float a = 1.0f;
  float b = 1.0f;
};

// The plain loop from element `i` (a multiple of 8) on, into `lane`.
template <bool kA, bool kB, typename T>
void squares_scalar(T* x, size_t i, size_t n, const Divisors& d,
                    double lane[8]) {
  constexpr bool kWrite = !std::is_const_v<T>;
  auto f = [&d](float v) {
    if (kA) v = v / d.a;
    if (kB) v = v / d.b;
    return v;
  };
  for (; i + 8 <= n; i += 8)
    for (size_t j = 0; j < 8; ++j) {
      const float y = f(x[i + j]);
      if constexpr (kWrite) x[i + j] = y;
      const double v = y;
      lane[j] += v * v;
    }
  for (size_t j = 0; i < n; ++i, ++j) {
    const float y = f(x[i]);
    if constexpr (kWrite) x[i] = y;
    const double v = y;
    lane[j] += v * v;
  }
}

#if ZS_KERNELS_X86

// As offload/fused_adam.cc: 1 KiB ahead, one prefetch per 64-byte line.
constexpr size_t kSquaresPrefetchAhead = 256;

// Lambdas would not inherit the target attribute, hence these helpers.
template <bool kA, bool kB, typename T>
__attribute__((always_inline, target("avx2"))) inline __m256 divided8(
    T* p, __m256 a, __m256 b) {
  __m256 y = _mm256_loadu_ps(p);
  if (kA) y = _mm256_div_ps(y, a);
  if (kB) y = _mm256_div_ps(y, b);
  if constexpr (!std::is_const_v<T>) _mm256_storeu_ps(p, y);
  return y;
}

template <bool kA, bool kB, typename T>
__attribute__((always_inline, target("avx2"))) inline void squares8_avx2(
    T* p, __m256 a, __m256 b, __m256d& lo, __m256d& hi) {
  const __m256 y = divided8<kA, kB>(p, a, b);
  const __m256d l = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
  const __m256d h = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
  lo = _mm256_add_pd(lo, _mm256_mul_pd(l, l));
  hi = _mm256_add_pd(hi, _mm256_mul_pd(h, h));
}

// Elements [0, return value) into `lane`; the value is a multiple of 8.
template <bool kA, bool kB, typename T>
__attribute__((target("avx2"))) size_t squares_avx2(T* x, size_t n,
                                                    const Divisors& d,
                                                    double lane[8]) {
  const __m256 a = _mm256_set1_ps(d.a);
  const __m256 b = _mm256_set1_ps(d.b);
  __m256d lo = _mm256_loadu_pd(lane);
  __m256d hi = _mm256_loadu_pd(lane + 4);
  size_t i = 0;
  for (; i + 16 + kSquaresPrefetchAhead <= n; i += 16) {
    __builtin_prefetch(x + i + kSquaresPrefetchAhead, 0, 3);
    squares8_avx2<kA, kB>(x + i, a, b, lo, hi);
    squares8_avx2<kA, kB>(x + i + 8, a, b, lo, hi);
  }
  for (; i + 8 <= n; i += 8) squares8_avx2<kA, kB>(x + i, a, b, lo, hi);
  _mm256_storeu_pd(lane, lo);
  _mm256_storeu_pd(lane + 4, hi);
  return i;
}

// The zero-masking conversion only because GCC 12's plain _mm512_cvtps_pd
// trips -Wmaybe-uninitialized inside its own header; every lane is kept.
template <bool kA, bool kB, typename T>
__attribute__((always_inline, target("avx512f"))) inline __m512d
squares8_avx512(T* p, __m256 a, __m256 b, __m512d acc) {
  const __m512d v = _mm512_maskz_cvtps_pd(0xFF, divided8<kA, kB>(p, a, b));
  return _mm512_add_pd(acc, _mm512_mul_pd(v, v));
}

template <bool kA, bool kB, typename T>
__attribute__((target("avx512f"))) size_t squares_avx512(T* x, size_t n,
                                                         const Divisors& d,
                                                         double lane[8]) {
  const __m256 a = _mm256_set1_ps(d.a);
  const __m256 b = _mm256_set1_ps(d.b);
  __m512d acc = _mm512_loadu_pd(lane);
  size_t i = 0;
  for (; i + 16 + kSquaresPrefetchAhead <= n; i += 16) {
    __builtin_prefetch(x + i + kSquaresPrefetchAhead, 0, 3);
    acc = squares8_avx512<kA, kB>(x + i, a, b, acc);
    acc = squares8_avx512<kA, kB>(x + i + 8, a, b, acc);
  }
  for (; i + 8 <= n; i += 8) acc = squares8_avx512<kA, kB>(x + i, a, b, acc);
  _mm512_storeu_pd(lane, acc);
  return i;
}

#endif  // ZS_KERNELS_X86

// The sum of the squares of x[i] divided as `d` says (written back where
// x is writable), on `isa` (not kAuto), in Note [Sum of squares order].
template <bool kA, bool kB, typename T>
double squares(T* x, size_t n, const Divisors& d, Isa isa) {
  double lane[8] = {};
  size_t i = 0;
#if ZS_KERNELS_X86
  if (isa == Isa::kAvx512) i = squares_avx512<kA, kB>(x, n, d, lane);
  if (isa == Isa::kAvx2) i = squares_avx2<kA, kB>(x, n, d, lane);
#endif
  squares_scalar<kA, kB>(x, i, n, d, lane);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

Isa resolve(Isa isa) {
  if (!fused_adam_isa_supported(isa))
    throw UsageError(std::string("this CPU has no ") +
                     fused_adam_isa_name(isa) + "; best available is '" +
                     fused_adam_isa() + "'");
  return isa == Isa::kAuto ? fused_adam_best_isa() : isa;
}

// Note [Zeroing around the caches]: a plain store to a line that is not
// in the cache reads the line first (to own it), so memset of a buffer
// larger than the caches reads about as many bytes as it writes. The
// gradient buffers zeroed after every step (and, at stage 2, after every
// backward) can be that large, and nothing reads them until the next
// backward; so from kStreamZeroBytes on, zero() stores around the caches
// (non-temporal stores, then a fence), writing without reading. Measured
// on the development machine (docs/benchmarks.md, grad_passes_bench): a
// 105 MB gradient (the 26M model) took 10.1-11.0 ms with memset and
// 4.7-5.0 ms streamed, and the accumulation pass after it the same time
// either way; a 27 MB one (the 7M model) took as long either way, but the
// accumulation after the streamed one was 1.2-1.6 ms slower, because
// memset had left it in the cache. So streaming starts at 64 MiB, between
// the two: the crossover depends on the machine's caches, and this one is
// not tuned further. Below it, memset.
constexpr size_t kStreamZeroBytes = size_t{64} << 20;

#if ZS_KERNELS_X86
__attribute__((target("avx512f"))) void zero_lines_avx512(float* x, size_t n) {
  const __m512 z = _mm512_setzero_ps();
  for (size_t i = 0; i < n; i += 16) _mm512_stream_ps(x + i, z);
}

void zero_lines_sse(float* x, size_t n) {
  const __m128 z = _mm_setzero_ps();
  for (size_t i = 0; i < n; i += 16) {
    _mm_stream_ps(x + i, z);
    _mm_stream_ps(x + i + 4, z);
    _mm_stream_ps(x + i + 8, z);
    _mm_stream_ps(x + i + 12, z);
  }
}
#endif

// Below AVX-512 the streaming stores are SSE's, which every x86-64 has.
void zero_floats(float* x, size_t n, Isa isa) {
  if (n == 0) return;
#if ZS_KERNELS_X86
  if (n * sizeof(float) >= kStreamZeroBytes) {
    // The partial lines at either end with memset, the whole lines
    // between them streamed.
    const uintptr_t at = reinterpret_cast<uintptr_t>(x);
    const size_t head = ((64 - at % 64) % 64) / sizeof(float);
    const size_t lines = (n - head) / 16 * 16;
    std::memset(x, 0, head * sizeof(float));
    if (isa == Isa::kAvx512)
      zero_lines_avx512(x + head, lines);
    else
      zero_lines_sse(x + head, lines);
    _mm_sfence();  // the streamed stores are ordered before what follows
    std::memset(x + head + lines, 0, (n - head - lines) * sizeof(float));
    return;
  }
#endif
  std::memset(x, 0, n * sizeof(float));
}

// The CPU: plain loops (compiled without FMA contraction, so every build
// gives the same bits) and the fused Adam kernel.
class HostKernels final : public Kernels {
 public:
  std::string device() const override { return "cpu"; }
  bool host_addressable() const override { return true; }

  DeviceArray allocate(size_t n) override {
    if (n == 0) return {};
    // 64-byte aligned, as a flat buffer's partitions are: the fused
    // kernel streams its stores only to aligned outputs (Note [Update out
    // of place] in offload/fused_adam.h).
    const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    void* raw = std::aligned_alloc(64, bytes);
    if (raw == nullptr) throw std::bad_alloc();
    std::memset(raw, 0, bytes);  // zeros, touched here
    std::shared_ptr<void> owner(raw, [](void* q) { std::free(q); });
    return DeviceArray(static_cast<float*>(raw), n, std::move(owner));
  }
  void copy(float* dst, const float* src, size_t n) override {
    if (n != 0 && dst != src) std::memmove(dst, src, n * sizeof(float));
  }
  void zero(float* x, size_t n) override {
    zero_floats(x, n, fused_adam_best_isa());
  }
  void download(float* host, const float* x, size_t n) override {
    copy(host, x, n);
  }
  void upload(float* x, const float* host, size_t n) override {
    copy(x, host, n);
  }
  void divide(float* x, size_t n, double divisor) override {
    if (divisor == 1.0) return;
    const float d = static_cast<float>(divisor);
    for (size_t i = 0; i < n; ++i) x[i] = x[i] / d;
  }
  void scale(float* x, size_t n, float factor) override {
    for (size_t i = 0; i < n; ++i) x[i] *= factor;
  }
  double sum_of_squares(const float* x, size_t n) override {
    return internal::host_sum_of_squares(x, n, Isa::kAuto);
  }
  double divide_and_sum_of_squares(float* x, size_t n, double first,
                                   double second) override {
    return internal::host_divide_and_sum_of_squares(x, n, first, second,
                                                    Isa::kAuto);
  }
  void accumulate(float* acc, const float* g, size_t n, Precision grad_p,
                  Precision acc_p) override {
    zerostep::accumulate(acc, g, n, grad_p, acc_p);
  }
  void adam(float* p, const float* g, float* m, float* v, size_t n,
            const AdamStepParams& params) override {
    FusedAdamOptions options;
    options.threads = params.threads;
    fused_adam_step(p, g, m, v, n, params, options);
  }
  void adam_into(const AdamArrays& a, size_t n,
                 const AdamStepParams& params) override {
    FusedAdamOptions options;
    options.threads = params.threads;
    fused_adam_step(a, n, params, options);
  }
  void sgd(float* p, const float* g, float* buf, size_t n,
           const SgdStepParams& h) override {
    const float lr = static_cast<float>(h.lr);
    const float wd = static_cast<float>(h.weight_decay);
    const float mom = static_cast<float>(h.momentum);
    for (size_t i = 0; i < n; ++i) {
      float d = g[i];
      if (wd != 0.0f) d += wd * p[i];
      if (buf != nullptr) {
        buf[i] = h.first ? d : mom * buf[i] + d;
        d = buf[i];
      }
      p[i] -= lr * d;
    }
  }
};

}  // namespace

namespace internal {

double host_sum_of_squares(const float* x, size_t n, Isa isa) {
  return squares<false, false>(x, n, Divisors(), resolve(isa));
}

// The divisions and the squares in one pass: each element is divided (as
// divide() does, in float, first then second) and written back, and its
// square goes into the partial sums of Note [Sum of squares order]. The
// same operations on every element as the three passes.
double host_divide_and_sum_of_squares(float* x, size_t n, double first,
                                      double second, Isa isa) {
  const Isa use = resolve(isa);
  const Divisors d{static_cast<float>(first), static_cast<float>(second)};
  if (first == 1.0 && second == 1.0)
    return squares<false, false>(static_cast<const float*>(x), n, d, use);
  if (second == 1.0) return squares<true, false>(x, n, d, use);
  if (first == 1.0) return squares<false, true>(x, n, d, use);
  return squares<true, true>(x, n, d, use);
}

void host_zero(float* x, size_t n, Isa isa) { zero_floats(x, n, resolve(isa)); }

}  // namespace internal

Kernels& host_kernels() {
  static HostKernels k;
  return k;
}

}  // namespace zerostep
