// prescale_gradients and gradient_predivide_factor through the Engine
// (Note [Gradient averaging] in zero/averaging.h): at every stage, in both
// accumulation modes, the update is bitwise the one a reference computes
// with DeepSpeed's operations in DeepSpeed's order from each rank's own
// gradients: scaled before the sum, summed in rank order (the simulator's
// fixed order), scaled after. SGD with lr 1 and no momentum makes the new
// parameters p - g, so the check is on the averaged gradient itself.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "models/task.h"
#include "zero/averaging.h"

namespace zerostep {
namespace {

constexpr int kWorld = 3;  // not a power of two: 1/3 and f/3 round
constexpr int kWindows = 2;
constexpr int kBackwards = 2;

Config config_for(int stage, bool managed, const std::string& averaging) {
  return parse_config(
      R"({"train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": )" +
          std::to_string(kBackwards) + R"(,
          "managed_gradient_accumulation": )" +
          (managed ? "true" : "false") + R"(,
          "gradient_accumulation_scaling": "none",
          "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
          "zero_optimization": {"stage": )" +
          std::to_string(stage) + R"(, "reduce_bucket_size": 96,
              "stage3_param_persistence_threshold": 0})" +
          averaging + "}",
      kWorld);
}

// Micro-batch i of rank r, as MlpWorld::loss picks it.
int64_t first_sample(int rank, int i) { return (i * 4 + rank) % 60; }

// Every rank's parameters after kWindows windows of kBackwards backwards.
std::vector<torch::Tensor> train(int stage, bool managed,
                                 const std::string& averaging) {
  MlpWorld w(kWorld, config_for(stage, managed, averaging));
  w.make_engines();
  w.world->run([&](int r) {
    Engine& e = *w.engines[r];
    for (int k = 0; k < kWindows; ++k) {
      for (int b = 0; b < kBackwards; ++b) {
        e.backward(w.loss(r, k * kBackwards + b));
        if (managed) e.step();  // applies on the boundary only
      }
      if (!managed) e.step();
    }
  });
  return w.full_parameters();
}

// The same run by hand: each rank's gradient from its own copy of the
// model, accumulated from +0 in backward order, scaled and summed as Note
// [Gradient averaging] says (stages 0/1: once per window; stages 2/3: per
// backward, the sums added up), the sum scaled, then p - g.
torch::Tensor reference(int stage, const GradAveraging& a) {
  MlpWorld w(kWorld, config_for(stage, true, ""));
  const AveragingSteps steps = averaging_steps(a, stage, kWorld);
  auto params = [&] {
    std::vector<torch::Tensor> ps;
    for (const torch::Tensor& p : w.models[0]->parameters())
      ps.push_back(p.detach().flatten());
    return torch::cat(ps);
  };
  auto scale = [&](torch::Tensor g) {
    for (float f : steps.before) g = g * f;  // float tensor times float
    return g;
  };
  auto rank_sum = [&](const std::vector<torch::Tensor>& v) {
    torch::Tensor s = v[0].clone();
    for (int r = 1; r < kWorld; ++r) s = s + v[r];
    return s;
  };
  torch::Tensor p = params();
  for (int k = 0; k < kWindows; ++k) {
    torch::Tensor total = torch::zeros_like(p);  // the window's partition
    std::vector<torch::Tensor> local(kWorld, torch::zeros_like(p));
    for (int b = 0; b < kBackwards; ++b) {
      std::vector<torch::Tensor> grads(kWorld);
      for (int r = 0; r < kWorld; ++r) {
        torch::nn::Module& m = *w.models[r];
        for (torch::Tensor& q : m.parameters()) q.mutable_grad().reset();
        w.task->loss(m, slice(w.data, first_sample(r, k * kBackwards + b), 2))
            .backward();
        std::vector<torch::Tensor> g;
        for (const torch::Tensor& q : m.parameters())
          g.push_back(q.grad().flatten());
        grads[r] = torch::zeros_like(p) + torch::cat(g);
        local[r] = local[r] + grads[r];
      }
      if (stage >= 2) {
        for (torch::Tensor& g : grads) g = scale(g);
        total = total + rank_sum(grads);
      }
    }
    if (stage < 2) {
      for (torch::Tensor& g : local) g = scale(g);
      total = rank_sum(local);
    }
    total = total * steps.after;
    p = p - total;
    // Every replica takes the new parameters for the next window.
    for (int r = 0; r < kWorld; ++r) {
      torch::NoGradGuard no_grad;
      int64_t at = 0;
      for (torch::Tensor& q : w.models[r]->parameters()) {
        q.copy_(p.narrow(0, at, q.numel()).view_as(q));
        at += q.numel();
      }
    }
  }
  return p;
}

struct Case {
  const char* json;
  GradAveraging averaging;
};

TEST(GradientAveragingTest, EveryStageDoesDeepSpeedsOperationsInBothModes) {
  const Case cases[] = {
      {R"(, "prescale_gradients": true)", {true, 1.0}},
      {R"(, "gradient_predivide_factor": 4.0)", {false, 4.0}},
      {R"(, "gradient_predivide_factor": 3)", {false, 3.0}},  // f == W
  };
  for (int stage = 0; stage <= 3; ++stage) {
    for (const Case& c : cases) {
      SCOPED_TRACE("stage " + std::to_string(stage) + c.json);
      const std::vector<torch::Tensor> unmanaged = train(stage, false, c.json);
      const std::vector<torch::Tensor> managed = train(stage, true, c.json);
      const torch::Tensor want = reference(stage, c.averaging);
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_TRUE(same_bits(unmanaged[r], managed[r])) << "rank " << r;
        EXPECT_TRUE(same_bits(unmanaged[r], want)) << "rank " << r;
      }
    }
  }
}

// The reference tells the orders apart: the default (sum, then / W) and
// the pre-divided average differ in some bits at world 3, so the test
// above would catch a stage that ignored the switch. And the default run
// is what the reference computes without the switches' operations but
// the division (a check of the reference itself).
TEST(GradientAveragingTest, TheOrderShowsInTheBits) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE(stage);
    const torch::Tensor predivided =
        reference(stage, GradAveraging{false, 4.0});
    const std::vector<torch::Tensor> plain = train(stage, false, "");
    EXPECT_FALSE(same_bits(plain[0], predivided));
  }
}

}  // namespace
}  // namespace zerostep
