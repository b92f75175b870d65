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
  EXPECT_EQ(ps[4].key, "amp.enabled");
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

}  // namespace
}  // namespace zerostep
