#include "precision/precision.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace zerostep {
namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Every rounding agrees with LibTorch's own conversions, bit for bit, on
// random bit patterns (all exponents, NaNs, infinities, subnormals) and on
// the ties.
TEST(PrecisionTest, RoundingMatchesLibTorchConversions) {
  std::mt19937 rng(7);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, 65504.0f, 65519.99f, 65520.0f,
                           -65520.0f, 1e-8f, 6e-8f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           from_bits(0x3F808000u),   // bf16 tie, even below
                           from_bits(0x3F818000u),   // bf16 tie, odd below
                           from_bits(0x3F801000u)};  // fp16 tie
  for (int i = 0; i < 200000; ++i) xs.push_back(from_bits(rng()));
  for (float x : xs) {
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(round_to(Precision::kBf16, x)));
      EXPECT_TRUE(std::isnan(round_to(Precision::kFp16, x)));
      continue;
    }
    const float bf = static_cast<float>(c10::BFloat16(x));
    const float hf = static_cast<float>(c10::Half(x));
    ASSERT_EQ(bits(round_to(Precision::kBf16, x)), bits(bf)) << x;
    ASSERT_EQ(bits(round_to(Precision::kFp16, x)), bits(hf)) << x;
    ASSERT_EQ(bits(round_to(Precision::kFp32, x)), bits(x));
    ASSERT_EQ(to_bf16_bits(x), c10::BFloat16(x).x) << x;
  }
}

TEST(PrecisionTest, Fp16OverflowBecomesInfinity) {
  EXPECT_EQ(round_to(Precision::kFp16, 65504.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(round_to(Precision::kFp16, 70000.0f)));
  EXPECT_TRUE(std::isinf(round_to(Precision::kFp16, -1e30f)));
  EXPECT_FALSE(std::isinf(round_to(Precision::kBf16, 1e30f)));
}

TEST(PrecisionTest, AccumulateRoundsEachGradientThenTheSum) {
  // 1 + 2^-9 is not a bf16 value: rounded away before the add.
  const float g[2] = {1.0f + std::ldexp(1.0f, -9), 1.0f};
  float acc[2] = {256.0f, 0.5f};
  accumulate(acc, g, 2, Precision::kBf16, Precision::kFp32);
  EXPECT_EQ(acc[0], 257.0f);
  EXPECT_EQ(acc[1], 1.5f);
  // In bf16 accumulation 256 + 1 = 257 is not representable (8 bits of
  // mantissa: spacing 2 at 256): ties to even gives 256.
  float acc16[1] = {256.0f};
  accumulate(acc16, g, 1, Precision::kBf16, Precision::kBf16);
  EXPECT_EQ(acc16[0], 256.0f);
  // The bf16-bits path gives the same as the float path.
  uint16_t gb[2] = {to_bf16_bits(g[0]), to_bf16_bits(g[1])};
  float acc2[2] = {256.0f, 0.5f};
  accumulate_bf16(acc2, gb, 2, Precision::kFp32);
  EXPECT_EQ(acc2[0], 257.0f);
  EXPECT_EQ(acc2[1], 1.5f);
  // fp16 accumulation overflows to inf.
  float big[1] = {65000.0f};
  const float more[1] = {1000.0f};
  accumulate(big, more, 1, Precision::kFp16, Precision::kFp16);
  EXPECT_TRUE(std::isinf(big[0]));
}

TEST(PrecisionTest, NamesRoundTrip) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    EXPECT_EQ(precision_from_string(to_string(p)), p);
  EXPECT_EQ(precision_from_string("bfloat16"), Precision::kBf16);
  EXPECT_EQ(precision_from_string("float16"), Precision::kFp16);
  EXPECT_EQ(precision_from_string("half"), std::nullopt);
}

}  // namespace
}  // namespace zerostep
