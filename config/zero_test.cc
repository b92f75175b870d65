#include "config/zero.h"

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

// Note [Stage 3 gather once per step]: zerostep's own boolean, off by
// default, read (not listed as ignored) at every stage.
TEST(ParseConfigTest, GatherOncePerStepIsABooleanOffByDefault) {
  const auto zero = [](const std::string& section) {
    return R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": )" +
           section + "}";
  };
  EXPECT_FALSE(parse_config(zero(R"({"stage": 3})"), 2)
                   .zero.gather_once_per_step);
  for (int stage : {0, 3}) {
    const Config c = parse_config(
        zero(R"({"stage": )" + std::to_string(stage) +
             R"(, "gather_once_per_step": true})"),
        2);
    EXPECT_TRUE(c.zero.gather_once_per_step);
    EXPECT_TRUE(c.ignored_keys.empty());
  }
  const ConfigProblem p = only_problem(
      zero(R"({"stage": 3, "gather_once_per_step": "yes"})"));
  EXPECT_EQ(p.key, "zero_optimization.gather_once_per_step");
  EXPECT_EQ(p.value, "\"yes\"");
  EXPECT_HAS(p.rule, "true or false");
  EXPECT_EQ(only_problem(zero(R"({"stage": 3, "gather_once_per_stp": true})"))
                .fix,
            "did you mean \"gather_once_per_step\"?");
}

// --- offload_optimizer, offload_param ---

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
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{
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
            "offload_param": {"device": "tape", "buffr_size": 1}}})");
  ASSERT_EQ(ps.size(), 5u);
  EXPECT_EQ(ps[0].key, "zero_optimization.offload_optimizer.device");
  EXPECT_EQ(ps[0].value, "\"disk\"");
  EXPECT_EQ(ps[1].key, "zero_optimization.offload_optimizer.buffer_count");
  EXPECT_EQ(ps[2].key, "zero_optimization.offload_optimizer.nvme_pth");
  EXPECT_HAS(ps[2].fix, "nvme_path");
  // Below stage 3 offload_param is not used, but still checked, as
  // DeepSpeed's schema checks it.
  EXPECT_EQ(ps[3].key, "zero_optimization.offload_param.device");
  EXPECT_EQ(ps[4].key, "zero_optimization.offload_param.buffr_size");
  EXPECT_EQ(ps[4].fix, "did you mean \"buffer_size\"?");
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

// --- DeepSpeed's other names (issue 14 item 1) ---

// DeepSpeedZeroConfig's field names, their stage3_ aliases and the
// deprecated fp16 spelling are all accepted; the performance and save knobs
// are listed as ignored, each under the name written.
TEST(ParseConfigTest, Stage3NamesWithoutThePrefixAreAccepted) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3,
            "prefetch_bucket_size": 5e7, "max_live_parameters": 1e9,
            "max_reuse_distance": 1e9, "model_persistence_threshold": 1e12,
            "gather_16bit_weights_on_model_save": true,
            "module_granularity_threshold": 0,
            "use_all_reduce_for_fetch_params": false,
            "allgather_sequential": false,
            "stage3_gather_fp16_weights_on_model_save": true,
            "stage3_model_persistence_threshold": 1e12,
            "param_persistence_threshold": 0}})",
      1);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 0);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1000000000);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 1000000000);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{
                "zero_optimization.model_persistence_threshold",
                "zero_optimization.gather_16bit_weights_on_model_save",
                "zero_optimization.module_granularity_threshold",
                "zero_optimization.use_all_reduce_for_fetch_params",
                "zero_optimization.allgather_sequential",
                "zero_optimization.stage3_gather_fp16_weights_on_model_save",
                "zero_optimization.stage3_model_persistence_threshold"}));
}

TEST(ParseConfigTest, PersistenceThresholdIsReadUnderEitherName) {
  for (const char* name :
       {"param_persistence_threshold", "stage3_param_persistence_threshold"}) {
    Config c = parse_config(std::string(R"({"train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, ")") +
                                name + R"(": 1234}})",
                            1);
    EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 1234) << name;
    EXPECT_TRUE(c.ignored_keys.empty()) << name;
  }
  // Both names with one value (however written) are one setting.
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3,
            "param_persistence_threshold": 1e4,
            "stage3_param_persistence_threshold": 10000}})",
      1);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 10000);
}

TEST(ParseConfigTest, TwoNamesOfOneSettingWithDifferentValuesAreAnError) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3,
            "stage3_param_persistence_threshold": 0,
            "prefetch_bucket_size": 5e7,
            "param_persistence_threshold": 100,
            "stage3_prefetch_bucket_size": 1e6,
            "stage3_gather_16bit_weights_on_model_save": true,
            "stage3_gather_fp16_weights_on_model_save": false}})");
  ASSERT_EQ(ps.size(), 3u);
  EXPECT_EQ(ps[0].key, "zero_optimization.param_persistence_threshold");
  EXPECT_EQ(ps[0].value, "100");
  EXPECT_EQ(ps[0].rule,
            "names the same DeepSpeed setting as "
            "zero_optimization.stage3_param_persistence_threshold (= 0) but "
            "gives it another value");
  EXPECT_EQ(ps[0].fix,
            "keep one of zero_optimization.stage3_param_persistence_threshold "
            "and zero_optimization.param_persistence_threshold");
  EXPECT_EQ(ps[1].key, "zero_optimization.stage3_prefetch_bucket_size");
  EXPECT_HAS(ps[1].rule,
             "zero_optimization.prefetch_bucket_size (= 50000000.0)");
  EXPECT_EQ(ps[2].key,
            "zero_optimization.stage3_gather_fp16_weights_on_model_save");
  EXPECT_HAS(ps[2].rule,
             "zero_optimization.stage3_gather_16bit_weights_on_model_save");
}

// The other name's value is quoted in the rule, cut like every value.
TEST(ParseConfigTest, AConflictQuotesTheOtherValueBounded) {
  const std::string big(1 << 20, 'x');
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"model_persistence_threshold": ")" +
      big + R"(", "stage3_model_persistence_threshold": 1}})");
  EXPECT_EQ(p.key, "zero_optimization.stage3_model_persistence_threshold");
  EXPECT_LT(p.rule.size(), 400u);
  EXPECT_HAS(p.rule, "bytes)");
}

TEST(ParseConfigTest, DeprecatedCpuOffloadParamMeansParameterOffloadToCpu) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "cpu_offload_param": true,
            "cpu_offload_use_pin_memory": true}})",
      1);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{
                "zero_optimization.cpu_offload_use_pin_memory"}));
  // false, and null (DeepSpeed's Optional: not given), offload nothing.
  for (const char* v : {"false", "null"}) {
    Config d = parse_config(std::string(R"({"train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "cpu_offload": )") +
                                v + R"(, "cpu_offload_param": )" + v + "}}",
                            1);
    EXPECT_EQ(d.zero.offload_param.device, OffloadDevice::kNone) << v;
    EXPECT_EQ(d.zero.offload_optimizer.device, OffloadDevice::kNone) << v;
    EXPECT_TRUE(d.ignored_keys.empty()) << v;
  }
}

TEST(ParseConfigTest, DeprecatedOffloadFlagsMustAgreeWithTheirSections) {
  // Agreeing spellings are one setting.
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "cpu_offload": true,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "none"}, "cpu_offload_param": false}})",
      1);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "cpu_offload": false,
            "offload_optimizer": {"device": "cpu"},
            "cpu_offload_param": true,
            "offload_param": {"device": "nvme", "nvme_path": "/x"}}})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "zero_optimization.cpu_offload");
  EXPECT_EQ(ps[0].value, "false");
  EXPECT_EQ(ps[0].rule,
            "is DeepSpeed's deprecated spelling of "
            "zero_optimization.offload_optimizer.device = \"none\", but "
            "zero_optimization.offload_optimizer.device is \"cpu\"");
  EXPECT_EQ(ps[0].fix,
            "keep one of zero_optimization.cpu_offload and "
            "zero_optimization.offload_optimizer");
  EXPECT_EQ(ps[1].key, "zero_optimization.cpu_offload_param");
  EXPECT_HAS(ps[1].rule, "offload_param.device is \"nvme\"");
}

// DeepSpeed's oldest form: "zero_optimization": true is stage 1, with the
// top-level allgather_size as its allgather_bucket_size.
TEST(ParseConfigTest, BooleanZeroOptimizationIsStageOneOrZero) {
  Config c = parse_config(
      R"({"allgather_size": 2e8, "train_micro_batch_size_per_gpu": 1,
          "zero_optimization": true})",
      1);
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200000000);
  EXPECT_TRUE(c.ignored_keys.empty());
  Config off = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": false})",
      1);
  EXPECT_EQ(off.zero.stage, 0);
  // Otherwise DeepSpeed does not read allgather_size.
  Config obj = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1, "allgather_size": 2e8,
          "zero_optimization": {"stage": 2}})",
      1);
  EXPECT_EQ(obj.zero.allgather_bucket_size, 500000000);
  EXPECT_EQ(obj.ignored_keys, (std::vector<std::string>{"allgather_size"}));
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": true,
          "allgather_size": 0})");
  EXPECT_EQ(p.key, "allgather_size");
  EXPECT_HAS(p.rule, "positive");
}

// --- null (issue 14 item 2): DeepSpeed's Optional fields ---

TEST(ParseConfigTest, NullIsTheDefaultWhereDeepSpeedsZeroSchemaTakesIt) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 2, "overlap_comm": null,
            "offload_optimizer": null, "cpu_offload": null,
            "zenflow": null, "zeropp_loco_param": null}})",
      1);
  EXPECT_FALSE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(c.ignored_keys,
            (std::vector<std::string>{"zero_optimization.offload_optimizer",
                                      "zero_optimization.zenflow",
                                      "zero_optimization.zeropp_loco_param"}));
  Config cpu = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 2,
            "offload_optimizer": {"device": "cpu", "nvme_path": null}}})",
      1);
  EXPECT_EQ(cpu.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(cpu.zero.offload_optimizer.nvme_path, "");
}

TEST(ParseConfigTest, NullIsAnErrorWhereDeepSpeedsZeroSchemaRejectsIt) {
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": null, "reduce_bucket_size": null,
            "contiguous_gradients": null, "sub_group_size": null,
            "offload_optimizer": {"device": "nvme", "nvme_path": null,
                                  "pin_memory": null}}})");
  ASSERT_EQ(ps.size(), 6u);
  EXPECT_EQ(ps[0].key, "zero_optimization.stage");
  EXPECT_EQ(ps[1].key, "zero_optimization.reduce_bucket_size");
  EXPECT_EQ(ps[2].key, "zero_optimization.contiguous_gradients");
  EXPECT_EQ(ps[3].key, "zero_optimization.sub_group_size");
  EXPECT_EQ(ps[4].key, "zero_optimization.offload_optimizer.pin_memory");
  EXPECT_EQ(ps[5].key, "zero_optimization.offload_optimizer.nvme_path");
  EXPECT_HAS(ps[5].rule, "required");
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": null})");
  EXPECT_EQ(p.key, "zero_optimization");
  EXPECT_EQ(p.value, "null");
}

// --- 0 for bucket and sub-group sizes (issue 14 item 3) ---

// DeepSpeed flushes its reduction bucket before a parameter that would
// overflow it, and closes a stage-3 sub-group once it holds at least
// sub_group_size elements: with 0, as with 1, every parameter is reduced
// and swapped on its own. The engine takes sizes >= 1, so 0 is stored as
// the 1 that means the same.
TEST(ParseConfigTest, ZeroBucketAndSubGroupSizesAreStoredAsOne) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 3, "reduce_bucket_size": 0,
            "sub_group_size": 0}})",
      1);
  EXPECT_EQ(c.zero.reduce_bucket_size, 1);
  EXPECT_EQ(c.zero.sub_group_size, 1);
  EXPECT_TRUE(c.ignored_keys.empty());
  Config two = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 2, "reduce_bucket_size": 2,
            "sub_group_size": 2.0}})",
      1);
  EXPECT_EQ(two.zero.reduce_bucket_size, 2);
  EXPECT_EQ(two.zero.sub_group_size, 2);
  std::vector<ConfigProblem> ps = problems_of(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"reduce_bucket_size": -1,
            "sub_group_size": -5}})");
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].key, "zero_optimization.reduce_bucket_size");
  EXPECT_EQ(ps[0].rule, "must be a number of elements >= 0");
  EXPECT_EQ(ps[1].key, "zero_optimization.sub_group_size");
  EXPECT_EQ(ps[1].fix, "write a number of elements >= 0, e.g. 1e9");
}

// --- offload_param below stage 3 (issue 14 item 4) ---

// DeepSpeed reads offload_param only at stage 3; below it the section is
// accepted, checked, listed once as ignored, and not used: no NVMe path is
// required and the engine sees no parameter offload.
TEST(ParseConfigTest, ParameterOffloadBelowStage3IsIgnored) {
  for (int stage : {0, 1, 2}) {
    Config c = parse_config(
        R"({"train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {
              "offload_param": {"device": "nvme", "buffer_size": 1e8,
                                "pin_memory": true},
              "stage": )" +
            std::to_string(stage) + R"(, "cpu_offload_param": true}})",
        1);
    EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone) << stage;
    EXPECT_FALSE(c.zero.offload_param.pin_memory) << stage;
    EXPECT_EQ(c.ignored_keys,
              (std::vector<std::string>{"zero_optimization.offload_param",
                                        "zero_optimization.cpu_offload_param"}))
        << stage;
  }
  // Absent stage is stage 0.
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"offload_param": {"device": "cpu"}}})",
      1);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  // At stage 3 it is read, and NVMe needs its path.
  ConfigProblem p = only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"offload_param": {"device": "nvme"},
                                "stage": 3}})");
  EXPECT_EQ(p.key, "zero_optimization.offload_param.nvme_path");
}

TEST(ToStringTest, OffloadDeviceNamesMatchTheConfigValues) {
  EXPECT_STREQ(to_string(OffloadDevice::kNone), "none");
  EXPECT_STREQ(to_string(OffloadDevice::kCpu), "cpu");
  EXPECT_STREQ(to_string(OffloadDevice::kNvme), "nvme");
}

}  // namespace
}  // namespace zerostep
