// A reference run against LibTorch's optimizers (testonly): the shared
// check of offload/fused_adam_test.cc (the fused kernel) and
// zero/optimizer_test.cc (FlatOptimizer).
//
// Tolerance, not bitwise: LibTorch computes the Adam denominator as
// sqrt(v)/sqrt(bias2) + eps with tensor ops and the step size in double;
// our kernels multiply by 1/sqrt(bias2) and round scalars to float once.
// Both are float32 throughout, so over 200 steps the parameters agree to a
// few ulps of their magnitude; callers require 1e-5 relative.
//
// Thread safety: seeds LibTorch's global generator; one at a time.
#ifndef ZEROSTEP_OFFLOAD_LIBTORCH_REFERENCE_H_
#define ZEROSTEP_OFFLOAD_LIBTORCH_REFERENCE_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace zerostep {

// Elements of the trained vector.
constexpr int64_t kLibTorchReferenceNumel = 1000;

// Our optimizer's step `step` (1-based) on kLibTorchReferenceNumel
// parameters, in place, from their gradients.
using OptimizerStepFn =
    std::function<void(float* params, const float* grads, int64_t step)>;

// Makes LibTorch's optimizer over the given parameters.
using TorchOptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(
        std::vector<torch::Tensor> params)>;

// A TorchOptimizerFactory for TorchOpt (e.g. torch::optim::AdamW) with
// `options`.
template <typename TorchOpt, typename Options>
TorchOptimizerFactory torch_optimizer(Options options) {
  return [options](std::vector<torch::Tensor> params) {
    return std::make_unique<TorchOpt>(std::move(params), options);
  };
}

// From torch::manual_seed(7) and torch::randn parameters, `steps` steps of
// LibTorch's optimizer and of `ours` on the same gradients (step s:
// torch::randn times 1 + s % 5, so the moments see changing magnitudes).
// Returns max|ours - theirs| / max|theirs| over the final parameters.
double max_rel_diff_from_libtorch(const TorchOptimizerFactory& make_theirs,
                                  const OptimizerStepFn& ours, int steps = 200);

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_LIBTORCH_REFERENCE_H_
