#include "zero/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "offload/adam_test_vectors.h"

namespace zerostep {
namespace {

// The fused kernel streams its stores only to 64-byte aligned outputs
// (Note [Update out of place] in offload/fused_adam.h): the optimizer's
// banks of moments and stage 3's partitions come from here.
TEST(HostKernelsTest, AllocationsAreZerosOn64ByteBoundaries) {
  for (size_t n :
       {size_t{1}, size_t{17}, size_t{1} << 20, (size_t{1} << 20) + 3}) {
    DeviceArray a = host_kernels().allocate(n);
    ASSERT_EQ(a.size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u) << n;
    EXPECT_TRUE(
        std::all_of(a.data(), a.data() + n, [](float x) { return x == 0.0f; }));
  }
}

// Note [Sum of squares order] (zero/kernels.cc): exact where every order
// is (small integers, every length around the eight lanes), and the
// documented order where orders differ: 2^54 in lane 0 absorbs each 1
// added to it alone, while lanes 1-7 sum theirs first.
TEST(HostKernelsTest, SumOfSquaresIsExactAndKeepsItsOrder) {
  Kernels& k = host_kernels();
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 40, 1003}) {
    std::vector<float> x(n);
    double exact = 0;
    for (size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(static_cast<int>(i % 13) - 6);
      exact += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_EQ(k.sum_of_squares(x.data(), n), exact) << n;
  }
  std::vector<float> big(16, 1.0f);
  big[0] = 134217728.0f;  // 2^27: its square is 2^54, whose ulp is 4
  big[8] = 0.0f;          // lane 0 gets nothing more
  // Lane 0: 2^54; lanes 1-7: 2 each. Pairwise: 2^54 + 2 is a tie that
  // rounds to 2^54 (even), + (2 + 2) gives 2^54 + 4, and + ((2 + 2) +
  // (2 + 2)) gives 2^54 + 12, all exact. One chain would lose every 1 it
  // adds to 2^54 (half an ulp or less): 2^54.
  EXPECT_EQ(k.sum_of_squares(big.data(), big.size()),
            18014398509481984.0 + 12.0);
}

// The host's one-pass divide_and_sum_of_squares gives the bits of the
// three passes it replaces (divide, divide, sum_of_squares): the divided
// values and the sum, for every combination of divisors that are 1 or not,
// at lengths around the eight lanes, on values that round when divided.
TEST(HostKernelsTest, DivideAndSumOfSquaresIsTheThreePassesBitForBit) {
  Kernels& k = host_kernels();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (size_t n : {0, 1, 7, 8, 9, 17, 1003})
    for (double first : {1.0, 3.0})
      for (double second : {1.0, 7.0}) {
        std::vector<float> x(n);
        for (float& v : x) v = normal(rng);
        std::vector<float> three = x;
        k.divide(three.data(), n, first);
        k.divide(three.data(), n, second);
        const double want = k.sum_of_squares(three.data(), n);
        const double got =
            k.divide_and_sum_of_squares(x.data(), n, first, second);
        EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
            << n << " " << first << " " << second;
        EXPECT_EQ(std::memcmp(x.data(), three.data(), n * sizeof(float)), 0)
            << n << " " << first << " " << second;
      }
}

// Note [Sum of squares order], held by every instruction set: element i
// into partial sum i % 8, each partial sum in element order, then
// pairwise. The reference below is that definition, one element at a
// time. The values span 2^-40 to 2^40, so a different order of additions
// gives different bits; the lengths cover every tail of the 8- and
// 16-element loops and both sides of the prefetching loop's end (272
// elements). A pass that wrote back the divided values must write exactly
// the divided values, and one that divides by nothing must not write.
double reference_squares(std::vector<float>& x, float first, float second) {
  double lane[8] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    float y = x[i];
    if (first != 1.0f) y = y / first;
    if (second != 1.0f) y = y / second;
    x[i] = y;
    lane[i % 8] += static_cast<double>(y) * y;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// Note [A case per ISA] (offload/adam_test_vectors.h): one case per kernel
// path, skipped with its reason where this CPU lacks it.
class HostKernelsIsaTest : public PerIsaTest {};
INSTANTIATE_TEST_SUITE_P(EveryIsa, HostKernelsIsaTest,
                         ::testing::ValuesIn(every_isa()), isa_case_name);
class HostKernelsMissingIsaTest : public PerMissingIsaTest {};
INSTANTIATE_TEST_SUITE_P(EveryIsa, HostKernelsMissingIsaTest,
                         ::testing::ValuesIn(vector_isas()), isa_case_name);

TEST_P(HostKernelsIsaTest, GivesTheBitsOfTheDocumentedOrder) {
  const Isa isa = GetParam();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 48; ++n) lengths.push_back(n);
  for (size_t n : {255, 256, 257, 271, 272, 273, 279, 280, 287, 288, 289, 303,
                   304, 1003, 4099, 100003})
    lengths.push_back(n);
  for (size_t n : lengths) {
    std::vector<float> x(n);
    for (float& v : x) v = std::ldexp(mantissa(rng), exponent(rng));
    for (float first : {1.0f, 3.0f})
      for (float second : {1.0f, 7.0f}) {
        SCOPED_TRACE("n=" + std::to_string(n) +
                     " first=" + std::to_string(first) +
                     " second=" + std::to_string(second));
        std::vector<float> want_x = x;
        const double want = reference_squares(want_x, first, second);
        std::vector<float> got_x = x;
        const double got = internal::host_divide_and_sum_of_squares(
            got_x.data(), n, first, second, isa);
        EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
            << got << " != " << want;
        EXPECT_EQ(std::memcmp(got_x.data(), want_x.data(), n * 4), 0);
        if (first == 1.0f && second == 1.0f) {
          const double plain = internal::host_sum_of_squares(x.data(), n, isa);
          EXPECT_EQ(std::memcmp(&plain, &want, sizeof plain), 0);
        }
      }
  }
}

TEST_P(HostKernelsMissingIsaTest, RefusesAnIsaTheCpuLacks) {
  float x[4] = {1, 2, 3, 4};
  EXPECT_THROW(internal::host_sum_of_squares(x, 4, GetParam()), UsageError);
}

TEST(HostKernelsTest, ScalarSumOfSquares) {
  float x[4] = {1, 2, 3, 4};
  EXPECT_EQ(internal::host_sum_of_squares(x, 4, Isa::kScalar), 30.0);
}

// Note [Zeroing around the caches]: from 64 MiB on, zero() streams whole
// lines and memsets the partial ones at either end. Every float of the
// span becomes +0.0f and none outside it changes, at every alignment of
// the start (so every length of the partial lines at both ends), both
// sides of the threshold, with each ISA's streaming stores.
// kAvx512 streams with AVX-512, the others with SSE; kAuto is zero().
class HostZeroIsaTest : public PerIsaTest {};
INSTANTIATE_TEST_SUITE_P(EveryIsa, HostZeroIsaTest,
                         ::testing::Values(Isa::kAuto, Isa::kAvx2,
                                           Isa::kAvx512),
                         isa_case_name);

TEST_P(HostZeroIsaTest, ClearsExactlyItsSpanAtEveryAlignment) {
  const Isa isa = GetParam();
  const size_t threshold = (size_t{64} << 20) / sizeof(float);
  std::vector<float> buf(threshold + 64);
  const std::vector<float> zeros(buf.size(), 0.0f);
  const std::vector<float> marks(buf.size(), -3.5f);
  for (size_t n : {threshold - 1, threshold, threshold + 17})
    for (size_t start = 0; start < 16; ++start) {
      std::fill(buf.begin(), buf.end(), -3.5f);
      const size_t len = std::min(n, buf.size() - start - 1);
      if (isa == Isa::kAuto)
        host_kernels().zero(buf.data() + start, len);
      else
        internal::host_zero(buf.data() + start, len, isa);
      const size_t end = start + len;
      EXPECT_EQ(std::memcmp(buf.data(), marks.data(), start * 4), 0)
          << "before the span: n=" << len << " start=" << start;
      EXPECT_EQ(std::memcmp(buf.data() + start, zeros.data(), len * 4), 0)
          << "in the span: n=" << len << " start=" << start;
      EXPECT_EQ(
          std::memcmp(buf.data() + end, marks.data(), (buf.size() - end) * 4),
          0)
          << "after the span: n=" << len << " start=" << start;
    }
}

}  // namespace
}  // namespace zerostep
