#include "config/precision.h"

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

TEST(ParseConfigTest, Fp16SectionWithDeepSpeedKeys) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
                   "loss_scale_window": 100, "hysteresis": 3,
                   "consecutive_hysteresis": true, "min_loss_scale": 0.5,
                   "auto_cast": false}})",
      1);
  EXPECT_EQ(c.precision.dtype, Precision::kFp16);
  EXPECT_EQ(c.precision.grad_accum_dtype, Precision::kFp32);
  EXPECT_EQ(c.precision.loss_scale, 0.0);
  EXPECT_EQ(c.precision.initial_scale_power, 12);
  EXPECT_EQ(c.precision.loss_scale_window, 100);
  EXPECT_EQ(c.precision.hysteresis, 3);
  EXPECT_TRUE(c.precision.consecutive_hysteresis);
  EXPECT_EQ(c.precision.min_loss_scale, 0.5);
  EXPECT_EQ(c.ignored_keys, (std::vector<std::string>{"fp16.auto_cast"}));
}

TEST(ParseConfigTest, Bf16AndGradAccumDtype) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "bfloat16": {"enabled": true},
          "data_types": {"grad_accum_dtype": "BF16"}})",
      1);
  EXPECT_EQ(c.precision.dtype, Precision::kBf16);
  EXPECT_EQ(c.precision.grad_accum_dtype, Precision::kBf16);
}

TEST(ParseConfigTest, MixedPrecisionProblemsNameKeyRuleAndFix) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true,
          "hysteresis": 0, "min_loss_scale": -1, "loss_scal": 0},
          "bf16": {"enabled": true}, "amp": {"enabled": true},
          "data_types": {"grad_accum_dtype": "int8"}})");
  ASSERT_EQ(ps.size(), 6u);
  EXPECT_EQ(ps[0].key, "fp16.hysteresis");
  EXPECT_HAS(ps[0].rule, ">= 1");
  EXPECT_EQ(ps[1].key, "fp16.min_loss_scale");
  EXPECT_EQ(ps[2].key, "fp16.loss_scal");
  EXPECT_HAS(ps[2].fix, "loss_scale");
  EXPECT_EQ(ps[3].key, "bf16.enabled");
  EXPECT_HAS(ps[3].rule, "fp16.enabled");
  EXPECT_EQ(ps[4].key, "amp");
  EXPECT_EQ(ps[4].value, R"({"enabled":true})");
  EXPECT_HAS(ps[4].rule, "changes training");
  EXPECT_HAS(ps[4].rule, "NVIDIA Apex AMP");
  EXPECT_HAS(ps[4].fix, "bf16");
  EXPECT_EQ(ps[5].key, "data_types.grad_accum_dtype");
  EXPECT_EQ(ps[5].value, "\"int8\"");
}

TEST(ParseConfigTest, GradAccumDtypeMustBeFp32OrTheTrainingDtype) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
          "data_types": {"grad_accum_dtype": "fp16"}})");
  EXPECT_EQ(p.key, "data_types.grad_accum_dtype");
  EXPECT_HAS(p.rule, "\"bf16\"");
  ConfigProblem q = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "data_types": {"grad_accum_dtype": "bf16"}})");
  EXPECT_HAS(q.fix, "enable bf16");
}

TEST(ParseConfigTest, DisabledMixedPrecisionIsIgnored) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": false,
          "loss_scale": 0}, "bf16": {}})",
      1);
  EXPECT_EQ(c.ignored_keys, (std::vector<std::string>{"fp16", "bf16"}));
}

// --- null (issue 14 item 2) ---

// DeepSpeed reads a null bf16 as absent; bfloat16 (its fallback) and fp16
// null fail there, as do null values inside the sections (pydantic bools
// and numbers). data_types.grad_accum_dtype and param_dtype default to None.
TEST(ParseConfigTest, NullInThePrecisionSections) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "bf16": null,
          "data_types": {"grad_accum_dtype": null, "param_dtype": null}})",
      1);
  EXPECT_EQ(c.precision.dtype, Precision::kFp32);
  EXPECT_EQ(c.precision.grad_accum_dtype, Precision::kFp32);
  EXPECT_EQ(c.ignored_keys, (std::vector<std::string>{"bf16"}));
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1, "bfloat16": null,
          "fp16": {"enabled": true, "loss_scale": null,
                   "auto_cast": null}})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].key, "bfloat16");
  EXPECT_EQ(ps[1].key, "fp16.loss_scale");
  EXPECT_EQ(ps[2].key, "fp16.auto_cast");
  for (const ConfigProblem& p : ps) EXPECT_EQ(p.value, "null");
}

// --- DeepSpeed's precision keys zerostep does not implement (item 8) ---

TEST(ParseConfigTest, PrecisionKeysAreIgnoredOnlyAtTheirNoOpValue) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "bf16": {"enabled": true, "immediate_grad_update": true,
                   "check_grad_overflow": false,
                   "bf16_master_weights_and_grads": false},
          "data_types": {"param_dtype": "bf16", "buffer_dtype": null},
          "torch_autocast": {"enabled": false, "dtype": "bfloat16"}})",
      1);
  EXPECT_EQ(c.precision.dtype, Precision::kBf16);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{
                "bf16.immediate_grad_update", "bf16.check_grad_overflow",
                "bf16.bf16_master_weights_and_grads", "data_types.buffer_dtype",
                "torch_autocast"}));
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "fp16": {"enabled": true, "auto_cast": true,
                   "fp16_master_weights_and_grads": true},
          "bfloat16": {"check_grad_overflow": true},
          "data_types": {"param_dtype": "bf16", "buffer_dtype": "fp16"},
          "torch_autocast": {"enabled": true}})");
  ASSERT_EQ(ps.size(), 6u);
  EXPECT_EQ(ps[0].key, "fp16.auto_cast");
  EXPECT_EQ(ps[0].value, "true");
  EXPECT_HAS(ps[0].rule, "changes training; zerostep does not implement it");
  EXPECT_EQ(ps[0].fix, "remove it or set it to false");
  EXPECT_EQ(ps[1].key, "fp16.fp16_master_weights_and_grads");
  EXPECT_EQ(ps[2].key, "bfloat16.check_grad_overflow");
  EXPECT_HAS(ps[2].rule, "not finite");
  EXPECT_EQ(ps[3].key, "data_types.buffer_dtype");
  EXPECT_EQ(ps[4].key, "torch_autocast");
  EXPECT_EQ(ps[4].fix, "remove it or set enabled to false");
  // After the document: param_dtype names another dtype than fp16's.
  EXPECT_EQ(ps[5].key, "data_types.param_dtype");
  EXPECT_EQ(ps[5].value, "\"bf16\"");
  EXPECT_HAS(ps[5].rule, "must be the training dtype (\"fp16\"");
}

}  // namespace
}  // namespace zerostep
