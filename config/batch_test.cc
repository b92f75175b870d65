#include "config/batch.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "config/config_test_util.h"

namespace zerostep {
namespace {

using testing_config::only_problem;
using testing_config::problems_of;

// --- batch arithmetic ---

struct BatchCase {
  const char* json;
  int world;
  int64_t tbs, micro, gas;
};

TEST(ParseConfigTest, AnyTwoBatchKeysDetermineTheThird) {
  const BatchCase cases[] = {
      {R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
       4, 32, 4, 2},
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 4,
       32, 4, 2},
      {R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})", 4, 32,
       4, 2},
      {R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
           "gradient_accumulation_steps": 2})",
       4, 32, 4, 2},
      {R"({"train_micro_batch_size_per_gpu": 3})", 5, 15, 3, 1},
      {R"({"train_batch_size": 12})", 3, 12, 4, 1},
      // Integral floats are whole numbers.
      {R"({"train_batch_size": 16.0, "gradient_accumulation_steps": 4})", 1, 16,
       4, 4},
  };
  for (const BatchCase& bc : cases) {
    Config c = parse_config(bc.json, bc.world);
    EXPECT_EQ(c.train_batch_size, bc.tbs) << bc.json;
    EXPECT_EQ(c.train_micro_batch_size_per_gpu, bc.micro) << bc.json;
    EXPECT_EQ(c.gradient_accumulation_steps, bc.gas) << bc.json;
  }
}

TEST(ParseConfigTest, InconsistentBatchKeysShowTheArithmeticAndTheFix) {
  ConfigProblem p = only_problem(
      R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})",
      4);
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_EQ(p.value, "30");
  EXPECT_HAS(p.rule, "4 × 2 × 4 = 32");
  EXPECT_HAS(p.fix, "write 32");
}

TEST(ParseConfigTest, TrainBatchSizeMustDivideByMicroTimesWorld) {
  ConfigProblem p = only_problem(
      R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})", 3);
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_EQ(p.value, "30");
  EXPECT_HAS(p.rule,
             "divisible by train_micro_batch_size_per_gpu × world_size");
  EXPECT_HAS(p.rule, "4 × 3 = 12");
  EXPECT_EQ(p.rule,
            "must be divisible by train_micro_batch_size_per_gpu × "
            "world_size = 4 × 3 = 12 (gradient_accumulation_steps = "
            "train_batch_size / 12)");
  EXPECT_HAS(p.fix, "multiple of 12, e.g. 24 or 36");
}

TEST(ParseConfigTest, TrainBatchSizeMustDivideByGasTimesWorld) {
  ConfigProblem p = only_problem(
      R"({"train_batch_size": 10, "gradient_accumulation_steps": 4})", 2);
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_EQ(p.rule,
            "must be divisible by gradient_accumulation_steps × world_size = "
            "4 × 2 = 8 (train_micro_batch_size_per_gpu = train_batch_size / "
            "8)");
  EXPECT_HAS(p.fix, "multiple of 8, e.g. 8 or 16");
}

TEST(ParseConfigTest, TrainBatchSizeAloneMustDivideByWorld) {
  ConfigProblem p = only_problem(R"({"train_batch_size": 10})", 4);
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_HAS(p.rule, "divisible by world_size 4");
  EXPECT_HAS(p.fix, "multiple of 4, e.g. 8 or 12");
}

TEST(ParseConfigTest, GasAloneNeedsMicroOrTrainBatchSize) {
  ConfigProblem p = only_problem(R"({"gradient_accumulation_steps": 4})", 2);
  EXPECT_EQ(p.key, "train_micro_batch_size_per_gpu");
  EXPECT_EQ(p.value, "");
  EXPECT_HAS(p.rule, "gradient_accumulation_steps alone");
  EXPECT_HAS(p.fix, "train_micro_batch_size_per_gpu");
  EXPECT_HAS(p.fix, "train_batch_size");
}

TEST(ParseConfigTest, NoBatchKeyNamesTheKeys) {
  ConfigProblem p = only_problem(R"({})");
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_HAS(p.rule, "train_batch_size or train_micro_batch_size_per_gpu");
  EXPECT_HAS(p.fix, "train_micro_batch_size_per_gpu");
}

TEST(ParseConfigTest, BatchKeysMustBePositiveIntegers) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_batch_size": 0, "train_micro_batch_size_per_gpu": 2.5,
          "gradient_accumulation_steps": "4"})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].key, "train_batch_size");
  EXPECT_HAS(ps[0].rule, "positive integer");
  EXPECT_EQ(ps[1].key, "train_micro_batch_size_per_gpu");
  EXPECT_EQ(ps[1].value, "2.5");
  EXPECT_HAS(ps[1].rule, "whole number");
  EXPECT_EQ(ps[2].key, "gradient_accumulation_steps");
  EXPECT_EQ(ps[2].value, "\"4\"");
  EXPECT_HAS(ps[2].fix, "write 4 (a JSON number, no quotes)");
}

// --- "auto" ---

// Note [Trainer values]: train_batch_size's "auto" is world × micro × gas,
// which the file and world_size determine here.
TEST(ParseConfigTest, AutoTrainBatchSizeIsWorldTimesMicroTimesGas) {
  Config c = parse_config(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})",
      4);
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.filled_auto, std::vector<std::string>{"train_batch_size = 32"});
}

// micro and gas are the trainer's values: without them the fix names the
// field, and the number to write where the others determine it.
TEST(ParseConfigTest, AutoMicroAndGasAreDerivedFromTheOthers) {
  ConfigProblem micro = only_problem(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 2})",
      4);
  EXPECT_EQ(micro.key, "train_micro_batch_size_per_gpu");
  EXPECT_EQ(micro.fix,
            "set TrainerValues::micro_batch_size in the trainer values given "
            "to parse_config, or write 4 (= train_batch_size 32 / (gas 2 × "
            "world 4))");

  ConfigProblem gas = only_problem(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": "auto"})",
      4);
  EXPECT_EQ(gas.key, "gradient_accumulation_steps");
  EXPECT_EQ(gas.fix,
            "set TrainerValues::gradient_accumulation_steps in the trainer "
            "values given to parse_config, or write 2 (= train_batch_size 32 "
            "/ (micro 4 × world 4))");
}

TEST(ParseConfigTest, AutoThatCannotBeDerivedAsksForANumber) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 2})",
      4);
  ASSERT_EQ(ps.size(), 2u);  // no extra "no batch size given" problem
  for (const ConfigProblem& p : ps) {
    EXPECT_HAS(p.rule, "\"auto\"");
    EXPECT_HAS(p.fix, "write a positive integer");
  }
}

// --- managed_gradient_accumulation and scaling ---

TEST(ParseConfigTest, ManagedFlagAndScalingModesParse) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "managed_gradient_accumulation": false,
          "gradient_accumulation_scaling": "per_step_count"})",
      1);
  EXPECT_FALSE(c.managed_gradient_accumulation);
  EXPECT_EQ(c.gradient_accumulation_scaling, GradAccumScaling::kPerStepCount);
  c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "gradient_accumulation_scaling": "none"})",
      1);
  EXPECT_EQ(c.gradient_accumulation_scaling, GradAccumScaling::kNone);
  c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "gradient_accumulation_scaling": "Configured"})",
      1);
  EXPECT_EQ(c.gradient_accumulation_scaling, GradAccumScaling::kConfigured);
}

// --- null (issue 14 item 2) ---

// DeepSpeed's batch keys default to None: null is as absent.
TEST(ParseConfigTest, NullBatchKeysAreAbsent) {
  Config c = parse_config(
      R"({"train_batch_size": null, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": null})",
      2);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_TRUE(c.ignored_keys.empty());
  ConfigProblem p = only_problem(R"({"train_micro_batch_size_per_gpu": null})");
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_HAS(p.rule, "no batch size given");
}

// DeepSpeed tests `not managed_gradient_accumulation()`: None would quietly
// hand the boundary to the caller.
TEST(ParseConfigTest, NullManagedFlagIsRejected) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "managed_gradient_accumulation": null})");
  EXPECT_EQ(p.key, "managed_gradient_accumulation");
  EXPECT_EQ(p.value, "null");
  EXPECT_HAS(p.rule, "DeepSpeed reads it as false");
  EXPECT_EQ(p.fix, "write true or false, or remove it for true");
}

TEST(ParseConfigTest, QuotedBooleanNamesTheExpectedType) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "managed_gradient_accumulation": "false"})");
  EXPECT_EQ(p.key, "managed_gradient_accumulation");
  EXPECT_EQ(p.value, "\"false\"");
  EXPECT_HAS(p.rule, "JSON boolean");
  EXPECT_EQ(p.fix, "write false (a JSON boolean, no quotes)");
}

TEST(ParseConfigTest, UnknownScalingModeSuggestsTheClosest) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "gradient_accumulation_scaling": "per_step_cnt"})");
  EXPECT_EQ(p.key, "gradient_accumulation_scaling");
  EXPECT_HAS(p.rule, "\"configured\", \"per_step_count\" or \"none\"");
  EXPECT_EQ(p.fix, "did you mean \"per_step_count\"?");
}

TEST(ToStringTest, GradAccumScalingNamesMatchTheConfigValues) {
  EXPECT_STREQ(to_string(GradAccumScaling::kConfigured), "configured");
  EXPECT_STREQ(to_string(GradAccumScaling::kPerStepCount), "per_step_count");
  EXPECT_STREQ(to_string(GradAccumScaling::kNone), "none");
}

TEST(GradAccumScalingFromStringTest, NamesEveryModeInAnyCaseAndNothingElse) {
  EXPECT_EQ(grad_accum_scaling_from_string("configured"),
            GradAccumScaling::kConfigured);
  EXPECT_EQ(grad_accum_scaling_from_string("Per_Step_Count"),
            GradAccumScaling::kPerStepCount);
  EXPECT_EQ(grad_accum_scaling_from_string("none"), GradAccumScaling::kNone);
  EXPECT_EQ(grad_accum_scaling_from_string("mean"), std::nullopt);
  for (GradAccumScaling m :
       {GradAccumScaling::kConfigured, GradAccumScaling::kPerStepCount,
        GradAccumScaling::kNone})
    EXPECT_EQ(grad_accum_scaling_from_string(to_string(m)), m);
}

}  // namespace
}  // namespace zerostep
