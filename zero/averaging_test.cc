// Note [Gradient averaging]: the scalars each stage uses, as DeepSpeed's
// code computes them (mul_ by a Python float: the float of the double
// quotient; div_: the float reciprocal), and their application.
#include "zero/averaging.h"

#include <gtest/gtest.h>

#include <vector>

#include "zero/kernels.h"

namespace zerostep {
namespace {

TEST(AveragingTest, TheDefaultScalesNothing) {
  for (int stage = 0; stage <= 3; ++stage) {
    const AveragingSteps s = averaging_steps(GradAveraging{}, stage, 3);
    EXPECT_FALSE(s.scaled);
    EXPECT_TRUE(s.before.empty());
    EXPECT_EQ(s.after, 1.0f);
  }
}

TEST(AveragingTest, PrescaleDividesEachRanksGradientByTheWorld) {
  const GradAveraging a{true, 8.0};  // the factor is unused
  EXPECT_EQ(averaging_steps(a, 0, 3).before,
            std::vector<float>{static_cast<float>(1.0 / 3.0)});
  for (int stage = 1; stage <= 3; ++stage) {
    const AveragingSteps s = averaging_steps(a, stage, 3);
    EXPECT_TRUE(s.scaled);
    EXPECT_EQ(s.before, std::vector<float>{1.0f / 3.0f});
    EXPECT_EQ(s.after, 1.0f);
  }
}

TEST(AveragingTest, PredivideBeforeAndTheRestAfter) {
  const GradAveraging a{false, 4.0};
  for (int stage = 0; stage <= 2; ++stage) {
    const AveragingSteps s = averaging_steps(a, stage, 3);
    EXPECT_EQ(s.before, std::vector<float>{0.25f});
    EXPECT_EQ(s.after, static_cast<float>(4.0 / 3.0));
  }
  // Stage 3 divides by the factor and by the world, then multiplies by the
  // factor.
  const AveragingSteps s3 = averaging_steps(a, 3, 3);
  EXPECT_EQ(s3.before, (std::vector<float>{0.25f, 1.0f / 3.0f}));
  EXPECT_EQ(s3.after, 4.0f);
  // A factor equal to the world size leaves the sum as it is.
  EXPECT_EQ(averaging_steps(GradAveraging{false, 3.0}, 1, 3).after, 1.0f);
  EXPECT_EQ(averaging_steps(GradAveraging{false, 3.0}, 3, 3).after, 1.0f);
}

TEST(AveragingTest, ScaleBeforeSumMultipliesInOrder) {
  std::vector<float> x = {3.0f, -1.5f, 7.0f};
  const AveragingSteps s = averaging_steps(GradAveraging{false, 4.0}, 3, 3);
  scale_before_sum(host_kernels(), s, x.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float v[] = {3.0f, -1.5f, 7.0f};
    EXPECT_EQ(x[i], v[i] * 0.25f * (1.0f / 3.0f));
  }
}

}  // namespace
}  // namespace zerostep
