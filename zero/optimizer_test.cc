// FlatOptimizer against LibTorch's torch::optim over many steps, by the
// reference run offload/fused_adam_test.cc uses for the fused kernel
// (offload/libtorch_reference.h: tolerance, not bitwise; we require 1e-5
// relative).
#include "zero/optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "offload/libtorch_reference.h"

namespace zerostep {
namespace {

template <typename TorchOpt, typename Options>
void run_against_torch(const OptimizerHyper& h, Options options) {
  FlatOptimizer flat(h, kLibTorchReferenceNumel);
  EXPECT_LT(max_rel_diff_from_libtorch(
                torch_optimizer<TorchOpt>(options),
                [&](float* p, const float* g, int64_t) { flat.step(p, g, h); }),
            1e-5);
  EXPECT_EQ(flat.step_count(), 200);
}

TEST(FlatOptimizerTest, AdamWMatchesLibTorch) {
  OptimizerHyper h;
  h.kind = OptimizerKind::kAdamW;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  run_against_torch<torch::optim::AdamW>(
      h, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
}

TEST(FlatOptimizerTest, AdamMatchesLibTorch) {
  OptimizerHyper h;
  h.kind = OptimizerKind::kAdam;
  h.lr = 1e-2;
  h.weight_decay = 0.01;
  h.beta1 = 0.8;
  h.beta2 = 0.95;
  run_against_torch<torch::optim::Adam>(
      h, torch::optim::AdamOptions(1e-2).weight_decay(0.01).betas({0.8, 0.95}));
}

TEST(FlatOptimizerTest, SgdWithMomentumMatchesLibTorch) {
  OptimizerHyper h;
  h.kind = OptimizerKind::kSGD;
  h.lr = 1e-2;
  h.momentum = 0.9;
  h.weight_decay = 0.001;
  run_against_torch<torch::optim::SGD>(
      h, torch::optim::SGDOptions(1e-2).momentum(0.9).weight_decay(0.001));
}

TEST(FlatOptimizerTest, ZeroParamsAndGradsStayZero) {
  // The padding of a flat buffer must never move.
  for (OptimizerKind k :
       {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kSGD}) {
    OptimizerHyper h;
    h.kind = k;
    h.weight_decay = 0.5;
    h.momentum = 0.9;
    std::vector<float> p(8, 0.0f), g(8, 0.0f);
    FlatOptimizer opt(h, 8);
    for (int i = 0; i < 5; ++i) opt.step(p.data(), g.data(), h);
    for (float x : p) EXPECT_EQ(x, 0.0f);
  }
}

TEST(FlatOptimizerTest, StateIsSizedOnceForTheSpan) {
  OptimizerHyper h;
  FlatOptimizer adam(h, 100);
  EXPECT_EQ(adam.state_bytes(), 2 * 100 * sizeof(float));
  h.kind = OptimizerKind::kSGD;
  FlatOptimizer sgd(h, 100);
  EXPECT_EQ(sgd.state_bytes(), 0u);  // no momentum, no state
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

// The engine's optimizer runs the fused kernel; it must give exactly the
// reference loop's bits (neither uses FMA), so switching kernels never
// changes a training run.
TEST(FlatOptimizerTest, FusedKernelGivesTheReferenceBits) {
  for (OptimizerKind k : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    OptimizerHyper h;
    h.kind = k;
    h.lr = 3e-3;
    h.weight_decay = 0.05;
    const size_t n = 1037;
    torch::manual_seed(3);
    torch::Tensor init = torch::randn({static_cast<int64_t>(n)});
    std::vector<float> a(init.data_ptr<float>(), init.data_ptr<float>() + n);
    std::vector<float> b = a;
    FlatOptimizer fused(h, n, AdamKernel::kFused);
    FlatOptimizer reference(h, n, AdamKernel::kReference);
    for (int step = 0; step < 50; ++step) {
      torch::Tensor g = torch::randn({static_cast<int64_t>(n)});
      fused.step(a.data(), g.data_ptr<float>(), h);
      reference.step(b.data(), g.data_ptr<float>(), h);
    }
    EXPECT_EQ(a, b);
    EXPECT_EQ(fused.exp_avg(), reference.exp_avg());
    EXPECT_EQ(fused.exp_avg_sq(), reference.exp_avg_sq());
  }
}

}  // namespace
}  // namespace zerostep
