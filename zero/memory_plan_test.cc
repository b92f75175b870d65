// Note [Memory plan] (zero/schedule.h): the model states a rank holds are
// the ZeRO paper's formulas (Rajbhandari et al. 2020, Table 1) at every
// stage, dtype, model size and world, and the other buffers are named.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "precision/precision.h"
#include "zero/flat_layout.h"
#include "zero/grouping.h"
#include "zero/schedule.h"

namespace zerostep {
namespace {

// `layers` blocks of `per_layer` elements each (one parameter apiece).
ModelShape layered(size_t layers, size_t per_layer) {
  ModelShape m;
  m.name = "layered";
  for (size_t i = 0; i < layers; ++i) {
    m.numels.push_back(per_layer);
    m.block.push_back(static_cast<int>(i));
  }
  m.num_blocks = static_cast<int>(layers);
  return m;
}

MemoryPlan plan(const ModelShape& m, int stage, int world, Precision dtype) {
  ScheduleOptions o;
  o.stage = stage;
  o.world_size = world;
  o.dtype = dtype;
  return memory_plan(m, o);
}

// The model states, in bytes, for Psi = `padded` elements (stages 0-2: the
// flat padded buffer; stage 3: the groups' padded sizes summed) over Nd =
// `world` ranks, by the formulas of Note [Memory plan].
size_t formula(int stage, Precision dtype, size_t padded, int world) {
  const size_t psi = padded, per = padded / world;
  if (dtype != Precision::kBf16) {  // fp32, and fp16 emulated in float32
    switch (stage) {
      case 0: return 16 * psi;
      case 1: return 8 * psi + 8 * per;
      case 2: return 4 * psi + 12 * per;
      default: return 16 * per;
    }
  }
  switch (stage) {
    case 0: return 16 * psi;
    case 1: return 4 * psi + 12 * per;
    case 2: return 2 * psi + 16 * per;  // the paper's 14, + float32 grads
    default: return 16 * per;
  }
}

TEST(MemoryPlanTest, ModelStatesAreThePapersFormulas) {
  for (size_t layers : {size_t{2}, size_t{12}, size_t{48}})
    for (size_t per_layer : {size_t{1000}, size_t{123457}, size_t{1} << 22})
      for (int world : {1, 2, 3, 8, 64, 1000})
        for (Precision dtype :
             {Precision::kFp32, Precision::kBf16, Precision::kFp16})
          for (int stage : {0, 1, 2, 3}) {
            const ModelShape m = layered(layers, per_layer);
            size_t padded = FlatLayout::make(m.numels, world).padded_numel;
            if (stage == 3) {
              padded = 0;
              for (const Stage3Group& g : stage3_groups(m, 100000))
                padded += padded_numel(g.numel, world);
            }
            const MemoryPlan p = plan(m, stage, world, dtype);
            EXPECT_EQ(p.model_state_bytes(),
                      formula(stage, dtype, padded, world))
                << "stage " << stage << " " << to_string(dtype) << " world "
                << world << " layers " << layers << " x " << per_layer;
            // The peak is every term, model states and buffers.
            EXPECT_EQ(p.stats().peak_bytes, p.total_bytes());
            EXPECT_GE(p.total_bytes(), p.model_state_bytes());
          }
}

// The paper's example: Psi = 7.5B, Nd = 64, mixed precision (K = 12):
// 120 GB at stage 0, 31.4 GB at stage 1, 16.6 GB at stage 2, 1.9 GB at
// stage 3. zerostep's bf16 holds those, except 2 bytes per owned element
// at stage 2 (its gradient partition accumulates in float32: +0.23 GB).
TEST(MemoryPlanTest, ThePapersSevenAndAHalfBillionAtSixtyFourRanks) {
  const ModelShape m = layered(32, 234375000);  // 7.5e9
  const double gb = 1e9;
  auto states = [&](int stage) {
    return static_cast<double>(
               plan(m, stage, 64, Precision::kBf16).model_state_bytes()) /
           gb;
  };
  EXPECT_NEAR(states(0), 120.0, 0.01);
  EXPECT_NEAR(states(1), 4 * 7.5 + 12 * 7.5 / 64, 0.01);  // 31.41
  EXPECT_NEAR(states(2), 2 * 7.5 + 14 * 7.5 / 64 + 2 * 7.5 / 64, 0.01);
  EXPECT_NEAR(states(3), 16 * 7.5 / 64, 0.01);  // 1.875
  // fp32 (the "fp32 equivalents"): 8 Psi + 8 Psi/Nd, 4 Psi +
  // 12 Psi/Nd, 16 Psi/Nd.
  auto fp32 = [&](int stage) {
    return static_cast<double>(
               plan(m, stage, 64, Precision::kFp32).model_state_bytes()) /
           gb;
  };
  EXPECT_NEAR(fp32(1), 8 * 7.5 + 8 * 7.5 / 64, 0.01);
  EXPECT_NEAR(fp32(2), 4 * 7.5 + 12 * 7.5 / 64, 0.01);
  EXPECT_NEAR(fp32(3), 16 * 7.5 / 64, 0.01);
}

// Every buffer the paper does not count is there by name, and only where
// its stage keeps it.
TEST(MemoryPlanTest, BuffersAreNamed) {
  const ModelShape m = layered(12, 1 << 20);
  auto names = [&](int stage, Precision dtype) {
    std::set<std::string> out;
    for (const MemoryTerm& t : plan(m, stage, 4, dtype).terms)
      if (!t.model_state) out.insert(t.name);
    return out;
  };
  EXPECT_TRUE(names(0, Precision::kFp32).empty());
  EXPECT_EQ(names(0, Precision::kBf16),
            std::set<std::string>{"window accumulation (float32)"});
  EXPECT_TRUE(names(1, Precision::kFp32).count("reduced gradient partition"));
  EXPECT_TRUE(
      names(1, Precision::kFp32).count("rollback: the moments' commit scratch"));
  const std::set<std::string> s2 = names(2, Precision::kBf16);
  for (const char* n : {"bucket pool", "bucket scratch", "all-gather staging",
                        "rollback: the owned master"})
    EXPECT_TRUE(s2.count(n)) << n;
  const std::set<std::string> s3 = names(3, Precision::kBf16);
  for (const char* n : {"gathered block groups (pool)", "reduce scratch",
                        "gathered block groups, bf16 (pool)"})
    EXPECT_TRUE(s3.count(n)) << n;
  // No stage above 1 keeps a full float32 gradient, none above 0 under bf16
  // a full float32 master.
  for (int stage : {2, 3})
    for (const MemoryTerm& t : plan(m, stage, 4, Precision::kFp32).terms)
      EXPECT_NE(t.name, "gradients (window accumulation)");
  for (int stage : {1, 2})
    for (const MemoryTerm& t : plan(m, stage, 4, Precision::kBf16).terms)
      EXPECT_NE(t.name, "float32 master");
}

}  // namespace
}  // namespace zerostep
