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
  const double bias1 = 1.0 - std::pow(h.beta1, t);
  const double bias2 = 1.0 - std::pow(h.beta2, t);
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
template <Decay D>
__attribute__((always_inline)) inline void adam_one(
    float* __restrict p, const float* __restrict g, float* __restrict m,
    float* __restrict v, size_t i, const StepConstants& c) {
  float pi = p[i];
  float gi = g[i];
  if (D == Decay::kDecoupled) {
    pi = pi * c.decay;
  } else if (D == Decay::kL2) {
    gi = gi + c.wd * pi;
  }
  const float mi = c.b1 * m[i] + c.one_minus_b1 * gi;
  const float vi = c.b2 * v[i] + c.one_minus_b2 * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float denom = std::sqrt(vi) * c.inv_sqrt_bias2 + c.eps;
  p[i] = pi - c.step_size * (mi / denom);
}

template <Decay D>
void adam_scalar(float* __restrict p, const float* __restrict g,
                 float* __restrict m, float* __restrict v, size_t n,
                 const StepConstants& c) {
  for (size_t i = 0; i < n; ++i) adam_one<D>(p, g, m, v, i, c);
}

#if ZS_FUSED_ADAM_X86

// AVX2: 8 lanes. Only "avx2" is asked for, not "fma": the kernel uses no
// FMA (see the header), so it runs on any AVX2 CPU.
template <Decay D>
__attribute__((target("avx2"))) void adam_avx2(float* __restrict p,
                                               const float* __restrict g,
                                               float* __restrict m,
                                               float* __restrict v, size_t n,
                                               const StepConstants& c) {
  const __m256 b1 = _mm256_set1_ps(c.b1);
  const __m256 b2 = _mm256_set1_ps(c.b2);
  const __m256 omb1 = _mm256_set1_ps(c.one_minus_b1);
  const __m256 omb2 = _mm256_set1_ps(c.one_minus_b2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 wd = _mm256_set1_ps(c.wd);
  const __m256 decay = _mm256_set1_ps(c.decay);
  const __m256 step_size = _mm256_set1_ps(c.step_size);
  const __m256 isb2 = _mm256_set1_ps(c.inv_sqrt_bias2);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pi = _mm256_loadu_ps(p + i);
    __m256 gi = _mm256_loadu_ps(g + i);
    if (D == Decay::kDecoupled) {
      pi = _mm256_mul_ps(pi, decay);
    } else if (D == Decay::kL2) {
      gi = _mm256_add_ps(gi, _mm256_mul_ps(wd, pi));
    }
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)),
                                    _mm256_mul_ps(omb1, gi));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 denom =
        _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), isb2), eps);
    _mm256_storeu_ps(
        p + i,
        _mm256_sub_ps(pi, _mm256_mul_ps(step_size, _mm256_div_ps(mi, denom))));
  }
  for (; i < n; ++i) adam_one<D>(p, g, m, v, i, c);
}

// AVX-512: 16 lanes; the tail (< 16 elements) uses masked loads and stores
// with the same operations, so it needs no scalar loop. Masked-off lanes
// compute on zeros (sqrt(0), 0/eps), which raises no trap: x86 float
// exceptions are masked by default. The sqrt is the masked form only
// because GCC 12's plain _mm512_sqrt_ps trips -Wmaybe-uninitialized inside
// its own header; active lanes get the same correctly rounded sqrt.
template <Decay D>
__attribute__((target("avx512f"))) void adam_avx512(
    float* __restrict p, const float* __restrict g, float* __restrict m,
    float* __restrict v, size_t n, const StepConstants& c) {
  const __m512 b1 = _mm512_set1_ps(c.b1);
  const __m512 b2 = _mm512_set1_ps(c.b2);
  const __m512 omb1 = _mm512_set1_ps(c.one_minus_b1);
  const __m512 omb2 = _mm512_set1_ps(c.one_minus_b2);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 wd = _mm512_set1_ps(c.wd);
  const __m512 decay = _mm512_set1_ps(c.decay);
  const __m512 step_size = _mm512_set1_ps(c.step_size);
  const __m512 isb2 = _mm512_set1_ps(c.inv_sqrt_bias2);
  for (size_t i = 0; i < n; i += 16) {
    const size_t left = n - i;
    const __mmask16 k = left >= 16 ? static_cast<__mmask16>(0xFFFF)
                                   : static_cast<__mmask16>((1u << left) - 1u);
    __m512 pi = _mm512_maskz_loadu_ps(k, p + i);
    __m512 gi = _mm512_maskz_loadu_ps(k, g + i);
    if (D == Decay::kDecoupled) {
      pi = _mm512_mul_ps(pi, decay);
    } else if (D == Decay::kL2) {
      gi = _mm512_add_ps(gi, _mm512_mul_ps(wd, pi));
    }
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(b1, _mm512_maskz_loadu_ps(k, m + i)),
                      _mm512_mul_ps(omb1, gi));
    const __m512 vi =
        _mm512_add_ps(_mm512_mul_ps(b2, _mm512_maskz_loadu_ps(k, v + i)),
                      _mm512_mul_ps(_mm512_mul_ps(omb2, gi), gi));
    _mm512_mask_storeu_ps(m + i, k, mi);
    _mm512_mask_storeu_ps(v + i, k, vi);
    const __m512 denom =
        _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_sqrt_ps(k, vi), isb2), eps);
    _mm512_mask_storeu_ps(
        p + i, k,
        _mm512_sub_ps(pi, _mm512_mul_ps(step_size, _mm512_div_ps(mi, denom))));
  }
}

#endif  // ZS_FUSED_ADAM_X86

using Kernel = void (*)(float*, const float*, float*, float*, size_t,
                        const StepConstants&);

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
  if (params == nullptr || grads == nullptr || exp_avg == nullptr ||
      exp_avg_sq == nullptr) {
    throw UsageError("fused_adam_step: null buffer for a non-empty span");
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
  parallel_chunks(n, options.threads, [&](size_t begin, size_t end) {
    kernel(params + begin, grads + begin, exp_avg + begin, exp_avg_sq + begin,
           end - begin, c);
  });
}

}  // namespace zerostep
