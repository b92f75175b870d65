// zero/precision.h forwards to precision/precision.h for one release
// (CHANGELOG.md): a program that still includes the old header builds and
// gets the same declarations.
#include "zero/precision.h"

#include <gtest/gtest.h>

namespace zerostep {
namespace {

TEST(PrecisionForwardingTest, OldHeaderBringsTheLeafDeclarations) {
  EXPECT_STREQ(to_string(Precision::kBf16), "bf16");
  EXPECT_EQ(precision_from_string("fp16"), Precision::kFp16);
  // bf16's step at 1 is 2^-7; halfway values round to the even neighbour.
  EXPECT_EQ(round_to(Precision::kBf16, 1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(round_to(Precision::kBf16, 1.0f + 3.0f / 256), 1.0f + 1.0f / 64);
}

}  // namespace
}  // namespace zerostep
