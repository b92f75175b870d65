#include "config/keys.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace zerostep {
namespace config_keys {
namespace {

using Json = nlohmann::ordered_json;

// A key listed twice would be decided by whichever row is found first.
TEST(ConfigKeysTest, EachKeyHasOneRow) {
  std::set<std::string> seen;
  for (const DeepSpeedKey& k : kDeepSpeedKeys)
    EXPECT_TRUE(seen.insert(k.path).second) << k.path;
}

TEST(ConfigKeysTest, EveryRowSaysWhyAndEveryRejectionHowToFixIt) {
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    SCOPED_TRACE(k.path);
    ASSERT_NE(k.why, nullptr);
    EXPECT_STRNE(k.why, "");
    const bool when = k.treatment == Treatment::kIgnoredWhen;
    EXPECT_EQ(k.harmless != nullptr, when);
    EXPECT_EQ(k.harmless_when != nullptr, when);
    const bool can_reject = when || k.treatment == Treatment::kRejected;
    EXPECT_EQ(k.fix != nullptr, can_reject);
    if (!can_reject) {
      EXPECT_EQ(k.rule, nullptr);
    }
    // The table is printed as Markdown.
    EXPECT_EQ(std::string(k.why).find('|'), std::string::npos);
  }
}

TEST(ConfigKeysTest, AliasesNameARowOfTheSameSection) {
  for (const DeepSpeedKey& k : kDeepSpeedKeys) {
    if (k.alias_of == nullptr) continue;
    SCOPED_TRACE(k.path);
    const DeepSpeedKey* target = find_key(k.alias_of);
    ASSERT_NE(target, nullptr);
    EXPECT_EQ(target->alias_of, nullptr);  // one level: the setting's name
    EXPECT_EQ(target->treatment, k.treatment);
    const std::string a = k.path, b = k.alias_of;
    EXPECT_EQ(a.substr(0, a.rfind('.')), b.substr(0, b.rfind('.')));
    EXPECT_EQ(setting_of(a), b);
  }
}

// DeepSpeed's stage-3 names: each short name and its stage3_ alias, and the
// deprecated fp16 spelling, are one setting.
TEST(ConfigKeysTest, Stage3NamesAndTheirAliasesAreOneSetting) {
  for (const char* name :
       {"prefetch_bucket_size", "param_persistence_threshold",
        "model_persistence_threshold", "max_live_parameters",
        "max_reuse_distance", "gather_16bit_weights_on_model_save",
        "module_granularity_threshold", "use_all_reduce_for_fetch_params",
        "allgather_sequential"}) {
    const std::string shortname = std::string("zero_optimization.") + name;
    const std::string alias = std::string("zero_optimization.stage3_") + name;
    EXPECT_EQ(setting_of(alias), shortname);
    EXPECT_EQ(setting_of(shortname), shortname);
  }
  EXPECT_EQ(
      setting_of("zero_optimization.stage3_gather_fp16_weights_on_model_save"),
      "zero_optimization.gather_16bit_weights_on_model_save");
}

TEST(ConfigKeysTest, BfloatSixteenKeysAreThoseOfBfSixteen) {
  EXPECT_EQ(find_key("bfloat16.check_grad_overflow"),
            find_key("bf16.check_grad_overflow"));
  EXPECT_EQ(names_under("bfloat16"), names_under("bf16"));
}

TEST(ConfigKeysTest, NamesUnderASectionAreItsDirectKeys) {
  const std::vector<std::string> offload =
      names_under("zero_optimization.offload_param");
  EXPECT_EQ(offload, (std::vector<std::string>{"device", "nvme_path",
                                               "pin_memory", "buffer_count",
                                               "buffer_size", "max_in_cpu"}));
  const std::vector<std::string> top = names_under("");
  EXPECT_NE(std::find(top.begin(), top.end(), "zero_optimization"), top.end());
  EXPECT_EQ(std::find(top.begin(), top.end(), "stage"), top.end());
}

TEST(ConfigKeysTest, ReadKeysAreTheSupportedLists) {
  EXPECT_EQ(kOptimizerKeys, (std::vector<std::string>{"type", "params"}));
  EXPECT_EQ(kBf16Keys, (std::vector<std::string>{"enabled"}));
  EXPECT_EQ(kDataTypesKeys,
            (std::vector<std::string>{"grad_accum_dtype", "param_dtype"}));
}

// The predicates behind "harmless when" (Note [Key decisions]).
bool harmless(const std::string& path, const char* json) {
  const DeepSpeedKey* k = find_key(path);
  EXPECT_NE(k, nullptr) << path;
  if (k == nullptr) return false;
  EXPECT_EQ(k->treatment, Treatment::kIgnoredWhen) << path;
  if (k->treatment != Treatment::kIgnoredWhen) return false;
  return k->harmless(Json::parse(json));
}

TEST(ConfigKeysTest, EnabledSwitchesAreFoundAtAnyDepth) {
  EXPECT_TRUE(harmless("elasticity", R"({"enabled": false, "max_gpus": 8})"));
  EXPECT_TRUE(harmless("elasticity", "{}"));
  EXPECT_TRUE(harmless("elasticity", "null"));
  EXPECT_FALSE(harmless("elasticity", R"({"enabled": true})"));
  EXPECT_FALSE(harmless("elasticity", R"({"enabled": "false"})"));
  EXPECT_FALSE(harmless("elasticity", "true"));
  EXPECT_TRUE(harmless(
      "compression_training",
      R"({"weight_quantization": {"shared_parameters": {"enabled": false}},
          "layer_reduction": {"enabled": false}})"));
  EXPECT_FALSE(harmless(
      "compression_training",
      R"({"weight_quantization": {"shared_parameters": {"enabled": true}}})"));
  EXPECT_FALSE(
      harmless("data_efficiency",
               R"({"data_routing": {"random_ltd": [{"enabled": true}]}})"));
}

TEST(ConfigKeysTest, ValuePredicates) {
  EXPECT_TRUE(harmless("communication_data_type", "null"));
  EXPECT_TRUE(harmless("communication_data_type", R"("FP32")"));
  EXPECT_FALSE(harmless("communication_data_type", R"("bf16")"));
  EXPECT_TRUE(harmless("gradient_allreduce_op", R"("MEAN")"));
  EXPECT_FALSE(harmless("gradient_allreduce_op", R"("sum")"));
  EXPECT_TRUE(harmless("zero_optimization.zenflow", "null"));
  EXPECT_FALSE(harmless("zero_optimization.zenflow", "{}"));
}

TEST(ConfigKeysTest, CompileAndTensorParallelAreHarmlessWhenOff) {
  EXPECT_TRUE(harmless("compile", "{}"));
  EXPECT_TRUE(harmless("compile", R"({"deepcompile": false, "passes": []})"));
  EXPECT_TRUE(harmless("compile", R"({"enabled": false, "backend": "x"})"));
  EXPECT_FALSE(harmless("compile", R"({"deepcompile": true})"));
  EXPECT_FALSE(harmless("compile", R"({"enabled": true})"));
  EXPECT_TRUE(harmless("tensor_parallel", "{}"));
  EXPECT_TRUE(harmless("tensor_parallel",
                       R"({"autotp_size": 1, "tp": {"tp_size": 1}})"));
  EXPECT_TRUE(harmless("tensor_parallel", R"({"autotp_size": 0})"));
  EXPECT_FALSE(harmless("tensor_parallel", R"({"autotp_size": 2})"));
  EXPECT_FALSE(harmless("tensor_parallel", R"({"tp": {"tp_size": 4}})"));
  EXPECT_FALSE(
      harmless("tensor_parallel", R"({"tensor_parallel": {"tp_size": 2}})"));
  EXPECT_FALSE(harmless("tensor_parallel", R"({"autotp_size": "4"})"));
  EXPECT_TRUE(harmless("weight_quantization", R"({"enabled": false})"));
  EXPECT_TRUE(harmless("weight_quantization", "{}"));
  EXPECT_FALSE(harmless("weight_quantization",
                        R"({"quantized_initialization": {"num_bits": 8}})"));
}

TEST(ConfigKeysTest, SynonymsAreCaseInsensitiveAndNameRealKeys) {
  EXPECT_EQ(synonym("max_grad_norm"), "gradient_clipping");
  EXPECT_EQ(synonym("Max_Grad_Norm"), "gradient_clipping");
  EXPECT_EQ(synonym("zero_optimization.comm_overlap"), "overlap_comm");
  EXPECT_EQ(synonym("comm_overlap"), "");  // only inside zero_optimization
  EXPECT_EQ(synonym("gradient_clipping"), "");
  // Every suggestion is a key zerostep reads, as a dotted path from the top
  // or a name in the same section.
  for (const char* from : {"max_grad_norm",
                           "clip_grad",
                           "grad_clip",
                           "clip_grad_norm",
                           "per_device_train_batch_size",
                           "micro_batch_size",
                           "global_batch_size",
                           "learning_rate",
                           "lr",
                           "weight_decay",
                           "warmup_steps",
                           "lr_scheduler_type",
                           "zero_stage",
                           "offload_optimizer_device",
                           "offload_param_device",
                           "zero3_save_16bit_model",
                           "zero_optimization.comm_overlap",
                           "zero_optimization.overlap_communication",
                           "optimizer.params.learning_rate",
                           "optimizer.params.epsilon",
                           "optimizer.params.adam_epsilon",
                           "optimizer.params.beta1",
                           "optimizer.params.beta2",
                           "optimizer.params.adam_beta1",
                           "optimizer.params.adam_beta2",
                           "scheduler.params.num_warmup_steps",
                           "scheduler.params.warmup_steps",
                           "scheduler.params.num_training_steps",
                           "scheduler.params.total_steps"}) {
    const std::string path = from;
    const std::string to = synonym(path);
    ASSERT_FALSE(to.empty()) << path;
    const size_t dot = path.rfind('.');
    const std::string full =
        dot == std::string::npos ? to : path.substr(0, dot) + "." + to;
    const std::string params = "scheduler.params.";
    if (full.rfind(params, 0) == 0) {
      const std::string name = full.substr(params.size());
      EXPECT_NE(
          std::find(kSchedulerParams.begin(), kSchedulerParams.end(), name),
          kSchedulerParams.end())
          << path;
    } else {
      EXPECT_NE(find_key(full), nullptr) << path << " -> " << full;
    }
    EXPECT_EQ(find_key(path), nullptr) << path;  // not a DeepSpeed key
  }
}

std::string read_runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string full = path;
  if (srcdir != nullptr && workspace != nullptr)
    full = std::string(srcdir) + "/" + workspace + "/" + path;
  std::ifstream in(full);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// docs/config.md prints `name`'s table between two markers ("<!-- <name>
// table: begin (config/keys.cc) -->", "<!-- <name> table: end -->"),
// generated from the code; on a mismatch the expected text is in the
// failure message.
void expect_docs_table(const std::string& name, const std::string& table) {
  const std::string doc = read_runfile("docs/config.md");
  ASSERT_FALSE(doc.empty()) << "docs/config.md not found in the runfiles";
  const std::string begin =
      "<!-- " + name + " table: begin (config/keys.cc) -->\n";
  const std::string end = "<!-- " + name + " table: end -->";
  const size_t b = doc.find(begin);
  ASSERT_NE(b, std::string::npos) << begin;
  const size_t e = doc.find(end, b);
  ASSERT_NE(e, std::string::npos) << end;
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), table)
      << "replace docs/config.md's " << name << " table with:\n"
      << table;
}

TEST(ConfigKeysTest, DocsTableIsTheKeyTable) {
  expect_docs_table(
      "key", "| key | zerostep | why |\n|---|---|---|\n" + markdown_table());
}

// docs/config.md's "auto" table is kAutoRules printed.
TEST(ConfigKeysTest, DocsAutoTableIsTheAutoRules) {
  expect_docs_table("auto",
                    "| key | the Hugging Face integration writes | "
                    "TrainerValues field | a written value must match "
                    "|\n|---|---|---|---|\n" +
                        auto_markdown_table());
}

// Each "auto" rule is a key of the table that zerostep reads (or a
// scheduler parameter), so that filling it means something.
TEST(ConfigKeysTest, AutoRulesNameKeysZerostepReads) {
  std::set<std::string> seen;
  for (const AutoRule& r : kAutoRules) {
    SCOPED_TRACE(r.path);
    EXPECT_TRUE(seen.insert(r.path).second);
    EXPECT_EQ(find_auto_rule(r.path), &r);
    const std::string path = r.path;
    const std::string params = "scheduler.params.";
    if (path.rfind(params, 0) == 0) {
      EXPECT_NE(std::find(kSchedulerParams.begin(), kSchedulerParams.end(),
                          path.substr(params.size())),
                kSchedulerParams.end());
      continue;
    }
    const DeepSpeedKey* k = find_key(path);
    ASSERT_NE(k, nullptr);
    EXPECT_EQ(k->treatment, Treatment::kRead);
  }
  EXPECT_EQ(find_auto_rule("bfloat16.enabled"), find_auto_rule("bf16.enabled"));
  EXPECT_EQ(find_auto_rule("zero_optimization.sub_group_size"), nullptr);
}

}  // namespace
}  // namespace config_keys
}  // namespace zerostep
