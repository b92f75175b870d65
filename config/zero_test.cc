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

TEST(ToStringTest, OffloadDeviceNamesMatchTheConfigValues) {
  EXPECT_STREQ(to_string(OffloadDevice::kNone), "none");
  EXPECT_STREQ(to_string(OffloadDevice::kCpu), "cpu");
  EXPECT_STREQ(to_string(OffloadDevice::kNvme), "nvme");
}

}  // namespace
}  // namespace zerostep
