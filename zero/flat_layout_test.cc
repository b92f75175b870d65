#include "zero/flat_layout.h"

#include <gtest/gtest.h>

#include "common/errors.h"

namespace zerostep {
namespace {

TEST(FlatLayoutTest, PacksBackToBackAndPadsToEqualAlignedPartitions) {
  FlatLayout l = FlatLayout::make({10, 7, 1}, 3);
  EXPECT_EQ(l.offsets, (std::vector<size_t>{0, 10, 17}));
  EXPECT_EQ(l.numel, 18u);
  EXPECT_EQ(l.padded_numel % (3 * FlatLayout::kAlignNumel), 0u);
  EXPECT_GE(l.padded_numel, l.numel);
  EXPECT_EQ(l.partition_numel * 3, l.padded_numel);
  EXPECT_EQ(l.partition_begin(2), 2 * l.partition_numel);
}

TEST(FlatLayoutTest, SizesThatDoNotDivideByTheWorldStillPartition) {
  for (int w = 1; w <= 7; ++w) {
    FlatLayout l = FlatLayout::make({1001}, w);
    EXPECT_EQ(l.partition_numel * w, l.padded_numel) << w;
    EXPECT_GE(l.padded_numel, 1001u);
    EXPECT_LT(l.padded_numel, 1001u + w * FlatLayout::kAlignNumel) << w;
  }
}

TEST(FlatLayoutTest, EmptyModelStillHasOnePaddedQuantum) {
  FlatLayout l = FlatLayout::make({}, 2);
  EXPECT_EQ(l.numel, 0u);
  EXPECT_EQ(l.padded_numel, 2 * FlatLayout::kAlignNumel);
}

TEST(FlatLayoutTest, RejectsEmptyWorld) {
  EXPECT_THROW(FlatLayout::make({4}, 0), UsageError);
}

}  // namespace
}  // namespace zerostep
