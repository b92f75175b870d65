#include "config/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "config/config_test_util.h"
#include "config/keys.h"

namespace zerostep {
namespace {

using testing_config::find_key;
using testing_config::only_problem;
using testing_config::problems_of;

// --- defaults ---

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

TEST(ParseConfigTest, WorldSizeBelowOneIsAProblem) {
  ConfigProblem p = only_problem(R"({"train_micro_batch_size_per_gpu": 4})", 0);
  EXPECT_EQ(p.key, "world_size");
  EXPECT_EQ(p.value, "0");
  EXPECT_HAS(p.rule, ">= 1");
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

// --- unknown keys ---

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

// A config at `stage` with overlap_comm on, managed or not, with or without
// reduce_once_per_step, for 2 ranks.
Config overlap_config(int stage, bool managed, bool once) {
  return parse_config(
      std::string(R"({"train_micro_batch_size_per_gpu": 1,
          "managed_gradient_accumulation": )") +
          (managed ? "true" : "false") +
          R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
          R"(, "overlap_comm": true, "reduce_once_per_step": )" +
          (once ? "true" : "false") + "}}",
      2);
}

// Note [Reduce once per step]: stage 2 reduces the window in the boundary
// backward (managed: overlap_comm launches its buckets there) or in step()
// (unmanaged: nothing to overlap, so the key is listed as not acted on).
TEST(ParseConfigTest, OverlapCommWithReduceOncePerStepActsOnlyInManagedMode) {
  const auto parse = [](bool managed, bool once) {
    return overlap_config(2, managed, once);
  };
  const std::vector<std::string> overlap = {"zero_optimization.overlap_comm"};
  EXPECT_EQ(parse(false, true).ignored_keys, overlap);
  EXPECT_TRUE(parse(true, true).ignored_keys.empty());
  EXPECT_TRUE(parse(false, false).ignored_keys.empty());
  EXPECT_TRUE(parse(false, true).zero.overlap_comm);
}

// Stage 3 acts on overlap_comm with the per-backward reduce-scatters (Note
// [Stage 3 reduce-scatter in flight] in zero/stage3.h); with
// reduce_once_per_step there are none, in either mode.
TEST(ParseConfigTest, Stage3OverlapCommIsNotActedOnWithReduceOncePerStep) {
  const auto ignored = [](bool managed, bool once) {
    return overlap_config(3, managed, once).ignored_keys;
  };
  const std::vector<std::string> overlap = {"zero_optimization.overlap_comm"};
  EXPECT_EQ(ignored(false, true), overlap);
  EXPECT_EQ(ignored(true, true), overlap);
  EXPECT_TRUE(ignored(false, false).empty());
  EXPECT_TRUE(ignored(true, false).empty());
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

// Nesting deep enough to overflow the stack of anything that copies or
// prints the value, inside a section zerostep ignores: refused before
// parsing, in a short message.
TEST(ParseConfigTest, DeepNestingIsRefusedBeforeParsing) {
  const size_t deep = 200000;
  const std::string text = R"({"train_micro_batch_size_per_gpu": 2,
      "tensorboard": {"enabled": false, "x": )" +
                           std::string(deep, '[') + std::string(deep, ']') +
                           "}}";
  try {
    parse_config(text, 1);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.problems().size(), 1u);
    EXPECT_EQ(e.problems()[0].key, "<document>");
    EXPECT_HAS(e.problems()[0].rule, "nest 200002 levels deep; at most 100");
    EXPECT_LT(std::string(e.what()).size(), 400u);
  }
  // At the limit (two objects and 98 arrays) it parses; one level more is
  // refused.
  auto nested = [](size_t arrays) {
    return R"({"train_micro_batch_size_per_gpu": 2,
        "tensorboard": {"enabled": false, "x": )" +
           std::string(arrays, '[') + std::string(arrays, ']') + "}}";
  };
  EXPECT_NO_THROW(parse_config(nested(kMaxNestingDepth - 2), 1));
  EXPECT_THROW(parse_config(nested(kMaxNestingDepth - 1), 1), ConfigError);
}

// A 50 MB value under an unknown key: the message names the key and cuts
// the value.
TEST(ParseConfigTest, HugeValuesAndKeysAreCutInTheMessage) {
  const std::string text =
      R"({"train_micro_batch_size_per_gpu": 2, "junk": ")" +
      std::string(50u << 20, 'v') + R"(", ")" + std::string(1u << 20, 'k') +
      R"(": 1})";
  try {
    parse_config(text, 1);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 2000u) << what.substr(0, 300);
    EXPECT_HAS(what, "junk");
    EXPECT_HAS(what, "bytes)");
    ASSERT_EQ(e.problems().size(), 2u);
  }
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
          "optimizer.params.lr", "zero_optimization.stage", "scheduler.type"}) {
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

// --- null at the top level (issue 14 item 2) ---

// DeepSpeed reads top-level keys with dict.get(): null is its default
// (None) where its code treats None as absent, and an error where its
// arithmetic then fails.
TEST(ParseConfigTest, NullAtTheTopLevelIsTheDefaultWhereDeepSpeedTakesIt) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "steps_per_print": null,
          "communication_data_type": null, "sparse_gradients": null,
          "prescale_gradients": null})",
      1);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_EQ(c.ignored_keys, (std::vector<std::string>{"communication_data_type",
                                                      "sparse_gradients"}));
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": null,
          "gradient_predivide_factor": null, "gradient_allreduce_op": null})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].key, "gradient_clipping");
  EXPECT_HAS(ps[0].rule, "must be a JSON number");
  EXPECT_EQ(ps[1].key, "gradient_predivide_factor");
  EXPECT_EQ(ps[1].fix, "write 1.0 (no pre-division), or remove the key");
  EXPECT_EQ(ps[2].key, "gradient_allreduce_op");
  for (const ConfigProblem& p : ps) EXPECT_EQ(p.value, "null");
}

// --- other frameworks' names (issue 14 item 6) ---

TEST(ParseConfigTest, OtherFrameworksNamesGetTheDeepSpeedName) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1, "max_grad_norm": 1.0,
          "zero_stage": 2, "learning_rate": 1e-4,
          "zero_optimization": {"comm_overlap": true}})");
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].key, "max_grad_norm");
  EXPECT_EQ(ps[0].rule, "is not a ds_config key zerostep knows");
  EXPECT_EQ(ps[0].fix, "did you mean \"gradient_clipping\"?");
  EXPECT_EQ(ps[1].fix, "did you mean \"zero_optimization.stage\"?");
  EXPECT_EQ(ps[2].fix, "did you mean \"optimizer.params.lr\"?");
  EXPECT_EQ(ps[3].key, "zero_optimization.comm_overlap");
  EXPECT_EQ(ps[3].fix, "did you mean \"overlap_comm\"?");
}

// --- harmless keys, and the same keys switched on (issue 14 item 7) ---

TEST(ParseConfigTest, LoggingAndSwitchedOffFeaturesAreIgnored) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "comms_logger": {"enabled": true, "verbose": false},
          "comms_config": {}, "monitor_config": {},
          "cuda_visible_devices": "0,1",
          "compile": {"deepcompile": false, "offload_activation": false},
          "tensor_parallel": {"autotp_size": 1, "tp": {"tp_size": 1}}})",
      1);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{"comms_logger", "comms_config",
                                      "monitor_config", "cuda_visible_devices",
                                      "compile", "tensor_parallel"}));
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "compile": {"deepcompile": true},
          "tensor_parallel": {"autotp_size": 2}})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "compile");
  EXPECT_EQ(ps[0].value, R"({"deepcompile":true})");
  EXPECT_EQ(ps[0].rule,
            "changes training; zerostep does not implement it (compiles the "
            "model (torch.compile, DeepCompile))");
  EXPECT_EQ(ps[0].fix, "remove it or set enabled and deepcompile to false");
  EXPECT_EQ(ps[1].key, "tensor_parallel");
  EXPECT_HAS(ps[1].rule, "AutoTP splits layers over ranks");
}

// "auto" in a key accepted only at its no-op value asks for that value; in
// a key ignored whatever its value it is not checked.
TEST(ParseConfigTest, AutoInKeysZerostepDoesNotImplement) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage3_model_persistence_threshold": "auto"}})",
      1);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{
                "zero_optimization.stage3_model_persistence_threshold"}));
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "bf16": {"enabled": true, "check_grad_overflow": "auto"}})");
  EXPECT_EQ(p.key, "bf16.check_grad_overflow");
  EXPECT_EQ(p.value, "\"auto\"");
  EXPECT_EQ(p.rule,
            "\"auto\" stands for a trainer's value only in the keys Hugging "
            "Face's DeepSpeed integration fills (docs/config.md lists them), "
            "and bf16.check_grad_overflow is not one of them");
  EXPECT_EQ(p.fix, "remove it or set it to false");
}

// A document whose zero_optimization section is stage 3 plus `zero`.
Config stage3_config(const std::string& zero) {
  return parse_config(R"({"train_micro_batch_size_per_gpu": 1,
                          "zero_optimization": {"stage": 3, )" +
                          zero + "}}",
                      1);
}

// Stage 3 prefetch (Note [Stage 3 prefetch] in zero/stage3.h): read under
// either name, 0 turns it off, a negative size names the key. "auto" under
// its stage3_ name is the Hugging Face integration's (Note [Trainer
// values]): from the hidden size, which this caller does not give; under
// the other name DeepSpeed's default.
TEST(ParseConfigTest, PrefetchBucketSizeIsReadAndAutoKeepsTheDefault) {
  EXPECT_EQ(stage3_config(R"("stage": 3)").zero.stage3_prefetch_bucket_size,
            50000000);
  Config c = stage3_config(R"("prefetch_bucket_size": "auto")");
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_TRUE(c.ignored_keys.empty());
  ConfigProblem hf = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3,
                                "stage3_prefetch_bucket_size": "auto"}})");
  EXPECT_EQ(hf.key, "zero_optimization.stage3_prefetch_bucket_size");
  EXPECT_HAS(hf.fix, "set TrainerValues::hidden_size");
  EXPECT_EQ(stage3_config(R"("prefetch_bucket_size": 0)")
                .zero.stage3_prefetch_bucket_size,
            0);
  EXPECT_EQ(stage3_config(R"("stage3_prefetch_bucket_size": 1.5e6)")
                .zero.stage3_prefetch_bucket_size,
            1500000);
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "prefetch_bucket_size": -1}})");
  EXPECT_EQ(p.key, "zero_optimization.prefetch_bucket_size");
  EXPECT_EQ(p.rule, "must be >= 0");
}

// Stage 3's reuse distance and live-parameter bound (Note [Stage 3 reuse
// distance] in zero/stage3.h): read under either name, DeepSpeed's 1e9 by
// default and for "auto", a whole number >= 0 otherwise.
TEST(ParseConfigTest, ReuseDistanceAndLiveParametersAreRead) {
  Config c = stage3_config(R"("stage": 3)");
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  c = stage3_config(R"("stage3_max_reuse_distance": "auto",
                "max_live_parameters": "auto")");
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_TRUE(c.ignored_keys.empty());
  c = stage3_config(
      R"("max_reuse_distance": 0, "stage3_max_live_parameters": 3e7)");
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 0);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 30000000);
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "max_reuse_distance": -1,
                                "stage3_max_live_parameters": 1.5}})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "zero_optimization.max_reuse_distance");
  EXPECT_EQ(ps[0].rule, "must be >= 0");
  EXPECT_EQ(ps[1].key, "zero_optimization.stage3_max_live_parameters");
  EXPECT_EQ(ps[1].value, "1.5");
}

// --- every key zerostep does not implement (issue 14 item 8) ---

// A document that puts `value` at `path`, inside whatever its section needs.
std::string document_with(const std::string& path, const std::string& value) {
  nlohmann::ordered_json doc = {{"train_micro_batch_size_per_gpu", 1}};
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t dot = path.find('.', at);
    parts.push_back(path.substr(at, dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  if (parts[0] == "optimizer") doc["optimizer"]["type"] = "AdamW";
  if (parts.size() > 2 && parts[1] == "offload_param") {
    doc["zero_optimization"]["stage"] = 3;  // read at stage 3 only
    doc["zero_optimization"]["offload_param"]["device"] = "cpu";
  }
  nlohmann::ordered_json* at = &doc;
  for (const std::string& p : parts) at = &(*at)[p];
  *at = nlohmann::ordered_json::parse(value);
  return doc.dump();
}

// For each key accepted only at its no-op value: one such value and one
// that changes training.
const std::map<std::string, std::pair<std::string, std::string>>&
no_op_and_harmful_values() {
  static const auto* const kValues = new std::map<
      std::string, std::pair<std::string, std::string>>{
      {"communication_data_type", {R"("fp32")", R"("bf16")"}},
      {"gradient_allreduce_op", {R"("mean")", R"("sum")"}},
      {"sparse_gradients", {"null", "true"}},
      {"sequence_parallel_size", {"1", "2"}},
      {"optimizer.params.amsgrad", {"false", "true"}},
      {"optimizer.params.maximize", {"false", "true"}},
      {"optimizer.params.fp32_optimizer_states", {"true", "false"}},
      {"optimizer.params.nesterov", {"false", "true"}},
      {"optimizer.params.dampening", {"0", "0.1"}},
      {"fp16.auto_cast", {"false", "true"}},
      {"fp16.fp16_master_weights_and_grads", {"false", "true"}},
      {"bf16.check_grad_overflow", {"false", "true"}},
      {"bf16.bf16_master_weights_and_grads", {"false", "true"}},
      {"bf16.bf16_optimizer_states", {"false", "true"}},
      {"amp",
       {R"({"enabled": false, "opt_level": "O1"})", R"({"enabled": true})"}},
      {"torch_autocast", {R"({"enabled": false})", R"({"enabled": true})"}},
      {"data_types.buffer_dtype", {"null", R"("bf16")"}},
      {"zero_optimization.load_from_fp32_weights", {"true", "false"}},
      {"zero_optimization.zero_quantized_weights", {"false", "true"}},
      {"zero_optimization.zero_quantized_nontrainable_weights",
       {"false", "true"}},
      {"zero_optimization.zero_quantized_gradients", {"false", "true"}},
      {"zero_optimization.zenflow", {"null", R"({"topk_ratio": 0.1})"}},
      {"tensor_parallel", {R"({"autotp_size": 1})", R"({"autotp_size": 4})"}},
      {"expert_parallel",
       {R"({"enabled": false})", R"({"enabled": true, "autoep_size": 4})"}},
      {"hybrid_engine", {R"({"enabled": false})", R"({"enabled": true})"}},
      {"autotuning", {R"({"enabled": false})", R"({"enabled": true})"}},
      {"data_efficiency",
       {R"({"enabled": false})",
        R"({"data_sampling": {"curriculum_learning": {"enabled": true}}})"}},
      {"curriculum_learning",
       {R"({"enabled": false})", R"({"enabled": true})"}},
      {"elasticity", {R"({"enabled": false})", R"({"enabled": true})"}},
      {"compression_training",
       {R"({"layer_reduction": {"enabled": false}})",
        R"({"layer_reduction": {"enabled": true}})"}},
      {"eigenvalue", {R"({"enabled": false})", R"({"enabled": true})"}},
      {"progressive_layer_drop",
       {R"({"enabled": false})", R"({"enabled": true})"}},
      {"quantize_training", {R"({"enabled": false})", R"({"enabled": true})"}},
      {"weight_quantization",
       {R"({"enabled": false})",
        R"({"quantized_initialization": {"num_bits": 8}})"}},
      {"compile", {R"({"deepcompile": false})", R"({"enabled": true})"}},
  };
  return *kValues;
}

// Keys with messages of their own, tested with their sections.
const std::set<std::string> kOwnMessage = {"pipeline",
                                           "pipeline_parallel_size"};

TEST(KeyTableTest, EveryConditionalKeyIsTestedHere) {
  std::set<std::string> conditional;
  for (const config_keys::DeepSpeedKey& k : config_keys::kDeepSpeedKeys)
    if (k.treatment == config_keys::Treatment::kIgnoredWhen &&
        kOwnMessage.count(k.path) == 0)
      conditional.insert(k.path);
  std::set<std::string> tested;
  for (const auto& entry : no_op_and_harmful_values())
    tested.insert(entry.first);
  EXPECT_EQ(conditional, tested);
}

void expect_rejected(const config_keys::DeepSpeedKey& k,
                     const std::string& value) {
  SCOPED_TRACE(std::string(k.path) + " = " + value);
  std::vector<ConfigProblem> ps = problems_of(document_with(k.path, value));
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].key, k.path);
  EXPECT_EQ(ps[0].value, nlohmann::ordered_json::parse(value).dump());
  EXPECT_EQ(ps[0].rule,
            k.rule != nullptr
                ? std::string(k.rule)
                : "changes training; zerostep does not implement it (" +
                      std::string(k.why) + ")");
  EXPECT_EQ(ps[0].fix, k.fix);
}

void expect_ignored(const std::string& path, const std::string& value) {
  SCOPED_TRACE(path + " = " + value);
  Config c = parse_config(document_with(path, value), 1);
  EXPECT_NE(std::find(c.ignored_keys.begin(), c.ignored_keys.end(), path),
            c.ignored_keys.end());
}

TEST(KeyTableTest, EachKeyIsIgnoredOrRejectedAsTheTableSays) {
  for (const config_keys::DeepSpeedKey& k : config_keys::kDeepSpeedKeys) {
    if (kOwnMessage.count(k.path) != 0) continue;
    switch (k.treatment) {
      case config_keys::Treatment::kRead:
        break;
      case config_keys::Treatment::kIgnored:
        // Not checked: any value is harmless.
        expect_ignored(k.path, R"({"any": ["value"]})");
        break;
      case config_keys::Treatment::kIgnoredWhen: {
        const auto& [no_op, harmful] = no_op_and_harmful_values().at(k.path);
        expect_ignored(k.path, no_op);
        expect_rejected(k, harmful);
        break;
      }
      case config_keys::Treatment::kRejected:
        expect_rejected(k, R"({"mode": "fixed"})");
        break;
    }
  }
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

}  // namespace
}  // namespace zerostep
