#include "tools/tinker/losses.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

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
            "cross_entropy, importance_sampling, ppo, cispo, dro, gspo, "
            "stable_reinforce)");
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

TEST(LossesTest, CustomSaysWhyAndWhatToUse) {
  const std::string custom = error_of(request("custom"));
  EXPECT_NE(custom.find("create_custom_loss"), std::string::npos) << custom;
  EXPECT_NE(custom.find("Use forward_backward_custom"), std::string::npos)
      << custom;
}

TEST(LossesTest, ConfigDefaultsRequiredKeysAndChecks) {
  // ppo defaults to 0.8 and 1.2, cispo to the one-sided 0 and 4; a key
  // given replaces its default alone.
  for (auto [loss, lo, hi] : {std::tuple{"ppo", 0.8, 1.2},
                              std::tuple{"cispo", 0.0, 4.0}}) {
    EXPECT_EQ(loss_config(loss, {}).clip_low, lo) << loss;
    EXPECT_EQ(loss_config(loss, {}).clip_high, hi) << loss;
    EXPECT_EQ(loss_config(loss, {{"clip_high_threshold", 2.0}}).clip_high, 2.0);
    EXPECT_EQ(loss_config(loss, {{"clip_high_threshold", 2.0}}).clip_low, lo);
    EXPECT_EQ(loss_config(loss, {{"clip_low_threshold", 0.5}}).clip_high, hi);
  }
  EXPECT_EQ(loss_config("dro", {{"beta", 0.05}}).beta, 0.05);
  EXPECT_EQ(loss_config("stable_reinforce", {}).kl_coeff, 0.0);
  EXPECT_EQ(loss_config("stable_reinforce", {{"kl_coeff", 0.1}}).kl_coeff,
            0.1);
  const LossConfig g = loss_config(
      "gspo", {{"clip_low_threshold", 0.9}, {"clip_high_threshold", 1.1}});
  EXPECT_EQ(g.clip_low, 0.9);
  EXPECT_EQ(g.clip_high, 1.1);
  auto error = [](const std::string& loss,
                  const std::map<std::string, double>& c) -> std::string {
    try {
      loss_config(loss, c);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error("dro", {}),
            "dro needs loss_fn_config['beta']: Tinker documents no default "
            "for it. Fix: pass loss_fn_config={'beta': ...}");
  EXPECT_EQ(error("gspo", {{"clip_low_threshold", 0.9}}),
            "gspo needs loss_fn_config['clip_high_threshold']: Tinker "
            "documents no default for it. Fix: pass "
            "loss_fn_config={'clip_low_threshold': ..., "
            "'clip_high_threshold': ...}");
  EXPECT_EQ(error("cispo", {{"beta", 0.1}}),
            "loss_fn_config key 'beta' is not used by cispo (it reads "
            "clip_low_threshold, clip_high_threshold)");
  EXPECT_EQ(error("dro", {{"beta", INFINITY}}),
            "loss_fn_config['beta'] is not finite");
  EXPECT_EQ(error("dro", {{"beta", -1.0}}),
            "dro: beta -1.000000 must be >= 0 (it weighs a penalty on logp - "
            "q)");
  EXPECT_EQ(error("stable_reinforce", {{"kl_coeff", -0.5}}),
            "stable_reinforce: kl_coeff -0.500000 must be >= 0 (it weighs a "
            "KL penalty towards the sampler)");
  EXPECT_EQ(error("cispo", {{"clip_low_threshold", 4.5}}),
            "cispo: clip_low_threshold 4.500000 must not exceed "
            "clip_high_threshold 4.000000");
}

TEST(LossesTest, GspoReadsItsMaskAsIntegersOrFloats) {
  ForwardBackwardIn in = request("gspo");
  in.loss_fn_config = {{"clip_low_threshold", 0.9},
                       {"clip_high_threshold", 1.1}};
  EXPECT_EQ(error_of(in),
            "data[0].loss_fn_inputs lacks 'sequence_ratio_mask', which gspo "
            "needs");
  in.data[0].inputs["sequence_ratio_mask"] = ints({0, 1, 1});
  std::vector<DatumPlan> plans =
      plan_forward_backward(in, base_models().front());
  EXPECT_TRUE(
      torch::equal(plans[0].ratio_mask, torch::tensor({0.f, 1.f, 1.f})));
  in.data[0].inputs["sequence_ratio_mask"] = floats({0, 0, 0});
  EXPECT_EQ(error_of(in),
            "data[0].loss_fn_inputs['sequence_ratio_mask'] marks no token: "
            "gspo's sequence ratio is a mean over the marked tokens. Fix: "
            "mark the sampled tokens (nonzero)");
}

TEST(LossesTest, CrossEntropyTakesKSoftTargetsPerPosition) {
  ForwardBackwardIn in = request("cross_entropy");
  TensorValue t = ints({2, 5, 3, 6, 4, 7});
  t.shape = {3, 2};
  TensorValue w = floats({0.75f, 0.25f, 1, 0, 0.5f, 0.5f});
  w.shape = {3, 2};
  in.data[0].inputs["target_tokens"] = t;
  in.data[0].inputs["weights"] = w;
  const std::vector<DatumPlan> plans =
      plan_forward_backward(in, base_models().front());
  EXPECT_EQ(plans[0].targets.sizes(), torch::IntArrayRef({3, 2}));
  EXPECT_EQ(plans[0].weights.sizes(), torch::IntArrayRef({3, 2}));
  // Without weights: ones of the targets' shape.
  in.data[0].inputs.erase("weights");
  EXPECT_TRUE(torch::equal(
      plan_forward_backward(in, base_models().front())[0].weights,
      torch::ones({3, 2})));
  // Weights of another shape, and [T, K] targets for another loss.
  in.data[0].inputs["weights"] = floats({1, 1, 1});
  EXPECT_EQ(error_of(in),
            "data[0].loss_fn_inputs['weights'] has shape [3]; it must be [3], "
            "one entry per input token (or target_tokens and weights both "
            "[3, K], K >= 1 targets each)");
  in = request("importance_sampling");
  in.data[0].inputs["target_tokens"] = t;
  EXPECT_EQ(error_of(in),
            "data[0].loss_fn_inputs['target_tokens'] has shape [3, 2]; it "
            "must be [3], one entry per input token");
  // Soft targets' logprobs: one per (position, target).
  const torch::Tensor logits = torch::zeros({3, 8});
  const torch::Tensor lp = target_logprobs(logits, plans[0].targets);
  EXPECT_EQ(lp.sizes(), torch::IntArrayRef({3, 2}));
  EXPECT_FLOAT_EQ(lp[2][1].item<float>(), std::log(0.125f));
}

TEST(LossesTest, StableReinforceNeedsProvenanceThatTiles) {
  ForwardBackwardIn in = request("stable_reinforce");
  const std::string none = error_of(in);
  EXPECT_EQ(none.rfind("data[0] has no provenance: stable_reinforce trains "
                       "on sequences the sampler recorded",
                       0),
            0u)
      << none;
  DatumIn& d = in.data[0];
  d.has_provenance = true;
  d.input_spans = {{false, "req-1:0", 0, 2}, {true, "req-1:0", 0, 1}};
  d.target_spans = {{false, "req-1:0", 1, 1}, {true, "req-1:0", 0, 1}};
  EXPECT_EQ(error_of(in),
            "data[0].loss_fn_input_spans cover 2 positions but "
            "loss_fn_inputs['target_tokens'] has 3; the runs must tile it "
            "exactly");
  d.target_spans.push_back({true, "req-1:0", 1, 1});
  const std::vector<DatumPlan> plans =
      plan_forward_backward(in, base_models().front());
  EXPECT_FALSE(plans[0].q.defined());  // the trainer fills it from records
  d.input_spans.pop_back();
  EXPECT_EQ(error_of(in),
            "data[0].model_input_spans cover 2 positions but model_input has "
            "3; the runs must tile it exactly");
}

// Each loss against a direct computation of Note [Losses] in protocol.h:
// a loop over tokens in double precision, values and d loss / d logp
// derived by hand (the loss is used with autograd, so its gradient is what
// trains). Tolerance-based: the loss runs in float32.
class LossVsDirect : public ::testing::Test {
 protected:
  // Five tokens whose ratios r = exp(lp - q) are 1.65, 0.905, 1.05, 0.607,
  // 1.35: with thresholds 0.8 and 1.2 ppo clips tokens 0 and 3 and not 4.
  const std::vector<double> lp = {-1.0, -2.3, -0.4, -3.1, -0.9};
  const std::vector<double> q = {-1.5, -2.2, -0.45, -2.6, -1.2};
  const std::vector<double> a = {1.0, -2.0, 0.5, -1.5, -0.7};
  const std::vector<double> w = {1.0, 0.0, 0.5, 1.0, 2.0};
  const std::vector<double> mask = {0, 1, 1, 1, 1};

  static torch::Tensor f32(const std::vector<double>& v) {
    return torch::tensor(v, torch::kFloat64).to(torch::kFloat32);
  }

  // Checks elementwise_loss(loss) and its gradient in lp against `want`
  // (per token) and `want_grad`.
  void check(const std::string& loss, const LossConfig& config,
             const std::vector<double>& want,
             const std::vector<double>& want_grad) {
    DatumPlan d;
    d.weights = f32(w);
    d.q = f32(q);
    d.adv = f32(a);
    d.ratio_mask = f32(mask);
    torch::Tensor x = f32(lp).requires_grad_(true);
    torch::Tensor el = elementwise_loss(loss, x, d, config);
    el.sum().backward();
    ASSERT_EQ(el.numel(), static_cast<int64_t>(want.size()));
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_NEAR(el[t].item<double>(), want[t], 1e-5 * (1 + std::abs(want[t])))
          << loss << " token " << t;
      EXPECT_NEAR(x.grad()[t].item<double>(), want_grad[t],
                  1e-5 * (1 + std::abs(want_grad[t])))
          << loss << " gradient, token " << t;
    }
  }

  static double clamp(double x, double lo, double hi) {
    return x < lo ? lo : (x > hi ? hi : x);
  }
};

TEST_F(LossVsDirect, CrossEntropy) {
  std::vector<double> want, grad;
  for (size_t t = 0; t < lp.size(); ++t) {
    want.push_back(-w[t] * lp[t]);
    grad.push_back(-w[t]);
  }
  check("cross_entropy", LossConfig(), want, grad);
}

TEST_F(LossVsDirect, ImportanceSampling) {
  std::vector<double> want, grad;
  for (size_t t = 0; t < lp.size(); ++t) {
    const double r = std::exp(lp[t] - q[t]);
    want.push_back(-r * a[t]);
    grad.push_back(-r * a[t]);  // d r / d lp = r
  }
  check("importance_sampling", LossConfig(), want, grad);
}

TEST_F(LossVsDirect, Ppo) {
  const LossConfig c;  // 0.8, 1.2
  std::vector<double> want, grad;
  int clipped = 0;
  for (size_t t = 0; t < lp.size(); ++t) {
    const double r = std::exp(lp[t] - q[t]);
    const double u = r * a[t], k = clamp(r, c.clip_low, c.clip_high) * a[t];
    const bool take_clipped = k < u;
    want.push_back(-(take_clipped ? k : u));
    // The clipped term is constant in lp once r is outside [lo, hi].
    grad.push_back(take_clipped ? 0.0 : -r * a[t]);
    clipped += take_clipped;
  }
  EXPECT_EQ(clipped, 2);  // the example exercises both branches
  check("ppo", c, want, grad);
}

TEST_F(LossVsDirect, Cispo) {
  LossConfig c;
  c.clip_low = 0.9;
  c.clip_high = 1.1;
  std::vector<double> want, grad;
  for (size_t t = 0; t < lp.size(); ++t) {
    const double k = clamp(std::exp(lp[t] - q[t]), c.clip_low, c.clip_high);
    want.push_back(-k * lp[t] * a[t]);
    grad.push_back(-k * a[t]);  // the clipped ratio carries no gradient
  }
  check("cispo", c, want, grad);
}

TEST_F(LossVsDirect, Dro) {
  LossConfig c;
  c.beta = 0.3;
  std::vector<double> want, grad;
  for (size_t t = 0; t < lp.size(); ++t) {
    const double d = lp[t] - q[t];
    want.push_back(-(lp[t] * a[t] - 0.5 * c.beta * d * d));
    grad.push_back(-(a[t] - c.beta * d));
  }
  check("dro", c, want, grad);
}

TEST_F(LossVsDirect, Gspo) {
  // Sequence ratio over tokens 1-4: exp(mean(-0.1, 0.05, -0.5, 0.3)) =
  // exp(-0.0625) = 0.939, below clip_low 0.95: clipped where A < 0.
  LossConfig c;
  c.clip_low = 0.95;
  c.clip_high = 1.05;
  double sum = 0, count = 0;
  for (size_t t = 0; t < lp.size(); ++t)
    if (mask[t] != 0) {
      sum += lp[t] - q[t];
      count += 1;
    }
  const double s = std::exp(sum / count);
  std::vector<double> want, grad;
  int clipped = 0;
  for (size_t t = 0; t < lp.size(); ++t) {
    const double u = s * a[t], k = clamp(s, c.clip_low, c.clip_high) * a[t];
    const bool take_clipped = k < u;
    want.push_back(-(take_clipped ? k : u));
    // Token t's ratio has the value s and the gradient of its own lp only:
    // d s_t / d lp_t = s, and no other token's lp moves it.
    grad.push_back(take_clipped ? 0.0 : -s * a[t]);
    clipped += take_clipped;
  }
  EXPECT_EQ(clipped, 3);
  check("gspo", c, want, grad);
}

TEST_F(LossVsDirect, StableReinforce) {
  // Note [stable_reinforce] in stability.h; token 1's q is NaN (a prompt
  // position, advantage 0 there).
  std::vector<double> qs = q;
  qs[1] = NAN;
  std::vector<double> as = a;
  as[1] = 0.0;
  for (const double kl : {0.0, 0.2}) {
    std::vector<double> want, grad;
    int truncated = 0;
    for (size_t t = 0; t < lp.size(); ++t) {
      if (std::isnan(qs[t])) {
        want.push_back(0.0);
        grad.push_back(0.0);
        continue;
      }
      const double r = std::exp(lp[t] - qs[t]);
      const double wt = std::min(r, 1.0);
      truncated += r > 1.0;
      want.push_back(-wt * as[t] * lp[t] + kl * ((r - 1) - (lp[t] - qs[t])));
      // sg(w): d/dlp = -w A; k3: d/dlp ((r - 1) - (lp - q)) = r - 1.
      grad.push_back(-wt * as[t] + kl * (r - 1));
    }
    EXPECT_EQ(truncated, 3);
    DatumPlan d;
    d.q = f32(qs);
    d.adv = f32(as);
    torch::Tensor x = f32(lp).requires_grad_(true);
    LossConfig c;
    c.kl_coeff = kl;
    torch::Tensor el = elementwise_loss("stable_reinforce", x, d, c);
    el.sum().backward();
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_NEAR(el[t].item<double>(), want[t], 1e-5 * (1 + std::abs(want[t])))
          << "kl " << kl << " token " << t;
      EXPECT_NEAR(x.grad()[t].item<double>(), grad[t],
                  1e-5 * (1 + std::abs(grad[t])))
          << "kl " << kl << " gradient, token " << t;
    }
  }
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
