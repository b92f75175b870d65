#include "engine/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace {

// The problems parse_config reports; fails the test when it does not throw.
std::vector<ConfigProblem> problems_of(const std::string& json,
                                       int world_size = 1) {
  try {
    parse_config(json, world_size);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  ADD_FAILURE() << "parse_config accepted: " << json;
  return {};
}

// The one problem reported for `json`; fails the test unless exactly one.
ConfigProblem only_problem(const std::string& json, int world_size = 1) {
  std::vector<ConfigProblem> ps = problems_of(json, world_size);
  EXPECT_EQ(ps.size(), 1u) << json;
  if (ps.empty()) return {};
  return ps[0];
}

const ConfigProblem* find_key(const std::vector<ConfigProblem>& ps,
                              const std::string& key) {
  for (const ConfigProblem& p : ps) {
    if (p.key == key) return &p;
  }
  return nullptr;
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_TRUE(has(haystack, needle)) \
      << "'" << needle << "' not in: " << haystack

// --- defaults and batch arithmetic ---

TEST(ParseConfigTest, MinimalConfigGetsDocumentedDefaults) {
  Config c = parse_config(R"({"train_micro_batch_size_per_gpu": 4})", 2);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_TRUE(c.managed_gradient_accumulation);
  EXPECT_EQ(c.gradient_accumulation_scaling, GradAccumScaling::kConfigured);
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 0.0);
  EXPECT_EQ(c.zero.stage, 0);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_TRUE(c.ignored_keys.empty());
}

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
  EXPECT_HAS(p.fix, "multiple of 12, e.g. 24 or 36");
}

TEST(ParseConfigTest, TrainBatchSizeMustDivideByGasTimesWorld) {
  ConfigProblem p = only_problem(
      R"({"train_batch_size": 10, "gradient_accumulation_steps": 4})", 2);
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_HAS(p.rule, "4 × 2 = 8");
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

TEST(ParseConfigTest, WorldSizeBelowOneIsAProblem) {
  ConfigProblem p = only_problem(R"({"train_micro_batch_size_per_gpu": 4})", 0);
  EXPECT_EQ(p.key, "world_size");
  EXPECT_EQ(p.value, "0");
  EXPECT_HAS(p.rule, ">= 1");
}

// --- "auto" ---

TEST(ParseConfigTest, AutoTrainBatchSizeSaysWhichNumberToWrite) {
  ConfigProblem p = only_problem(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})",
      4);
  EXPECT_EQ(p.key, "train_batch_size");
  EXPECT_EQ(p.value, "\"auto\"");
  EXPECT_HAS(p.rule, "\"auto\"");
  EXPECT_HAS(p.rule, "Hugging Face");
  EXPECT_EQ(p.fix, "write 32 (= micro 4 × gas 2 × world 4)");
}

TEST(ParseConfigTest, AutoMicroAndGasAreDerivedFromTheOthers) {
  ConfigProblem micro = only_problem(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": 2})",
      4);
  EXPECT_EQ(micro.key, "train_micro_batch_size_per_gpu");
  EXPECT_EQ(micro.fix, "write 4 (= train_batch_size 32 / (gas 2 × world 4))");

  ConfigProblem gas = only_problem(
      R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": "auto"})",
      4);
  EXPECT_EQ(gas.key, "gradient_accumulation_steps");
  EXPECT_EQ(gas.fix, "write 2 (= train_batch_size 32 / (micro 4 × world 4))");
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

TEST(ParseConfigTest, AutoInOtherKeysAsksForAValueOfTheRightType) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
          "zero_optimization": {"overlap_comm": "auto"}})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].key, "gradient_clipping");
  EXPECT_HAS(ps[0].fix, "write a number >= 0");
  EXPECT_EQ(ps[1].key, "optimizer.params.lr");
  EXPECT_HAS(ps[1].fix, "write a number >= 0");
  EXPECT_EQ(ps[2].key, "zero_optimization.overlap_comm");
  EXPECT_HAS(ps[2].fix, "write true or false");
  for (const ConfigProblem& p : ps) EXPECT_HAS(p.rule, "\"auto\"");
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

TEST(ParseConfigTest, MisspeltManagedKeyIsRejectedWithDidYouMean) {
  // Silently keeping managed mode here would break the caller's boundary.
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "managed_gradient_accumulaton": false})");
  EXPECT_EQ(p.key, "managed_gradient_accumulaton");
  EXPECT_EQ(p.value, "false");
  EXPECT_HAS(p.rule, "not a ds_config key");
  EXPECT_EQ(p.fix, "did you mean \"managed_gradient_accumulation\"?");
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

// --- unknown keys ---

TEST(ParseConfigTest, UnknownKeyFarFromAnyKnownKeySaysToRemoveIt) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1, "colour": "blue"})");
  EXPECT_EQ(p.key, "colour");
  EXPECT_EQ(p.value, "\"blue\"");
  EXPECT_HAS(p.fix, "remove it");
}

TEST(ParseConfigTest, DidYouMeanIgnoresLetterCase) {
  // Keys are case-sensitive (as in DeepSpeed), so the batch key is not read:
  // the typo and the missing batch size are both reported.
  std::vector<ConfigProblem> ps =
      problems_of(R"({"Train_Micro_Batch_Size_Per_GPU": 1})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "Train_Micro_Batch_Size_Per_GPU");
  EXPECT_EQ(ps[0].fix, "did you mean \"train_micro_batch_size_per_gpu\"?");
  EXPECT_EQ(ps[1].key, "train_batch_size");
  ps = problems_of(R"({"train_batch_size": 1, "TensorBoard": {}})");
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].fix, "did you mean \"tensorboard\"?");
}

// --- optimizer ---

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
  EXPECT_THROW(
      parse_config(
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

// --- clipping, printing ---

TEST(ParseConfigTest, ClippingAndStepsPerPrintRanges) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
          "steps_per_print": 100})",
      1);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 100);
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": -1,
          "steps_per_print": 0})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "gradient_clipping");
  EXPECT_HAS(ps[0].rule, ">= 0");
  EXPECT_EQ(ps[1].key, "steps_per_print");
  EXPECT_HAS(ps[1].rule, ">= 1");
}

// --- zero_optimization ---

TEST(ParseConfigTest, ZeroSectionParsesAndAcceptsFloatBucketSizes) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "overlap_comm": true,
            "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8,
            "contiguous_gradients": false}})",
      1);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500000000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200000000);
  EXPECT_FALSE(c.zero.contiguous_gradients);
}

TEST(ParseConfigTest, ZeroValuesAreChecked) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 4, "reduce_bucket_size": 1.5,
            "allgather_bucket_size": 0, "overlap_com": true}})");
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].key, "zero_optimization.stage");
  EXPECT_EQ(ps[0].value, "4");
  EXPECT_HAS(ps[0].rule, "0, 1, 2 or 3");
  EXPECT_EQ(ps[1].key, "zero_optimization.reduce_bucket_size");
  EXPECT_HAS(ps[1].rule, "whole number");
  EXPECT_EQ(ps[2].key, "zero_optimization.allgather_bucket_size");
  EXPECT_HAS(ps[2].rule, "positive");
  EXPECT_EQ(ps[3].key, "zero_optimization.overlap_com");
  EXPECT_EQ(ps[3].fix, "did you mean \"overlap_comm\"?");
}

TEST(ParseConfigTest, OffloadSectionsAreParsed) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "sub_group_size": 4096,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme",
                                  "pin_memory": true, "buffer_count": 3,
                                  "fast_init": false},
            "offload_param": {"device": "cpu"}}})",
      1);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero.offload_optimizer.nvme_path, "/nvme");
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 3);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.zero.sub_group_size, 4096);
  EXPECT_EQ(c.ignored_keys, (std::vector<std::string>{
                                "zero_optimization.offload_optimizer.fast_init"}));
}

TEST(ParseConfigTest, NvmeNeedsAPathForOptimizerAndParameters) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3,
            "offload_optimizer": {"device": "nvme"},
            "offload_param": {"device": "nvme"}}})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "zero_optimization.offload_optimizer.nvme_path");
  EXPECT_HAS(ps[0].rule, "required");
  EXPECT_EQ(ps[1].key, "zero_optimization.offload_param.nvme_path");
  EXPECT_HAS(ps[1].rule, "required");
}

TEST(ParseConfigTest, ParameterOffloadToNvmeIsAccepted) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": "/x",
                              "buffer_count": 3}}})",
      1);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(c.zero.offload_param.nvme_path, "/x");
  EXPECT_EQ(c.zero.offload_param.buffer_count, 3);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNone);
}

TEST(ParseConfigTest, LegacyCpuOffloadMeansOptimizerOffloadToCpu) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 2, "cpu_offload": true}})",
      1);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
}

TEST(ParseConfigTest, OffloadProblemsNameKeyRuleAndFix) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 1,
            "offload_optimizer": {"device": "disk", "buffer_count": 1,
                                  "nvme_pth": "/x"},
            "offload_param": {"device": "cpu"}}})");
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].key, "zero_optimization.offload_optimizer.device");
  EXPECT_EQ(ps[0].value, "\"disk\"");
  EXPECT_EQ(ps[1].key, "zero_optimization.offload_optimizer.buffer_count");
  EXPECT_EQ(ps[2].key, "zero_optimization.offload_optimizer.nvme_pth");
  EXPECT_HAS(ps[2].fix, "nvme_path");
  EXPECT_EQ(ps[3].key, "zero_optimization.offload_param.device");
  EXPECT_HAS(ps[3].rule, "stage 3");
}

TEST(ParseConfigTest, OptimizerOffloadNeedsAPartitioningStage) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 0, "cpu_offload": true}})");
  EXPECT_EQ(p.key, "zero_optimization.cpu_offload");
  EXPECT_HAS(p.rule, "stage 1, 2 or 3");
}

TEST(ParseConfigTest, OffloadDeviceNoneIsIgnored) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 2,
            "offload_optimizer": {"device": "none"}, "sub_group_size": 1e9}})",
      1);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{"zero_optimization.offload_optimizer"}));
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNone);
}

// --- sections that must not be silently ignored ---

TEST(ParseConfigTest, SchedulerSectionIsParsed) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_num_steps": 10, "total_num_steps": 100,
            "warmup_max_lr": 0.01, "warmup_type": "linear"}}})",
      1);
  EXPECT_EQ(c.scheduler.type, LrScheduleSpec::Type::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 10);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_TRUE(c.ignored_keys.empty());
}

TEST(ParseConfigTest, SchedulerProblemsJoinTheOthers) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "scheduler": {"type": "WarmupLR",
                        "params": {"warmup_num_step": 10}}})");
  EXPECT_EQ(p.key, "scheduler.params.warmup_num_step");
  EXPECT_HAS(p.fix, "warmup_num_steps");
}

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

// --- unmanaged-mode rules ---

TEST(ParseConfigTest, PipelineWithUnmanagedModeHasItsOwnMessage) {
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "pipeline": {"stages": 2},
          "managed_gradient_accumulation": false})");
  EXPECT_EQ(p.key, "pipeline");
  EXPECT_EQ(p.value, R"({"stages":2})");
  EXPECT_HAS(p.rule, "owns the micro-batch schedule");
  EXPECT_HAS(p.rule, "caller-owned");
  EXPECT_HAS(p.fix, "remove the pipeline");
  EXPECT_HAS(p.fix, "set managed_gradient_accumulation to true");
}

TEST(ParseConfigTest, PipelineInManagedModeIsNotSupported) {
  ConfigProblem p =
      only_problem(R"({"train_micro_batch_size_per_gpu": 1, "pipeline": {}})");
  EXPECT_EQ(p.key, "pipeline");
  EXPECT_HAS(p.rule, "pipeline parallelism is not supported by zerostep");
  ConfigProblem size = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1, "pipeline_parallel_size": 2,
          "managed_gradient_accumulation": false})");
  EXPECT_EQ(size.key, "pipeline_parallel_size");
  EXPECT_HAS(size.rule, "owns the micro-batch schedule");
}

TEST(ParseConfigTest, OverlapCommWithStage0Or1InUnmanagedModeIsRejected) {
  for (int stage : {0, 1}) {
    ConfigProblem p = only_problem(
        R"({"train_micro_batch_size_per_gpu": 1,
            "managed_gradient_accumulation": false,
            "zero_optimization": {"stage": )" +
        std::to_string(stage) + R"(, "overlap_comm": true}})");
    EXPECT_EQ(p.key, "zero_optimization.overlap_comm") << stage;
    EXPECT_EQ(p.value, "true");
    EXPECT_HAS(p.rule, "only inside step()");
    EXPECT_HAS(p.rule, "stage " + std::to_string(stage));
    EXPECT_HAS(p.fix, "overlap_comm to false");
    EXPECT_HAS(p.fix, "stage 2 or 3");
  }
}

TEST(ParseConfigTest, OverlapCommIsFineInManagedModeOrWithStage2) {
  EXPECT_NO_THROW(parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 1, "overlap_comm": true}})",
      1));
  EXPECT_NO_THROW(parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "managed_gradient_accumulation": false,
          "zero_optimization": {"stage": 2, "overlap_comm": true}})",
      1));
}

// --- documents ---

TEST(ParseConfigTest, SyntaxErrorNamesLineAndColumn) {
  ConfigProblem p = only_problem("{\n  \"train_batch_size\": 8,\n}");
  EXPECT_EQ(p.key, "<document>");
  EXPECT_HAS(p.rule, "line 3");
  EXPECT_HAS(p.rule, "column");
  EXPECT_HAS(p.fix, "trailing commas");
}

TEST(ParseConfigTest, DocumentMustBeAnObject) {
  ConfigProblem p = only_problem("[1, 2]");
  EXPECT_EQ(p.key, "<document>");
  EXPECT_EQ(p.value, "[1,2]");
  EXPECT_HAS(p.rule, "JSON object");
}

TEST(ParseConfigTest, EveryProblemIsReportedAtOnce) {
  try {
    parse_config(
        R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2,
            "managed_gradient_accumulaton": false,
            "optimizer": {"type": "AdamW", "params": {"lr": -1}},
            "zero_optimization": {"stage": 7},
            "scheduler": {"type": "WarmupLRR", "params": {}}})",
        4);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::vector<ConfigProblem>& ps = e.problems();
    ASSERT_EQ(ps.size(), 5u);
    for (const char* key :
         {"train_batch_size", "managed_gradient_accumulaton",
          "optimizer.params.lr", "zero_optimization.stage",
          "scheduler.type"}) {
      EXPECT_NE(find_key(ps, key), nullptr) << key;
    }
    std::string what = e.what();
    EXPECT_HAS(what, "5 problems");
    EXPECT_HAS(what, "did you mean \"managed_gradient_accumulation\"?");
  }
}

TEST(ParseConfigTest, RealisticDeepSpeedConfigLoadsAndListsIgnoredKeysOnce) {
  Config c = parse_config(R"({
    "train_batch_size": 64,
    "gradient_accumulation_steps": 4,
    "steps_per_print": 50,
    "wall_clock_breakdown": false,
    "tensorboard": {"enabled": true, "output_path": "runs/", "job_name": "x"},
    "flops_profiler": {"enabled": false, "profile_step": 1},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 2e-5, "betas": [0.9, 0.999], "eps": 1e-8,
                             "weight_decay": 0.01, "torch_adam": true}},
    "gradient_clipping": 1.0,
    "fp16": {"enabled": false, "loss_scale": 0, "initial_scale_power": 16},
    "zero_optimization": {
      "stage": 2,
      "allgather_partitions": true,
      "allgather_bucket_size": 2e8,
      "overlap_comm": true,
      "reduce_scatter": true,
      "reduce_bucket_size": 2e8,
      "contiguous_gradients": true,
      "round_robin_gradients": true
    },
    "activation_checkpointing": {"partition_activations": false},
    "wandb": {"enabled": false}
  })",
                          8);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  EXPECT_EQ(c.steps_per_print, 50);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200000000);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-5);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{"wall_clock_breakdown", "tensorboard",
                                      "flops_profiler",
                                      "optimizer.params.torch_adam", "fp16",
                                      "zero_optimization.allgather_partitions",
                                      "zero_optimization.reduce_scatter",
                                      "zero_optimization.round_robin_gradients",
                                      "activation_checkpointing", "wandb"}));
}

// --- files ---

class LoadConfigFileTest : public ::testing::Test {
 protected:
  std::string write_temp(const std::string& name, const std::string& text) {
    std::string path = ::testing::TempDir() + "zerostep_config_test_" + name;
    std::ofstream(path) << text;
    paths_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const std::string& p : paths_) std::remove(p.c_str());
  }
  std::vector<std::string> paths_;
};

TEST_F(LoadConfigFileTest, MissingFileIsAnIoErrorNamingThePath) {
  const std::string path = ::testing::TempDir() + "zerostep_no_such_file.json";
  try {
    load_config_file(path, 1);
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    std::string what = e.what();
    EXPECT_HAS(what, "cannot read ds_config file '" + path + "'");
    EXPECT_HAS(what, "No such file or directory");
  }
}

TEST_F(LoadConfigFileTest, DirectoryIsAnIoError) {
  EXPECT_THROW(load_config_file(::testing::TempDir(), 1), IoError);
}

TEST_F(LoadConfigFileTest, ValidFileParses) {
  std::string path = write_temp(
      "valid.json",
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
          "tensorboard": {"enabled": true}})");
  Config c = load_config_file(path, 2);
  EXPECT_EQ(c.train_batch_size, 12);
  EXPECT_EQ(c.ignored_keys, (std::vector<std::string>{"tensorboard"}));
}

TEST_F(LoadConfigFileTest, InvalidFileMessageStartsWithThePath) {
  std::string path = write_temp(
      "invalid.json",
      R"({"train_micro_batch_size_per_gpu": 2, "managed_gradient_accumulaton": false})");
  try {
    load_config_file(path, 1);
    FAIL() << "no ConfigError";
  } catch (const ConfigError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.rfind("invalid ds_config '" + path + "': 1 problem", 0), 0u)
        << what;
    ASSERT_EQ(e.problems().size(), 1u);
    EXPECT_EQ(e.problems()[0].key, "managed_gradient_accumulaton");
  }
}

TEST(ToStringTest, NamesMatchTheConfigValues) {
  EXPECT_STREQ(to_string(GradAccumScaling::kConfigured), "configured");
  EXPECT_STREQ(to_string(GradAccumScaling::kPerStepCount), "per_step_count");
  EXPECT_STREQ(to_string(GradAccumScaling::kNone), "none");
  EXPECT_STREQ(to_string(OptimizerType::kAdam), "Adam");
  EXPECT_STREQ(to_string(OptimizerType::kAdamW), "AdamW");
  EXPECT_STREQ(to_string(OptimizerType::kSGD), "SGD");
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

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
