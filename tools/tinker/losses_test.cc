#include "tools/tinker/losses.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

TensorValue ints(std::vector<int64_t> v) {
  TensorValue t;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

TensorValue floats(std::vector<float> v) {
  TensorValue t;
  t.is_float = true;
  t.shape = {static_cast<int64_t>(v.size())};
  t.floats = std::move(v);
  return t;
}

ForwardBackwardIn request(const std::string& loss_fn) {
  ForwardBackwardIn in;
  in.loss_fn = loss_fn;
  DatumIn d;
  d.tokens = {1, 2, 3};
  d.inputs["target_tokens"] = ints({2, 3, 4});
  if (loss_fn != "cross_entropy") {
    d.inputs["logprobs"] = floats({-1.0f, -2.0f, -3.0f});
    d.inputs["advantages"] = floats({1.0f, -1.0f, 2.0f});
  }
  in.data.push_back(d);
  return in;
}

std::string error_of(const ForwardBackwardIn& in) {
  try {
    plan_forward_backward(in, base_models().front());
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LossesTest, PlansEveryDatumsInputsAsTensors) {
  const std::vector<DatumPlan> plans =
      plan_forward_backward(request("ppo"), base_models().front());
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_TRUE(torch::equal(
      plans[0].tokens, torch::tensor({1, 2, 3}, torch::kInt64).view({1, 3})));
  EXPECT_TRUE(
      torch::equal(plans[0].targets, torch::tensor({2, 3, 4}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(plans[0].adv, torch::tensor({1.0f, -1.0f, 2.0f})));
  // cross_entropy without weights: every token weighs 1.
  const std::vector<DatumPlan> ce =
      plan_forward_backward(request("cross_entropy"), base_models().front());
  EXPECT_TRUE(torch::equal(ce[0].weights, torch::ones({3})));
}

TEST(LossesTest, ChecksNameTheDatumAndTheField) {
  EXPECT_EQ(error_of(request("dpo")),
            "loss_fn 'dpo' is not served (this server computes "
            "cross_entropy, importance_sampling, ppo)");
  ForwardBackwardIn in = request("cross_entropy");
  in.data[0].tokens = {1, 2, 256};
  EXPECT_EQ(error_of(in),
            "data[0].model_input[2] = 256 is outside the vocabulary [0, 256) "
            "of zerostep/tiny-gpt");
  in = request("importance_sampling");
  in.data[0].inputs.erase("advantages");
  EXPECT_EQ(error_of(in),
            "data[0].loss_fn_inputs lacks 'advantages', which "
            "importance_sampling needs");
  in = request("ppo");
  in.data[0].inputs["advantages"] = floats({1.0f, NAN, 2.0f});
  EXPECT_EQ(error_of(in),
            "data[0].loss_fn_inputs['advantages'] holds a non-finite value");
  in = request("ppo");
  in.loss_fn_config = {{"clip_low_threshold", 1.5}};
  EXPECT_EQ(error_of(in),
            "ppo: clip_low_threshold 1.500000 must not exceed "
            "clip_high_threshold 1.200000");
  in = request("cross_entropy");
  in.loss_fn_config = {{"clip_low_threshold", 0.5}};
  EXPECT_EQ(error_of(in),
            "loss_fn_config key 'clip_low_threshold' is not used by "
            "cross_entropy (it takes no config)");
}

TEST(LossesTest, PpoClipDefaultsAndOverrides) {
  EXPECT_EQ(ppo_clip({}).low, 0.8);
  EXPECT_EQ(ppo_clip({}).high, 1.2);
  EXPECT_EQ(ppo_clip({{"clip_high_threshold", 2.0}}).high, 2.0);
  EXPECT_EQ(ppo_clip({{"clip_high_threshold", 2.0}}).low, 0.8);
}

// Note [Losses] in protocol.h, token by token.
TEST(LossesTest, ElementwiseLossesFollowTheProtocol) {
  DatumPlan d;
  d.weights = torch::tensor({1.0f, 0.5f});
  d.q = torch::tensor({0.0f, 0.0f});
  d.adv = torch::tensor({2.0f, -1.0f});
  const torch::Tensor lp = torch::tensor({std::log(2.0f), std::log(0.5f)});
  const PpoClip clip;  // 0.8, 1.2
  const torch::Tensor ce = elementwise_loss("cross_entropy", lp, d, clip);
  EXPECT_FLOAT_EQ(ce[0].item<float>(), -std::log(2.0f));
  EXPECT_FLOAT_EQ(ce[1].item<float>(), -0.5f * std::log(0.5f));
  // Ratios 2 and 0.5.
  const torch::Tensor is = elementwise_loss("importance_sampling", lp, d, clip);
  EXPECT_FLOAT_EQ(is[0].item<float>(), -4.0f);
  EXPECT_FLOAT_EQ(is[1].item<float>(), 0.5f);
  // min(r A, clip(r) A): min(4, 2.4) and min(-0.5, -0.8).
  const torch::Tensor ppo = elementwise_loss("ppo", lp, d, clip);
  EXPECT_FLOAT_EQ(ppo[0].item<float>(), -2.4f);
  EXPECT_FLOAT_EQ(ppo[1].item<float>(), 0.8f);
}

TEST(LossesTest, TargetLogprobsPickEachPositionsTarget) {
  const torch::Tensor logits = torch::zeros({2, 4});  // uniform over 4
  const torch::Tensor lp =
      target_logprobs(logits, torch::tensor({3, 0}, torch::kInt64));
  EXPECT_FLOAT_EQ(lp[0].item<float>(), std::log(0.25f));
  EXPECT_FLOAT_EQ(lp[1].item<float>(), std::log(0.25f));
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
