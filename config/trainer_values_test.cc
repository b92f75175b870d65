// "auto" filled from TrainerValues by the Hugging Face integration's rules
// (Note [Trainer values] in config/trainer_values.h), through parse_config.
#include "config/trainer_values.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "config/config_test_util.h"
#include "config/keys.h"

namespace zerostep {
namespace {

using testing_config::find_key;

// Every key the integration fills, "auto" everywhere, at stage 3.
const char* const kEveryAuto = R"({
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "optimizer": {"type": "AdamW", "params": {
    "lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR", "params": {
    "warmup_min_lr": "auto", "warmup_max_lr": "auto",
    "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "fp16": {"enabled": "auto"},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {"stage": 3,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto"}
})";

TrainerValues every_value() {
  TrainerValues t;
  t.micro_batch_size = 4;
  t.gradient_accumulation_steps = 2;
  t.learning_rate = 3e-4;
  t.adam_beta1 = 0.8;
  t.adam_beta2 = 0.95;
  t.adam_epsilon = 1e-6;
  t.weight_decay = 0.1;
  t.max_grad_norm = 0.5;
  t.warmup_steps = 10;
  t.total_steps = 100;
  t.dtype = Precision::kBf16;
  t.hidden_size = 4096;
  return t;
}

std::vector<ConfigProblem> problems_of(const std::string& json, int world,
                                       const TrainerValues& t) {
  try {
    parse_config(json, world, t);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  ADD_FAILURE() << "parse_config accepted: " << json;
  return {};
}

// Each rule's value, from the trainer's fields (transformers'
// trainer_config_process and trainer_config_finalize).
TEST(TrainerValuesTest, EveryAutoIsFilledByTheIntegrationsRule) {
  const Config c = parse_config(kEveryAuto, 8, every_value());
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.train_batch_size, 8 * 4 * 2);
  EXPECT_EQ(c.gradient_clipping, 0.5);
  EXPECT_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.optimizer.beta2, 0.95);
  EXPECT_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.scheduler.warmup_min_lr, 0.0);
  ASSERT_TRUE(c.scheduler.warmup_max_lr.has_value());
  EXPECT_EQ(*c.scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 10);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_EQ(c.precision.dtype, Precision::kBf16);
  EXPECT_EQ(c.zero.reduce_bucket_size, 4096 * 4096);
  // int(0.9 * 4096 * 4096) = int(15099494.4)
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 15099494);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 40960);
  // Listed once each, in the rules' order.
  EXPECT_EQ(c.filled_auto,
            (std::vector<std::string>{
                "train_micro_batch_size_per_gpu = 4",
                "gradient_accumulation_steps = 2",
                "train_batch_size = 64",
                "gradient_clipping = 0.5",
                "optimizer.params.lr = 0.0003",
                "optimizer.params.betas = [0.8,0.95]",
                "optimizer.params.eps = 1e-06",
                "optimizer.params.weight_decay = 0.1",
                "scheduler.params.warmup_min_lr = 0",
                "scheduler.params.warmup_max_lr = 0.0003",
                "fp16.enabled = false",
                "bf16.enabled = true",
                "zero_optimization.reduce_bucket_size = 16777216",
                "zero_optimization.stage3_prefetch_bucket_size = 15099494",
                "zero_optimization.stage3_param_persistence_threshold = 40960",
                "scheduler.params.total_num_steps = 100",
                "scheduler.params.warmup_num_steps = 10",
            }));
  EXPECT_EQ(
      filled_auto_note(c),
      "ds_config \"auto\" filled with the trainer's values (Hugging "
      "Face's rules; see docs/config.md): " +
          [&] {
            std::string s;
            for (const std::string& f : c.filled_auto)
              s += (s.empty() ? "" : ", ") + f;
            return s;
          }());
}

// Each rule needs its field: left unset, the "auto" is a problem that names
// the key and the field, and nothing else of the document is refused.
TEST(TrainerValuesTest, AnAutoWhoseFieldIsUnsetNamesTheFieldToSet) {
  const std::vector<ConfigProblem> ps = problems_of(kEveryAuto, 8, {});
  // warmup_min_lr needs no field; train_batch_size waits for micro.
  const std::vector<std::pair<std::string, std::string>> want = {
      {"train_micro_batch_size_per_gpu", "micro_batch_size"},
      {"gradient_accumulation_steps", "gradient_accumulation_steps"},
      {"train_batch_size", "micro_batch_size and gradient_accumulation_steps"},
      {"gradient_clipping", "max_grad_norm"},
      {"optimizer.params.lr", "learning_rate"},
      {"optimizer.params.betas", "adam_beta1 and adam_beta2"},
      {"optimizer.params.eps", "adam_epsilon"},
      {"optimizer.params.weight_decay", "weight_decay"},
      {"scheduler.params.warmup_max_lr", "learning_rate"},
      {"scheduler.params.warmup_num_steps",
       "warmup_steps (or warmup_ratio with total_steps)"},
      {"scheduler.params.total_num_steps", "total_steps"},
      {"fp16.enabled", "dtype"},
      {"bf16.enabled", "dtype"},
      {"zero_optimization.reduce_bucket_size", "hidden_size"},
      {"zero_optimization.stage3_prefetch_bucket_size", "hidden_size"},
      {"zero_optimization.stage3_param_persistence_threshold", "hidden_size"},
  };
  EXPECT_EQ(ps.size(), want.size());
  for (const auto& [key, field] : want) {
    SCOPED_TRACE(key);
    const ConfigProblem* p = find_key(ps, key);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->value, "\"auto\"");
    EXPECT_HAS(p->rule, "Hugging Face's DeepSpeed integration fills it with");
    EXPECT_HAS(p->rule, "was not given TrainerValues::" + field);
    EXPECT_EQ(p->fix.rfind("set TrainerValues::" + field +
                               " in the trainer values given to "
                               "parse_config, or write ",
                           0),
              0u)
        << p->fix;
  }
  // The old signature is the same call without trainer values.
  try {
    parse_config(kEveryAuto, 8);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.problems().size(), want.size());
  }
}

// train_batch_size is world × micro × gas: the trainer's micro and gas, else
// the file's, with gas 1 when neither gives it.
TEST(TrainerValuesTest, TrainBatchSizeIsWorldTimesMicroTimesGas) {
  TrainerValues none;
  Config c = parse_config(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})",
      4, none);
  EXPECT_EQ(c.train_batch_size, 32);
  EXPECT_EQ(c.filled_auto, std::vector<std::string>{"train_batch_size = 32"});
  c = parse_config(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 3})", 2,
      none);
  EXPECT_EQ(c.train_batch_size, 6);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  TrainerValues t;
  t.micro_batch_size = 2;
  t.gradient_accumulation_steps = 5;
  c = parse_config(R"({"train_batch_size": "auto"})", 3, t);
  EXPECT_EQ(c.train_batch_size, 30);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 10);  // derived: 30 / 3
  // Neither the trainer nor the file gives micro.
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_batch_size": "auto", "gradient_accumulation_steps": 2})", 4,
      none);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].key, "train_batch_size");
  EXPECT_HAS(ps[0].fix,
             "set TrainerValues::micro_batch_size and "
             "gradient_accumulation_steps");
}

// fp16.enabled and bf16.enabled (and DeepSpeed's old name bfloat16) from
// the training dtype.
TEST(TrainerValuesTest, PrecisionSectionsFollowTheTrainersDtype) {
  const std::string doc = R"({"train_micro_batch_size_per_gpu": 1,
      "fp16": {"enabled": "auto", "loss_scale": 0},
      "bfloat16": {"enabled": "auto"}})";
  for (Precision p : {Precision::kFp32, Precision::kFp16, Precision::kBf16}) {
    SCOPED_TRACE(to_string(p));
    TrainerValues t;
    t.dtype = p;
    const Config c = parse_config(doc, 1, t);
    EXPECT_EQ(c.precision.dtype, p);
    EXPECT_EQ(c.filled_auto,
              (std::vector<std::string>{
                  std::string("fp16.enabled = ") +
                      (p == Precision::kFp16 ? "true" : "false"),
                  std::string("bfloat16.enabled = ") +
                      (p == Precision::kBf16 ? "true" : "false")}));
  }
}

// The hidden-size keys: reduce_bucket_size at any stage; the stage-3 sizes
// at stage 3 only, below which their "auto" is DeepSpeed's default.
TEST(TrainerValuesTest, BucketSizesComeFromTheHiddenSize) {
  const std::string zero = R"("reduce_bucket_size": "auto",
      "stage3_prefetch_bucket_size": "auto",
      "stage3_param_persistence_threshold": "auto")";
  auto doc = [&](int stage) {
    return R"({"train_micro_batch_size_per_gpu": 1,
               "zero_optimization": {"stage": )" +
           std::to_string(stage) + ", " + zero + "}}";
  };
  TrainerValues t;
  t.hidden_size = 64;
  Config c = parse_config(doc(3), 2, t);
  EXPECT_EQ(c.zero.reduce_bucket_size, 4096);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 3686);  // int(3686.4)
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 640);
  c = parse_config(doc(2), 2, t);
  EXPECT_EQ(c.zero.reduce_bucket_size, 4096);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100000);
  EXPECT_EQ(
      c.filled_auto,
      (std::vector<std::string>{
          "zero_optimization.reduce_bucket_size = 4096",
          "zero_optimization.stage3_prefetch_bucket_size = 50000000 "
          "(DeepSpeed's default: the integration fills it at stage 3 only)",
          "zero_optimization.stage3_param_persistence_threshold = 100000 "
          "(DeepSpeed's default: the integration fills it at stage 3 only)"}));
  // Below stage 3 the two need no hidden size.
  std::vector<ConfigProblem> ps = problems_of(doc(1), 2, {});
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].key, "zero_optimization.reduce_bucket_size");
  // A hidden size no bucket is made of.
  t.hidden_size = 0;
  ps = problems_of(doc(3), 2, t);
  const ConfigProblem* p = find_key(ps, "TrainerValues::hidden_size");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->value, "0");
  EXPECT_HAS(p->rule, "must be >= 1");
}

// warmup_num_steps: warmup_steps when > 0, else ceil(total × ratio); a
// filled value the scheduler refuses says it came from "auto".
TEST(TrainerValuesTest, WarmupStepsOrTheirRatioOfTheTotal) {
  const std::string doc = R"({"train_micro_batch_size_per_gpu": 1,
      "scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_num_steps": "auto", "total_num_steps": "auto"}}})";
  TrainerValues t;
  t.total_steps = 1000;
  t.warmup_ratio = 0.0333;
  EXPECT_EQ(parse_config(doc, 1, t).scheduler.warmup_num_steps, 34);
  t.warmup_steps = 7;  // > 0 wins over the ratio
  EXPECT_EQ(parse_config(doc, 1, t).scheduler.warmup_num_steps, 7);
  t.warmup_steps = 0;
  t.warmup_ratio.reset();
  const std::vector<ConfigProblem> ps = problems_of(doc, 1, t);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].key, "scheduler.params.warmup_num_steps");
  EXPECT_EQ(ps[0].value, "0");
  EXPECT_HAS(ps[0].rule, "must be a positive integer");
  EXPECT_HAS(ps[0].rule,
             "the file says \"auto\" here; parse_config filled in the "
             "trainer's value: warmup_steps = 0");
}

// The integration's fill_match: a value the file writes must equal the
// trainer's when the caller gives one (must_match), never for the
// fill-only keys; must_match false fills "auto" only.
TEST(TrainerValuesTest, WrittenValuesMustMatchTheTrainers) {
  const std::string doc = R"({"train_micro_batch_size_per_gpu": 4,
      "gradient_accumulation_steps": 2, "train_batch_size": 64,
      "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
                    "betas": [0.9, 0.999], "eps": 1e-6}},
      "bf16": {"enabled": false},
      "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}})";
  TrainerValues t = every_value();
  std::vector<ConfigProblem> ps = problems_of(doc, 8, t);
  std::vector<std::string> keys;
  for (const ConfigProblem& p : ps) keys.push_back(p.key);
  // micro 4, gas 2, world 8: train_batch_size 64 agrees; eps 1e-6 too; the
  // bucket size is fill-only.
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "gradient_clipping", "optimizer.params.lr",
                      "optimizer.params.betas", "bf16.enabled"}));
  const ConfigProblem* lr = find_key(ps, "optimizer.params.lr");
  ASSERT_NE(lr, nullptr);
  EXPECT_EQ(lr->value, "0.001");
  EXPECT_HAS(lr->rule,
             "differs from the trainer's value, learning_rate = "
             "0.0003");
  EXPECT_EQ(lr->fix,
            "write \"auto\" to take the trainer's value, or make the two "
            "agree");
  t.must_match = false;
  const Config c = parse_config(doc, 8, t);
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_TRUE(c.filled_auto.empty());
}

// An "auto" in a key the integration does not fill keeps its meaning: an
// error that says so, or DeepSpeed's default where DeepSpeed reads it so.
TEST(TrainerValuesTest, AutoWhereTheIntegrationFillsNothing) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "sub_group_size": "auto",
                                "stage3_max_live_parameters": "auto",
                                "prefetch_bucket_size": "auto"}})",
      1, [] {
        TrainerValues t = every_value();
        t.must_match = false;  // the file's micro batch is not the trainer's
        return t;
      }());
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0].key, "zero_optimization.sub_group_size");
  EXPECT_HAS(ps[0].rule,
             "\"auto\" stands for a trainer's value only in the keys Hugging "
             "Face's DeepSpeed integration fills");
  EXPECT_EQ(ps[0].fix, "write a number of elements >= 0, e.g. 1e9");
}

// Every row of the table is filled when every field is given (a rule
// without code would throw InternalError here).
TEST(TrainerValuesTest, EveryRuleHasItsValue) {
  for (const config_keys::AutoRule& r : config_keys::kAutoRules) {
    SCOPED_TRACE(r.path);
    ConfigJson doc = ConfigJson::object();
    ConfigJson* node = &doc;
    std::string path = r.path;
    size_t dot;
    while ((dot = path.find('.')) != std::string::npos) {
      node = &(*node)[path.substr(0, dot)];
      path = path.substr(dot + 1);
    }
    (*node)[path] = "auto";
    doc["zero_optimization"]["stage"] = 3;
    const config_auto::FillResult f =
        config_auto::fill_auto(&doc, every_value(), 2);
    ASSERT_EQ(f.filled.size(), 1u);
    EXPECT_EQ(f.filled[0].rfind(std::string(r.path) + " = ", 0), 0u);
    EXPECT_TRUE(f.mismatches.empty());
  }
}

}  // namespace
}  // namespace zerostep
