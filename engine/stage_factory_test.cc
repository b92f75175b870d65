// Note [Stage factory]: choose_stage() hands each stage the config's values
// for the options it takes, and the binding's choices that depend on the
// stage number; kernel_placement() and offload_param_applies() decide the
// rest. Torch-free.
#include "engine/stage_factory.h"

#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "common/errors.h"
#include "common/zero_defaults.h"
#include "config/config.h"

namespace zerostep {
namespace {

// By default every stage-specific key is set away from its default, so
// that a value the factory forgot to pass is seen.
constexpr const char* kAllZeroKeys =
    R"("reduce_bucket_size": 1000, "allgather_bucket_size": 2000,
       "overlap_comm": true, "reduce_once_per_step": true,
       "gather_once_per_step": true, "stage3_prefetch_bucket_size": 3000,
       "stage3_max_reuse_distance": 4000,
       "stage3_max_live_parameters": 5000)";
constexpr const char* kBf16 =
    R"("bf16": {"enabled": true},
       "data_types": {"grad_accum_dtype": "bf16"})";

Config config_for(int stage, const std::string& zero_keys = kAllZeroKeys,
                  const std::string& precision = kBf16) {
  std::string json =
      R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
          "gradient_accumulation_steps": 1,
          "prescale_gradients": false, "gradient_predivide_factor": 2.0,
          "zero_optimization": {"stage": )" +
      std::to_string(stage);
  if (!zero_keys.empty()) json += ", " + zero_keys;
  json += "}";
  if (!precision.empty()) json += ", " + precision;
  return parse_config(json + "}", 2);
}

StageResources resources() {
  StageResources r;
  r.layout = FlatLayout::make({10, 6}, 2);
  r.optimizer.lr = 0.25;
  r.optimizer_swap.buffer_count = 7;
  r.param_swap.buffer_count = 9;
  r.collectives_outside_backward = true;
  return r;
}

TEST(StageFactoryTest, StageNumberIsTheAlternativeAndCommonOptionsPass) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const StageChoice c = choose_stage(config_for(stage), resources());
    EXPECT_EQ(stage_number(c.options), stage);
    EXPECT_EQ(c.options.layout.numel, 16u);
    EXPECT_EQ(c.options.layout.world_size, 2);
    EXPECT_EQ(c.options.optimizer.lr, 0.25);
    EXPECT_EQ(c.options.optimizer_swap.buffer_count, 7u);
    EXPECT_FALSE(c.options.averaging.prescale_gradients);
    EXPECT_EQ(c.options.averaging.gradient_predivide_factor, 2.0);
  }
}

TEST(StageFactoryTest, Stage0TakesItsBucketAndOverlap) {
  const StageChoice c = choose_stage(config_for(0), resources());
  const auto& s = std::get<Stage0Options>(c.options.per_stage);
  EXPECT_EQ(s.reduce_bucket_size, 1000);
  EXPECT_TRUE(s.overlap_comm);
  // Stages 0-1: the flat gradient buffer is the window's accumulator.
  EXPECT_EQ(c.fold_accum, Precision::kBf16);
  EXPECT_FALSE(c.replica_may_tear);
}

TEST(StageFactoryTest, Stage1PartitionsTheBf16MasterUnlessOffloaded) {
  StageChoice c = choose_stage(config_for(1), resources());
  EXPECT_TRUE(std::get<Stage1Options>(c.options.per_stage).bf16_weights);
  EXPECT_TRUE(partitions_master(c.options));
  EXPECT_EQ(c.fold_accum, Precision::kBf16);
  // Stage 1 stages its all-gather in the full gradient buffer.
  EXPECT_FALSE(c.replica_may_tear);
  c = choose_stage(config_for(1, R"("offload_optimizer": {"device": "cpu"})"),
                   resources());
  EXPECT_FALSE(std::get<Stage1Options>(c.options.per_stage).bf16_weights);
}

TEST(StageFactoryTest, Stage2TakesItsOptions) {
  const StageChoice c = choose_stage(config_for(2), resources());
  const auto& s = std::get<Stage2Options>(c.options.per_stage);
  EXPECT_EQ(s.reduce_bucket_size, 1000);
  EXPECT_EQ(s.allgather_bucket_size, 2000);
  EXPECT_TRUE(s.overlap_comm);
  EXPECT_EQ(s.grad_accum, Precision::kBf16);
  EXPECT_TRUE(s.bf16_weights);
  EXPECT_TRUE(s.reduce_once_per_step);
  EXPECT_TRUE(s.collectives_outside_backward);
  // Stages 2-3 accumulate their partition themselves.
  EXPECT_EQ(c.fold_accum, Precision::kFp32);
  // The partitioned master has no full buffer to stage the all-gather in.
  EXPECT_TRUE(c.replica_may_tear);
}

TEST(StageFactoryTest, Stage2WithTheFullBuffersCannotTear) {
  const StageChoice c = choose_stage(
      config_for(2, R"("reduce_once_per_step": true)", ""), resources());
  EXPECT_FALSE(partitions_gradients(c.options));
  EXPECT_FALSE(partitions_master(c.options));
  EXPECT_FALSE(c.replica_may_tear);
}

TEST(StageFactoryTest, Stage3TakesItsOptions) {
  StageResources r = resources();
  Kernels* groups = &host_kernels();
  r.group_kernels = groups;
  const StageChoice c = choose_stage(config_for(3), r);
  const auto& s = std::get<Stage3Options>(c.options.per_stage);
  EXPECT_EQ(s.reduce_bucket_size, 1000);
  EXPECT_TRUE(s.overlap_comm);
  EXPECT_EQ(s.grad_accum, Precision::kBf16);
  EXPECT_TRUE(s.reduce_once_per_step);
  EXPECT_TRUE(s.gather_once_per_step);
  EXPECT_TRUE(s.collectives_outside_backward);
  EXPECT_EQ(s.prefetch_numel, 3000u);
  EXPECT_EQ(s.reuse_distance_numel, 4000u);
  EXPECT_EQ(s.max_live_numel, 5000u);
  EXPECT_EQ(s.param_swap.buffer_count, 9u);
  EXPECT_EQ(s.group_kernels, groups);
  EXPECT_EQ(c.fold_accum, Precision::kFp32);
  EXPECT_FALSE(c.replica_may_tear);
}

TEST(StageFactoryTest, AStageOutsideZeroToThreeIsAUsageError) {
  Config c = config_for(0);
  c.zero.stage = 4;
  try {
    choose_stage(c, resources());
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.stage = 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(StageFactoryTest, KernelPlacementFollowsStageAndOffload) {
  ZeroConfig z;
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    z.stage = stage;
    z.offload_optimizer.device = OffloadDevice::kNone;
    z.offload_param.device = OffloadDevice::kNone;
    EXPECT_EQ(kernel_placement(z), KernelPlacement::kStage);
    z.offload_optimizer.device = OffloadDevice::kCpu;
    EXPECT_EQ(kernel_placement(z),
              stage == 3 ? KernelPlacement::kGroups : KernelPlacement::kNone);
    // offload_param alone: stage 3's partitions only.
    z.offload_optimizer.device = OffloadDevice::kNone;
    z.offload_param.device = OffloadDevice::kCpu;
    EXPECT_EQ(kernel_placement(z),
              stage == 3 ? KernelPlacement::kGroups : KernelPlacement::kStage);
    EXPECT_EQ(offload_param_applies(z), stage == 3);
  }
}

// Defaults written once (common/zero_defaults.h): options built without a
// config mean what a ds_config without the keys means.
TEST(StageFactoryTest, StructDefaultsAreTheConfigDefaults) {
  const ZeroConfig z;
  EXPECT_EQ(z.reduce_bucket_size, zero_defaults::kBucketElements);
  EXPECT_EQ(Stage0Options{}.reduce_bucket_size, z.reduce_bucket_size);
  EXPECT_EQ(Stage2Options{}.reduce_bucket_size, z.reduce_bucket_size);
  EXPECT_EQ(Stage2Options{}.allgather_bucket_size, z.allgather_bucket_size);
  EXPECT_EQ(Stage3Options{}.reduce_bucket_size, z.reduce_bucket_size);
  EXPECT_EQ(z.stage3_param_persistence_threshold,
            zero_defaults::kPersistenceThreshold);
  EXPECT_EQ(z.stage3_max_reuse_distance, zero_defaults::kMaxReuseDistance);
}

}  // namespace
}  // namespace zerostep
