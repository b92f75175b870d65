#include "offload/fused_adam.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ZS_FUSED_ADAM_X86 1
#else
#define ZS_FUSED_ADAM_X86 0
#endif

namespace zerostep {
namespace {

// The per-step scalars, computed in double and rounded to float once, with
// exactly FlatOptimizer's expressions so that the two agree bit for bit.
struct StepConstants {
  float b1, b2, one_minus_b1, one_minus_b2;
  float eps, wd, decay, step_size, inv_sqrt_bias2;
};

StepConstants constants_for(const AdamStepParams& h) {
  const double t = static_cast<double>(h.step);
  const double bias1 = h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;
  const double bias2 = h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;
  StepConstants c;
  c.b1 = static_cast<float>(h.beta1);
  c.b2 = static_cast<float>(h.beta2);
  c.one_minus_b1 = static_cast<float>(1.0 - h.beta1);
  c.one_minus_b2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.wd = static_cast<float>(h.weight_decay);
  c.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  c.step_size = static_cast<float>(h.lr / bias1);
  c.inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  return c;
}

// How weight decay enters. A compile-time parameter so the inner loops carry
// no branch. kNone (Adam, wd == 0) must skip the L2 term rather than add
// 0*p: 0*p is NaN for an infinite p and flips the sign of a -0 gradient,
// and FlatOptimizer skips it too. AdamW always multiplies, as FlatOptimizer
// does (by exactly 1.0f when wd == 0).
enum class Decay { kDecoupled, kL2, kNone };

// One element, in the order the header documents. Compiled with
// -ffp-contract=off (BUILD), so no multiply-add pair is fused, and with
// -fno-math-errno, so std::sqrt is the sqrtss instruction rather than a
// call that checks errno. Also the tail of the vector paths, so it must be
// usable from their target-attributed functions: it is a template and
// always_inline, and so is compiled with its caller's ISA.
// The arrays of one chunk, advanced together. Out-of-place arrays do not
// overlap their inputs (AdamArrays), and in place they are the same
// pointers, so no pointer here is __restrict: an element is loaded before
// it is stored either way.
struct Io {
  const float* p_in;
  float* p_out;
  const float* g;
  const float* m_in;
  float* m_out;
  const float* v_in;
  float* v_out;
  Io at(size_t i) const {
    return {p_in + i, p_out + i, g + i, m_in + i, m_out + i, v_in + i,
            v_out + i};
  }
};

template <Decay D>
__attribute__((always_inline)) inline void adam_one(const Io& a, size_t i,
                                                    const StepConstants& c) {
  float pi = a.p_in[i];
  float gi = a.g[i];
  if (D == Decay::kDecoupled) {
    pi = pi * c.decay;
  } else if (D == Decay::kL2) {
    gi = gi + c.wd * pi;
  }
  const float mi = c.b1 * a.m_in[i] + c.one_minus_b1 * gi;
  const float vi = c.b2 * a.v_in[i] + c.one_minus_b2 * gi * gi;
  a.m_out[i] = mi;
  a.v_out[i] = vi;
  const float denom = std::sqrt(vi) * c.inv_sqrt_bias2 + c.eps;
  a.p_out[i] = pi - c.step_size * (mi / denom);
}

template <Decay D>
void adam_scalar(const Io& a, size_t n, const StepConstants& c) {
  for (size_t i = 0; i < n; ++i) adam_one<D>(a, i, c);
}

#if ZS_FUSED_ADAM_X86

// Software prefetch, kPrefetchAhead floats (1 KiB, 16 cache lines) ahead
// in each of the four streams, one prefetch per stream per 64-byte line.
// Measured on the development machine (docs/benchmarks.md as of fee84cc):
// without it the AVX-512 kernel reached 77-87% of the plain load/store loop's
// bandwidth, with it 92-100%. Our reading: the long sqrt and div latencies (~20
// cycles per vector) fill the reorder buffer, so fewer demand loads are in
// flight than in the plain loop, and the hardware prefetchers do not make up
// for it. 512 B to 4 KiB ahead measured alike. The main loops stop
// kPrefetchAhead early and finish without prefetching, so no prefetch address
// is formed past the end of a buffer.
constexpr size_t kPrefetchAhead = 256;

inline void prefetch_line(const float* a) {
  __builtin_prefetch(a, /*rw=*/0, /*locality=*/3);
}

// The four streams read (the out-of-place outputs are only written).
inline void prefetch4(const Io& a) {
  prefetch_line(a.p_in);
  prefetch_line(a.g);
  prefetch_line(a.m_in);
  prefetch_line(a.v_in);
}

// Note [Update out of place] in fused_adam.h: written apart from what it
// reads, an output line is never read, so the vector paths store it
// around the caches (non-temporal stores), which saves the read a store to
// an uncached line costs, when every output is apart and aligned to the
// vector (`bytes`). In place, the lines were just read: plain stores.
inline bool streams(const Io& a, uintptr_t bytes) {
  auto aligned = [bytes](const float* p) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  return a.p_out != a.p_in && a.m_out != a.m_in && a.v_out != a.v_in &&
         aligned(a.p_out) && aligned(a.m_out) && aligned(a.v_out);
}

// AVX2: 8 lanes. Only "avx2" is asked for, not "fma": the kernel uses no
// FMA (see the header), so it runs on any AVX2 CPU.
struct Broadcast256 {
  __m256 b1, b2, omb1, omb2, eps, wd, decay, step_size, isb2;
};

template <bool kStream>
__attribute__((always_inline, target("avx2"))) inline void store8(float* a,
                                                                  __m256 x) {
  if (kStream) {
    _mm256_stream_ps(a, x);
  } else {
    _mm256_storeu_ps(a, x);
  }
}

template <Decay D, bool kStream>
__attribute__((always_inline, target("avx2"))) inline void adam8(
    const Io& a, const Broadcast256& c) {
  __m256 pi = _mm256_loadu_ps(a.p_in);
  __m256 gi = _mm256_loadu_ps(a.g);
  if (D == Decay::kDecoupled) {
    pi = _mm256_mul_ps(pi, c.decay);
  } else if (D == Decay::kL2) {
    gi = _mm256_add_ps(gi, _mm256_mul_ps(c.wd, pi));
  }
  const __m256 mi = _mm256_add_ps(_mm256_mul_ps(c.b1, _mm256_loadu_ps(a.m_in)),
                                  _mm256_mul_ps(c.omb1, gi));
  const __m256 vi =
      _mm256_add_ps(_mm256_mul_ps(c.b2, _mm256_loadu_ps(a.v_in)),
                    _mm256_mul_ps(_mm256_mul_ps(c.omb2, gi), gi));
  store8<kStream>(a.m_out, mi);
  store8<kStream>(a.v_out, vi);
  const __m256 denom =
      _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), c.isb2), c.eps);
  store8<kStream>(
      a.p_out,
      _mm256_sub_ps(pi, _mm256_mul_ps(c.step_size, _mm256_div_ps(mi, denom))));
}

template <Decay D>
__attribute__((target("avx2"))) void adam_avx2(const Io& a, size_t n,
                                               const StepConstants& c) {
  Broadcast256 b;
  b.b1 = _mm256_set1_ps(c.b1);
  b.b2 = _mm256_set1_ps(c.b2);
  b.omb1 = _mm256_set1_ps(c.one_minus_b1);
  b.omb2 = _mm256_set1_ps(c.one_minus_b2);
  b.eps = _mm256_set1_ps(c.eps);
  b.wd = _mm256_set1_ps(c.wd);
  b.decay = _mm256_set1_ps(c.decay);
  b.step_size = _mm256_set1_ps(c.step_size);
  b.isb2 = _mm256_set1_ps(c.inv_sqrt_bias2);
  size_t i = 0;
  if (streams(a, 32)) {
    for (; i + 16 + kPrefetchAhead <= n; i += 16) {
      prefetch4(a.at(i + kPrefetchAhead));
      adam8<D, true>(a.at(i), b);
      adam8<D, true>(a.at(i + 8), b);
    }
    for (; i + 8 <= n; i += 8) adam8<D, true>(a.at(i), b);
    _mm_sfence();  // the streamed stores are ordered before what follows
  }
  // Two vectors (one cache line) per iteration, so one prefetch per line.
  for (; i + 16 + kPrefetchAhead <= n; i += 16) {
    prefetch4(a.at(i + kPrefetchAhead));
    adam8<D, false>(a.at(i), b);
    adam8<D, false>(a.at(i + 8), b);
  }
  for (; i + 8 <= n; i += 8) adam8<D, false>(a.at(i), b);
  for (; i < n; ++i) adam_one<D>(a, i, c);
}

// AVX-512: 16 lanes. Full vectors use plain loads and stores; the tail
// (< 16 elements) uses masked ones with the same operations, so it needs no
// scalar loop. Masked-off lanes compute on zeros (sqrt(0), 0/eps), which
// raises no trap: x86 float exceptions are masked by default. The sqrt is
// the zero-masking form only because GCC 12's plain _mm512_sqrt_ps trips
// -Wmaybe-uninitialized inside its own header; the lanes kept get the same
// correctly rounded sqrt.
struct Broadcast512 {
  __m512 b1, b2, omb1, omb2, eps, wd, decay, step_size, isb2;
};

// Lambdas would not inherit the target attribute, hence these helpers.
template <bool kMasked>
__attribute__((always_inline, target("avx512f"))) inline __m512 load16(
    const float* a, __mmask16 k) {
  return kMasked ? _mm512_maskz_loadu_ps(k, a) : _mm512_loadu_ps(a);
}

template <bool kMasked, bool kStream>
__attribute__((always_inline, target("avx512f"))) inline void store16(
    float* a, __mmask16 k, __m512 x) {
  if (kMasked) {
    _mm512_mask_storeu_ps(a, k, x);
  } else if (kStream) {
    _mm512_stream_ps(a, x);
  } else {
    _mm512_storeu_ps(a, x);
  }
}

template <Decay D, bool kMasked, bool kStream>
__attribute__((always_inline, target("avx512f"))) inline void adam16(
    const Io& a, __mmask16 k, const Broadcast512& c) {
  __m512 pi = load16<kMasked>(a.p_in, k);
  __m512 gi = load16<kMasked>(a.g, k);
  if (D == Decay::kDecoupled) {
    pi = _mm512_mul_ps(pi, c.decay);
  } else if (D == Decay::kL2) {
    gi = _mm512_add_ps(gi, _mm512_mul_ps(c.wd, pi));
  }
  const __m512 mi =
      _mm512_add_ps(_mm512_mul_ps(c.b1, load16<kMasked>(a.m_in, k)),
                    _mm512_mul_ps(c.omb1, gi));
  const __m512 vi =
      _mm512_add_ps(_mm512_mul_ps(c.b2, load16<kMasked>(a.v_in, k)),
                    _mm512_mul_ps(_mm512_mul_ps(c.omb2, gi), gi));
  store16<kMasked, kStream>(a.m_out, k, mi);
  store16<kMasked, kStream>(a.v_out, k, vi);
  const __m512 denom =
      _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_sqrt_ps(k, vi), c.isb2), c.eps);
  store16<kMasked, kStream>(
      a.p_out, k,
      _mm512_sub_ps(pi, _mm512_mul_ps(c.step_size, _mm512_div_ps(mi, denom))));
}

template <Decay D>
__attribute__((target("avx512f"))) void adam_avx512(const Io& a, size_t n,
                                                    const StepConstants& c) {
  Broadcast512 b;
  b.b1 = _mm512_set1_ps(c.b1);
  b.b2 = _mm512_set1_ps(c.b2);
  b.omb1 = _mm512_set1_ps(c.one_minus_b1);
  b.omb2 = _mm512_set1_ps(c.one_minus_b2);
  b.eps = _mm512_set1_ps(c.eps);
  b.wd = _mm512_set1_ps(c.wd);
  b.decay = _mm512_set1_ps(c.decay);
  b.step_size = _mm512_set1_ps(c.step_size);
  b.isb2 = _mm512_set1_ps(c.inv_sqrt_bias2);
  size_t i = 0;
  if (streams(a, 64)) {
    for (; i + 16 + kPrefetchAhead <= n; i += 16) {
      prefetch4(a.at(i + kPrefetchAhead));
      adam16<D, false, true>(a.at(i), 0xFFFF, b);
    }
    for (; i + 16 <= n; i += 16) adam16<D, false, true>(a.at(i), 0xFFFF, b);
    _mm_sfence();  // the streamed stores are ordered before what follows
  }
  for (; i + 16 + kPrefetchAhead <= n; i += 16) {
    prefetch4(a.at(i + kPrefetchAhead));
    adam16<D, false, false>(a.at(i), 0xFFFF, b);
  }
  for (; i + 16 <= n; i += 16) adam16<D, false, false>(a.at(i), 0xFFFF, b);
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    adam16<D, true, false>(a.at(i), k, b);
  }
}

#endif  // ZS_FUSED_ADAM_X86

using Kernel = void (*)(const Io&, size_t, const StepConstants&);

template <Decay D>
Kernel kernel_for(Isa isa) {
  switch (isa) {
#if ZS_FUSED_ADAM_X86
    case Isa::kAvx512:
      return &adam_avx512<D>;
    case Isa::kAvx2:
      return &adam_avx2<D>;
#endif
    default:
      return &adam_scalar<D>;
  }
}

Isa detect_best() {
#if ZS_FUSED_ADAM_X86
  // libgcc's checks include the OS's XSAVE support (XCR0) for the wider
  // registers, not only the CPUID bits.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return Isa::kAvx2;
#endif
  return Isa::kScalar;
}

}  // namespace

Isa fused_adam_best_isa() {
  static const Isa best = detect_best();
  return best;
}

bool fused_adam_isa_supported(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return fused_adam_best_isa() == Isa::kAvx2 ||
             fused_adam_best_isa() == Isa::kAvx512;
    case Isa::kAvx512:
      return fused_adam_best_isa() == Isa::kAvx512;
  }
  return false;
}

const char* fused_adam_isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAuto:
      return "auto";
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

const char* fused_adam_isa() {
  return fused_adam_isa_name(fused_adam_best_isa());
}

void parallel_chunks(size_t n, int threads,
                     const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  size_t t = threads < 1 ? 1 : static_cast<size_t>(threads);
  t = std::min(t, std::max<size_t>(1, n / kMinChunk));
  size_t chunk = (n + t - 1) / t;
  chunk = (chunk + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  if (t == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::exception_ptr> errors(t);
  std::vector<std::thread> workers;
  workers.reserve(t - 1);
  for (size_t k = 1; k < t; ++k) {
    const size_t begin = std::min(n, k * chunk);
    const size_t end = std::min(n, begin + chunk);
    if (begin == end) break;
    workers.emplace_back([&fn, &errors, k, begin, end] {
      try {
        fn(begin, end);
      } catch (...) {
        errors[k] = std::current_exception();
      }
    });
  }
  try {
    fn(0, std::min(n, chunk));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

void fused_adam_step(float* params, const float* grads, float* exp_avg,
                     float* exp_avg_sq, size_t n, const AdamStepParams& hyper,
                     const FusedAdamOptions& options) {
  fused_adam_step(AdamArrays{params, params, grads, exp_avg, exp_avg,
                             exp_avg_sq, exp_avg_sq},
                  n, hyper, options);
}

namespace {
// Whether out is `in` itself or lies wholly outside it (AdamArrays).
bool in_place_or_apart(const float* in, const float* out, size_t n) {
  return in == out || out + n <= in || in + n <= out;
}
}  // namespace

void fused_adam_step(const AdamArrays& a, size_t n, const AdamStepParams& hyper,
                     const FusedAdamOptions& options) {
  if (hyper.step < 1) {
    throw UsageError(
        "fused_adam_step: step must be >= 1 (the 1-based number "
        "of the step being applied), got " +
        std::to_string(hyper.step));
  }
  if (!fused_adam_isa_supported(options.isa)) {
    throw UsageError(std::string("fused_adam_step: this CPU does not support "
                                 "the requested ISA '") +
                     fused_adam_isa_name(options.isa) +
                     "'; best available is '" + fused_adam_isa() + "'");
  }
  if (n == 0) return;
  if (a.params_in == nullptr || a.params_out == nullptr ||
      a.grads == nullptr || a.exp_avg_in == nullptr ||
      a.exp_avg_out == nullptr || a.exp_avg_sq_in == nullptr ||
      a.exp_avg_sq_out == nullptr) {
    throw UsageError("fused_adam_step: null buffer for a non-empty span");
  }
  if (!in_place_or_apart(a.params_in, a.params_out, n) ||
      !in_place_or_apart(a.exp_avg_in, a.exp_avg_out, n) ||
      !in_place_or_apart(a.exp_avg_sq_in, a.exp_avg_sq_out, n)) {
    throw UsageError(
        "fused_adam_step: an output array overlaps its input without being "
        "it (an update is in place or wholly out of place)");
  }
  const Isa isa =
      options.isa == Isa::kAuto ? fused_adam_best_isa() : options.isa;
  const StepConstants c = constants_for(hyper);
  Kernel kernel;
  if (hyper.decoupled) {
    kernel = kernel_for<Decay::kDecoupled>(isa);
  } else if (c.wd != 0.0f) {
    kernel = kernel_for<Decay::kL2>(isa);
  } else {
    kernel = kernel_for<Decay::kNone>(isa);
  }
  const Io io{a.params_in,  a.params_out,  a.grads,         a.exp_avg_in,
              a.exp_avg_out, a.exp_avg_sq_in, a.exp_avg_sq_out};
  parallel_chunks(n, options.threads, [&](size_t begin, size_t end) {
    kernel(io.at(begin), end - begin, c);
  });
}

}  // namespace zerostep
