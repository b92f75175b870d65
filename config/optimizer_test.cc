#include "config/optimizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "config/config_test_util.h"

namespace zerostep {
namespace {

using testing_config::only_problem;
using testing_config::problems_of;

TEST(ParseConfigTest, OptimizerTypeIsCaseInsensitiveAndParamsAreRead) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "adamw", "params": {"lr": 3e-4,
            "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}}})",
      1);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "ADAM"}})",
      1);
  // DeepSpeed's "Adam" decouples weight decay unless adam_w_mode is false.
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})",
      1);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "Adam", "params": {"adam_w_mode": true}}})",
      1);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_THROW(parse_config(
                   R"({"train_micro_batch_size_per_gpu": 1,
              "optimizer": {"type": "Adam", "params": {"adam_w_mode": "no"}}})",
                   1),
               ConfigError);
  c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "sgd", "params": {"lr": 0.1, "momentum": 0.9}}})",
      1);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kSGD);
  EXPECT_DOUBLE_EQ(c.optimizer.momentum, 0.9);
}

TEST(ParseConfigTest, OptimizerParamRangesAreAllReported) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "Adam", "params": {"lr": -1,
            "betas": [0.9, 1.0], "eps": 0, "weight_decay": -0.1}}})");
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].key, "optimizer.params.lr");
  EXPECT_EQ(ps[0].value, "-1");
  EXPECT_HAS(ps[0].rule, ">= 0");
  EXPECT_EQ(ps[1].key, "optimizer.params.betas[1]");
  EXPECT_EQ(ps[1].value, "1.0");
  EXPECT_HAS(ps[1].rule, "[0, 1)");
  EXPECT_HAS(ps[1].fix, "0.999");
  EXPECT_EQ(ps[2].key, "optimizer.params.eps");
  EXPECT_HAS(ps[2].rule, "> 0");
  EXPECT_EQ(ps[3].key, "optimizer.params.weight_decay");
  EXPECT_HAS(ps[3].rule, ">= 0");
}

TEST(ParseConfigTest, BetasMustBeTwoNumbers) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})");
  EXPECT_EQ(p.key, "optimizer.params.betas");
  EXPECT_EQ(p.value, "[0.9]");
  EXPECT_HAS(p.rule, "array of two numbers");
}

TEST(ParseConfigTest, UnknownOptimizerParamGetsDidYouMean) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"weight_decy": 0.1}}})");
  EXPECT_EQ(p.key, "optimizer.params.weight_decy");
  EXPECT_EQ(p.fix, "did you mean \"weight_decay\"?");
}

TEST(ParseConfigTest, DeepSpeedAdamFlagsAreReadOrIgnored) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "Adam",
            "params": {"lr": 1e-4, "torch_adam": true, "adam_w_mode": false}}})",
      1);
  // adam_w_mode is acted on for "Adam"; torch_adam is ignored.
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{"optimizer.params.torch_adam"}));
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdam);
  c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})",
      1);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{"optimizer.params.adam_w_mode"}));
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
}

// --- bias_correction (issue 41: implemented) ---

TEST(ParseConfigTest, BiasCorrectionIsReadForAdamAndAdamW) {
  for (const char* type : {"Adam", "AdamW", "adamw"}) {
    SCOPED_TRACE(type);
    auto doc = [&](const char* v) {
      return std::string(R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": ")") +
             type + R"(", "params": {"bias_correction": )" + v + "}}}";
    };
    Config c = parse_config(doc("true"), 1);
    EXPECT_TRUE(c.optimizer.bias_correction);
    EXPECT_TRUE(c.ignored_keys.empty());
    c = parse_config(doc("false"), 1);
    EXPECT_FALSE(c.optimizer.bias_correction);
  }
  EXPECT_TRUE(parse_config(R"({"train_micro_batch_size_per_gpu": 1})", 1)
                  .optimizer.bias_correction);
}

// null is false to DeepSpeed's kernels but absent means true: neither is
// guessed. SGD takes no such parameter (DeepSpeed raises TypeError).
TEST(ParseConfigTest, BiasCorrectionNullAndForSgdAreRejected) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"bias_correction": null}}})");
  EXPECT_EQ(p.key, "optimizer.params.bias_correction");
  EXPECT_EQ(p.value, "null");
  EXPECT_HAS(p.rule, "read it as false");
  p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"bias_correction": "no"}}})");
  EXPECT_HAS(p.rule, "must be a JSON boolean");
  p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "SGD", "params": {"bias_correction": false}}})");
  EXPECT_HAS(p.rule, "applies to Adam and AdamW only");
}

// --- DeepSpeed's other optimizer params (issue 14 items 6, 8) ---

TEST(ParseConfigTest, MaxGradNormBelongsInGradientClipping) {
  // DeepSpeed raises ValueError for it as an optimizer parameter.
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})");
  EXPECT_EQ(p.key, "optimizer.params.max_grad_norm");
  EXPECT_EQ(p.value, "1.0");
  EXPECT_HAS(p.rule, "DeepSpeed raises ValueError");
  EXPECT_HAS(p.fix, "\"gradient_clipping\"");
  // Other frameworks' names inside params get the DeepSpeed name.
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"learning_rate": 1e-4,
            "adam_epsilon": 1e-8, "adam_beta2": 0.95}}})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].fix, "did you mean \"lr\"?");
  EXPECT_EQ(ps[1].fix, "did you mean \"eps\"?");
  EXPECT_EQ(ps[2].fix, "did you mean \"betas\"?");
}

TEST(ParseConfigTest, OptimizerVariantsThatChangeTheUpdateAreRejected) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "legacy_fusion": false,
            "params": {"amsgrad": false, "set_grad_none": true,
                       "fp32_optimizer_states": true, "foreach": true}}})",
      1);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{"optimizer.legacy_fusion",
                                      "optimizer.params.amsgrad",
                                      "optimizer.params.set_grad_none",
                                      "optimizer.params.fp32_optimizer_states",
                                      "optimizer.params.foreach"}));
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"amsgrad": true,
            "fp32_optimizer_states": false, "maximize": true}}})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].key, "optimizer.params.amsgrad");
  EXPECT_EQ(ps[0].rule,
            "changes training; zerostep does not implement it (AMSGrad keeps "
            "the maximum of past second moments; zerostep's Adam is plain "
            "Adam)");
  EXPECT_EQ(ps[0].fix, "remove it or set it to false");
  EXPECT_EQ(ps[1].key, "optimizer.params.fp32_optimizer_states");
  EXPECT_EQ(ps[1].fix, "remove it or set it to true");
  EXPECT_EQ(ps[2].key, "optimizer.params.maximize");
}

// --- null (issue 14 item 2) ---

// DeepSpeed builds the optimizer from `params or {}`: null params are the
// defaults. A null param is handed to the optimizer's constructor, where it
// is no default: lr=None fails, adam_w_mode=None is read as false.
TEST(ParseConfigTest, NullParamsAreTheDefaultsButNullValuesAreNot) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": null}})",
      1);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_TRUE(c.ignored_keys.empty());
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "Adam", "params": {"lr": null,
            "adam_w_mode": null, "torch_adam": null}}})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "optimizer.params.lr");
  EXPECT_EQ(ps[0].value, "null");
  EXPECT_EQ(ps[1].key, "optimizer.params.adam_w_mode");
  EXPECT_HAS(ps[1].rule, "reads it as false");
  EXPECT_HAS(ps[1].fix, "write true");
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": null})");
  EXPECT_EQ(p.key, "optimizer");
}

TEST(ParseConfigTest, UnknownOptimizerTypeListsTheSupportedOnes) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb"}})");
  EXPECT_EQ(p.key, "optimizer.type");
  EXPECT_EQ(p.value, "\"Lamb\"");
  EXPECT_HAS(p.rule, "Adam, AdamW, SGD");
}

TEST(ParseConfigTest, OptimizerSectionNeedsAType) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"params": {"lr": 0.1}}})");
  EXPECT_EQ(p.key, "optimizer.type");
  EXPECT_HAS(p.rule, "required");
}

TEST(ParseConfigTest, ParamsOfTheOtherOptimizerFamilyAreRejected) {
  ConfigProblem momentum = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})");
  EXPECT_EQ(momentum.key, "optimizer.params.momentum");
  EXPECT_HAS(momentum.rule, "SGD only");
  ConfigProblem betas = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})");
  EXPECT_EQ(betas.key, "optimizer.params.betas");
  EXPECT_HAS(betas.rule, "Adam and AdamW only");
}

TEST(ToStringTest, OptimizerTypeNamesMatchTheConfigValues) {
  EXPECT_STREQ(to_string(OptimizerType::kAdam), "Adam");
  EXPECT_STREQ(to_string(OptimizerType::kAdamW), "AdamW");
  EXPECT_STREQ(to_string(OptimizerType::kSGD), "SGD");
}

}  // namespace
}  // namespace zerostep
