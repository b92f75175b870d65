// Fused Adam / AdamW over flat float32 spans: one pass that reads p, g, m, v
// and writes p, m, v (28 bytes per parameter), in place or to other arrays
// (Note [Update out of place]), vectorized with AVX-512 or AVX2 chosen at
// run time, and split over threads in fixed chunks. It is the
// CPU optimizer for offloaded optimizer state (issue 4); it computes nothing
// else (no norm, no clipping, no scaling).
//
// Semantics: exactly those of zerostep::FlatOptimizer (zero/optimizer.h),
// which follows LibTorch's torch::optim::Adam / AdamW. With t = hyper.step
// (1-based: the step being applied), per element, in this order, each
// operation rounded to float32:
//
//   AdamW (decoupled):          p = p * (1 - lr*wd)
//   Adam with wd != 0 (L2):     g = g + wd * p
//   m = b1 * m + (1 - b1) * g
//   v = b2 * v + ((1 - b2) * g) * g
//   denom = sqrt(v) * (1 / sqrt(1 - b2^t)) + eps
//   p = p - (lr / (1 - b1^t)) * (m / denom)
//
// Without bias correction (hyper.bias_correction false: DeepSpeed's
// FusedAdam and CPU Adam with optimizer.params.bias_correction false)
// both corrections are 1: denom = sqrt(v) * 1 + eps, p = p - lr * (m /
// denom), the same operations with those two scalars.
//
// The per-step scalars (1 - lr*wd, 1/sqrt(1 - b2^t), lr/(1 - b1^t), 1 - b1,
// 1 - b2) are computed in double and rounded to float once, as
// FlatOptimizer does; that is why AdamStepParams holds doubles.
//
// Numerical contract:
//  * Bitwise: the result is identical for every thread count and every ISA
//    (scalar, AVX2, AVX-512). Every element is computed independently by the
//    same sequence of IEEE float32 operations: the vector paths use separate
//    multiply and add (no FMA), and sqrt and division are correctly rounded
//    in both the scalar and the vector instructions. The library is compiled
//    with -ffp-contract=off so that GCC cannot fuse a multiply and an add in
//    one path but not another. Chunking never changes which operations an
//    element sees, so it cannot change results either.
//  * Bitwise against FlatOptimizer too, as long as FlatOptimizer's loop is
//    not FMA-contracted (true for the default x86-64 build, which has no
//    FMA; a build with -mfma/-march=native may contract it, and then the two
//    differ by FMA rounding: fused_adam_test allows 1e-5 relative after 150
//    steps; with contraction forced on one side we measured 1.6e-6).
//  * Tolerance against torch::optim::Adam/AdamW: LibTorch divides by
//    sqrt(1 - b2^t) instead of multiplying by its float reciprocal and keeps
//    the step size in double, so the two agree to a few float32 ulps per
//    step (fused_adam_test requires 1e-5 relative over 200 steps).
//
// Why no FMA: the kernel is memory-bound (28 bytes against 14 float operations
// per parameter), so FMA buys no time, while keeping it out makes every ISA,
// including the scalar fallback on CPUs without FMA, produce the same bits.
//
// Performance: the loop is memory-bound. The vector paths prefetch 1 KiB
// ahead in each stream (fused_adam.cc says why). The benchmark
// //benchmarks:fused_adam_bench compares the kernel with a load/store loop
// of the same traffic and with torch::optim::AdamW (docs/benchmarks.md).
//
// Thread safety: fused_adam_step may be called concurrently on disjoint
// spans. The spans passed to one call must not overlap each other.
#ifndef ZEROSTEP_OFFLOAD_FUSED_ADAM_H_
#define ZEROSTEP_OFFLOAD_FUSED_ADAM_H_

#include <cstddef>
#include <cstdint>
#include <functional>

namespace zerostep {

// Hyper-parameters of one step. Same defaults as OptimizerHyper.
struct AdamStepParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // The 1-based number of this step (FlatOptimizer::step_count() after the
  // step); drives bias correction. Must be >= 1.
  int64_t step = 1;
  // true: AdamW (decay p by lr*wd). false: Adam (add wd*p to the gradient).
  bool decoupled = true;
  // false: no bias correction (1 - b1^t and 1 - b2^t are taken as 1).
  bool bias_correction = true;
  // Threads a Kernels implementation may split the pass over (the host's:
  // FusedAdamOptions::threads); not a hyper-parameter, and the bits never
  // depend on it.
  int threads = 1;
};

// Instruction sets the kernel has a path for. kAuto picks the widest the CPU
// supports.
enum class Isa { kAuto, kScalar, kAvx2, kAvx512 };

struct FusedAdamOptions {
  // Threads to split the span over (the calling thread is one of them);
  // values < 1 mean 1. Spans too small to be worth a thread use fewer (see
  // parallel_chunks); results never depend on it.
  int threads = 1;
  // A specific ISA (for tests and benchmarks); UsageError if the CPU lacks it.
  Isa isa = Isa::kAuto;
};

// One Adam/AdamW update of params[0, n), exp_avg[0, n), exp_avg_sq[0, n)
// from grads[0, n). n == 0 does nothing (null pointers allowed then).
// UsageError on step < 1, a null pointer with n > 0, or an unsupported ISA.
void fused_adam_step(float* params, const float* grads, float* exp_avg,
                     float* exp_avg_sq, size_t n, const AdamStepParams& hyper,
                     const FusedAdamOptions& options = FusedAdamOptions());

// Where an update out of place reads and writes (Note [Update out of
// place]): each *_out array gets the new values of its *_in array, which
// it either is (in place) or does not overlap at all. The same bits as the
// update in place.
struct AdamArrays {
  const float* params_in = nullptr;
  float* params_out = nullptr;
  const float* grads = nullptr;
  const float* exp_avg_in = nullptr;
  float* exp_avg_out = nullptr;
  const float* exp_avg_sq_in = nullptr;
  float* exp_avg_sq_out = nullptr;
};

// Note [Update out of place]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// An update that must be undoable if a later collective fails keeps the
// old parameters and moments. Copying them aside and updating in place
// moves 8 more bytes per array and element than the update; reading the
// old arrays and writing the new ones beside them moves none more. A
// plain store to a line not in the cache reads the line first, which in
// place the update has just done; so when every output is apart and
// 64-byte aligned (32 for AVX2) the vector paths store around the caches
// (non-temporal stores, then a fence) and nothing is read twice. Plain
// stores to outputs apart took about twice the in-place time on the
// development machine, streamed ones about 1.15x (docs/benchmarks.md,
// fused_adam_bench; the plain stores' timing: that file as of fee84cc).
// The caller then makes the new arrays current (the
// optimizer flips its two banks of moments; zero/optimizer.h) or drops
// them (nothing to restore).
void fused_adam_step(const AdamArrays& arrays, size_t n,
                     const AdamStepParams& hyper,
                     const FusedAdamOptions& options = FusedAdamOptions());

// Whether this CPU (and this build) can run `isa`. kAuto and kScalar: always.
bool fused_adam_isa_supported(Isa isa);
// The ISA kAuto resolves to on this CPU.
Isa fused_adam_best_isa();
// "scalar", "avx2", "avx512" ("auto" for kAuto).
const char* fused_adam_isa_name(Isa isa);
// The name of the ISA kAuto resolves to: fused_adam_isa_name(best).
const char* fused_adam_isa();

// Runs fn(begin, end) over [0, n) split into contiguous chunks, one per
// thread, on `threads` threads (the caller runs the first chunk). The
// boundaries depend only on n and threads: every chunk but the last starts
// and ends on a multiple of kChunkAlign elements (64 bytes, so no two
// threads write the same cache line of a 64-byte aligned buffer), and
// at most max(1, n / kMinChunk) threads are used, because starting a thread
// costs tens of microseconds, about what one thread needs to update 64K
// parameters. Returns after every chunk is done; an exception
// from fn is rethrown on the caller (the first, by chunk order). Exposed so
// that benchmarks can split other loops the same way.
constexpr size_t kChunkAlign = 16;
constexpr size_t kMinChunk = 1 << 16;
void parallel_chunks(size_t n, int threads,
                     const std::function<void(size_t, size_t)>& fn);

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_FUSED_ADAM_H_
