#include "zero/grouping.h"

#include <gtest/gtest.h>

#include "common/errors.h"
#include "zero/flat_layout.h"

namespace zerostep {
namespace {

ModelShape shape(std::vector<size_t> numels, std::vector<int> block,
                 int num_blocks) {
  ModelShape m;
  m.name = "test";
  m.numels = std::move(numels);
  m.block = std::move(block);
  m.num_blocks = num_blocks;
  return m;
}

TEST(GroupingTest, OneGroupPerBlockInBlockOrderThenPersistentLast) {
  // Parameters: embedding (outside), block 1's weight, block 0's two, head.
  const ModelShape m =
      shape({100, 300, 200, 250, 50}, {-1, 1, 0, 0, -1}, /*num_blocks=*/2);
  const std::vector<Stage3Group> g = stage3_groups(m, /*threshold=*/0);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].params, (std::vector<size_t>{2, 3}));
  EXPECT_EQ(g[0].numel, 450u);
  EXPECT_EQ(g[0].block, 0);
  EXPECT_FALSE(g[0].persistent);
  EXPECT_EQ(g[1].params, (std::vector<size_t>{1}));
  EXPECT_EQ(g[1].block, 1);
  EXPECT_EQ(g[2].params, (std::vector<size_t>{0, 4}));
  EXPECT_EQ(g[2].numel, 150u);
  EXPECT_TRUE(g[2].persistent);
  EXPECT_EQ(g[2].block, -1);
}

TEST(GroupingTest, SmallParametersOfABlockArePersistentAndEmptyBlocksVanish) {
  const ModelShape m = shape({10, 1000, 10}, {0, 1, 1}, 2);
  const std::vector<Stage3Group> g = stage3_groups(m, /*threshold=*/100);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].block, 1);
  EXPECT_EQ(g[0].params, (std::vector<size_t>{1}));
  EXPECT_TRUE(g[1].persistent);
  EXPECT_EQ(g[1].params, (std::vector<size_t>{0, 2}));
}

TEST(GroupingTest, NoPersistentGroupWhenEveryParameterIsInABlock) {
  const std::vector<Stage3Group> g = stage3_groups(shape({5, 6}, {0, 0}, 1), 0);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(g[0].persistent);
}

TEST(GroupingTest, RejectsInconsistentShapes) {
  EXPECT_THROW(stage3_groups(shape({5, 6}, {0}, 1), 0), UsageError);
  EXPECT_THROW(stage3_groups(shape({5}, {2}, 1), 0), UsageError);
}

TEST(PaddingRuleTest, RoundsUpToTheQuantumAndNeverBelowOne) {
  EXPECT_EQ(padded_numel(0, 1), kAlignNumel);
  EXPECT_EQ(padded_numel(1, 4), 4 * kAlignNumel);
  EXPECT_EQ(padded_numel(64, 4), 64u);
  EXPECT_EQ(padded_numel(65, 4), 128u);
  EXPECT_EQ(padded_numel(1001, 3), 1008u);  // 21 quanta of 48
  // FlatLayout follows the same rule.
  EXPECT_EQ(FlatLayout::make({1001}, 3).padded_numel, padded_numel(1001, 3));
  EXPECT_EQ(FlatLayout::make({}, 2).padded_numel, padded_numel(0, 2));
}

TEST(GroupingTest, APlainModelAtStage3IsWarnedWithCountsAndTheFix) {
  // No blocks at all: everything stays whole.
  const ModelShape plain = shape({100, 300, 50}, {-1, -1, -1}, 0);
  EXPECT_EQ(stage3_whole_model_warning(plain, 0),
            "zero_optimization.stage 3: 3 of 3 trainable parameters (450 of "
            "450 elements, 100%) stay whole on every rank (3 outside every "
            "Zero3Block): their parameters and gradients are not "
            "partitioned, so this run holds at least as much memory per rank "
            "as stage 1 would. Fix: derive each repeated layer of the model "
            "from zerostep::Zero3Block (blocks/zero3_block.h), or lower "
            "stage3_param_persistence_threshold");
}

TEST(GroupingTest, BlocksBelowTheThresholdAreNamedAsTheReason) {
  const ModelShape m = shape({10, 300, 200}, {-1, 0, 1}, 2);
  const std::string w = stage3_whole_model_warning(m, 100000);
  EXPECT_NE(w.find("3 of 3 trainable parameters (510 of 510 elements"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("1 outside every Zero3Block, 2 in a block but below "
                   "stage3_param_persistence_threshold = 100000 elements"),
            std::string::npos)
      << w;
}

TEST(GroupingTest, NoWarningWhenMostElementsArePartitioned) {
  // 100 + 50 whole of 650: under half.
  const ModelShape m = shape({100, 500, 50}, {-1, 0, -1}, 1);
  EXPECT_EQ(stage3_whole_model_warning(m, 0), "");
  // Exactly half whole: no warning either.
  EXPECT_EQ(stage3_whole_model_warning(shape({300, 300}, {-1, 0}, 1), 0), "");
  EXPECT_NE(stage3_whole_model_warning(shape({301, 300}, {-1, 0}, 1), 0), "");
}

}  // namespace
}  // namespace zerostep
