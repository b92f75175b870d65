#include "sim/reduction.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace zerostep {
namespace {

// One vector per rank, and the Buffers that borrow them.
template <typename T>
std::vector<Buffer> buffers(std::vector<std::vector<T>>& ranks) {
  std::vector<Buffer> b;
  for (std::vector<T>& v : ranks) b.push_back(Buffer::of(v.data(), v.size()));
  return b;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// Note [Reduction order]: float addition is not associative; rank order
// ((x0 + x1) + x2) gives 0 here, every other order gives 1.
TEST(ReductionTest, AllReduceSumsInRankOrder) {
  std::vector<std::vector<float>> ranks = {{1e8f}, {1.0f}, {-1e8f}};
  std::vector<unsigned char> scratch;
  all_reduce_in_rank_order(buffers(ranks), ReduceOp::kSum, &scratch);
  for (const std::vector<float>& v : ranks) EXPECT_EQ(v[0], 0.0f);

  std::vector<std::vector<float>> reordered = {{1e8f}, {-1e8f}, {1.0f}};
  all_reduce_in_rank_order(buffers(reordered), ReduceOp::kSum, &scratch);
  for (const std::vector<float>& v : reordered) EXPECT_EQ(v[0], 1.0f);
}

// Bit for bit the sequential fold acc = x0; acc += x1; ...; acc /= W (a
// division, not a multiplication by 1/W), on every rank.
TEST(ReductionTest, AllReduceIsTheSequentialFoldBitForBit) {
  const int w = 3;
  const size_t n = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1e3f);
  std::vector<std::vector<float>> ranks(w, std::vector<float>(n));
  for (auto& v : ranks)
    for (float& x : v) x = dist(rng);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    std::vector<std::vector<float>> got = ranks;
    std::vector<unsigned char> scratch;
    all_reduce_in_rank_order(buffers(got), op, &scratch);
    int differs_from_reciprocal = 0;
    for (size_t i = 0; i < n; ++i) {
      float sum = ranks[0][i];
      for (int r = 1; r < w; ++r) sum = sum + ranks[r][i];
      const float expect = op == ReduceOp::kAvg ? sum / 3.0f : sum;
      differs_from_reciprocal += !same_bits(sum / 3.0f, sum * (1.0f / 3.0f));
      for (int r = 0; r < w; ++r)
        ASSERT_TRUE(same_bits(got[r][i], expect))
            << to_string(op) << " rank " << r << " element " << i;
    }
    // The data tells the division from a multiplication by 1/3.
    EXPECT_GT(differs_from_reciprocal, 0);
  }
}

TEST(ReductionTest, AllReduceMaxAndMinOverIntegersAndDoubles) {
  std::vector<std::vector<int64_t>> ints = {{3, -7}, {9, -2}, {-4, 5}};
  std::vector<unsigned char> scratch;
  all_reduce_in_rank_order(buffers(ints), ReduceOp::kMax, &scratch);
  for (const auto& v : ints) EXPECT_EQ(v, (std::vector<int64_t>{9, 5}));
  std::vector<std::vector<double>> dbl = {{0.5, 2.0}, {-1.5, 4.0}};
  all_reduce_in_rank_order(buffers(dbl), ReduceOp::kMin, &scratch);
  for (const auto& v : dbl) EXPECT_EQ(v, (std::vector<double>{-1.5, 2.0}));
}

// Scratch grows to the largest call and is reused after it. Five ranks:
// up to four reduce in place, without scratch (Note [In-place all-reduce]).
TEST(ReductionTest, ScratchGrowsAndIsNotShrunk) {
  std::vector<unsigned char> scratch;
  std::vector<std::vector<double>> big(5, std::vector<double>(64, 1.0));
  all_reduce_in_rank_order(buffers(big), ReduceOp::kSum, &scratch);
  EXPECT_EQ(scratch.size(), 64 * sizeof(double));
  std::vector<std::vector<double>> small = {{1.0}, {2.0}, {3.0}, {4.0}, {5.0}};
  all_reduce_in_rank_order(buffers(small), ReduceOp::kSum, &scratch);
  EXPECT_EQ(scratch.size(), 64 * sizeof(double));
  for (const std::vector<double>& r : small) EXPECT_EQ(r[0], 15.0);

  std::vector<unsigned char> unused;
  std::vector<std::vector<double>> two(2, std::vector<double>(64, 1.0));
  all_reduce_in_rank_order(buffers(two), ReduceOp::kSum, &unused);
  EXPECT_EQ(unused.size(), 0u) << "two ranks reduce in place";
  EXPECT_EQ(two[1][63], 2.0);
}

// Ranks whose buffers overlap (the same memory, or part of it) are not
// reduced in place (Note [In-place all-reduce]): every element of a chunk
// is read from every rank before any is written, so each rank gets the
// fold of the values as they were.
TEST(ReductionTest, AllReduceOfOverlappingBuffersFoldsTheValuesAsTheyWere) {
  std::vector<float> shared = {1, 2, 3, 4};
  std::vector<float> own = {10, 20, 30, 40};
  std::vector<Buffer> same = {Buffer::of(shared.data(), 4),
                              Buffer::of(own.data(), 4),
                              Buffer::of(shared.data(), 4)};
  std::vector<unsigned char> scratch;
  all_reduce_in_rank_order(same, ReduceOp::kSum, &scratch);
  EXPECT_EQ(shared, (std::vector<float>{12, 24, 36, 48}));
  EXPECT_EQ(own, (std::vector<float>{12, 24, 36, 48}));

  // Buffers that overlap by half: element i is wide[i] + wide[i + 2] as
  // they were, {4, 6, 8, 10}, written to rank 0's then rank 1's elements,
  // so rank 1's copy is what the shared bytes hold. Reduced in place, the
  // fold of element 2 would read the 4 just written to wide[2].
  std::vector<float> wide = {1, 2, 3, 4, 5, 6};
  std::vector<Buffer> halves = {Buffer::of(wide.data(), 4),
                                Buffer::of(wide.data() + 2, 4)};
  all_reduce_in_rank_order(halves, ReduceOp::kSum, &scratch);
  EXPECT_EQ(wide, (std::vector<float>{4, 6, 4, 6, 8, 10}));
}

// Rank r receives chunk r reduced over the ranks, in rank order.
TEST(ReductionTest, ReduceScatterGivesEachRankItsChunkInRankOrder) {
  // Chunk 0 is the order-sensitive sum above; chunk 1..2 small integers.
  std::vector<std::vector<float>> in = {
      {1e8f, 1, 2}, {1.0f, 10, 20}, {-1e8f, 100, 200}};
  std::vector<std::vector<float>> out(3, std::vector<float>(1, -1.0f));
  reduce_scatter_in_rank_order(buffers(in), buffers(out), ReduceOp::kSum);
  EXPECT_EQ(out[0][0], 0.0f);
  EXPECT_EQ(out[1][0], 111.0f);
  EXPECT_EQ(out[2][0], 222.0f);
  // The inputs are read, not written.
  EXPECT_EQ(in[1], (std::vector<float>{1.0f, 10, 20}));

  std::vector<std::vector<float>> avg = {{2, 4}, {4, 8}};
  std::vector<std::vector<float>> half(2, std::vector<float>(1));
  reduce_scatter_in_rank_order(buffers(avg), buffers(half), ReduceOp::kAvg);
  EXPECT_EQ(half[0][0], 3.0f);
  EXPECT_EQ(half[1][0], 6.0f);
}

// The per-element definition of Note [Reduction order], written without
// chunks: acc = x0; acc = acc (op) x1; ...; kAvg then divides by W.
template <typename T>
T reference_element(const std::vector<std::vector<T>>& in, size_t i,
                    ReduceOp op) {
  T acc = in[0][i];
  for (size_t r = 1; r < in.size(); ++r) {
    const T x = in[r][i];
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = acc + x;
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, x);
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, x);
        break;
    }
  }
  if (op == ReduceOp::kAvg) acc = acc / static_cast<T>(in.size());
  return acc;
}

template <typename T>
std::vector<std::vector<T>> random_ranks(int world, size_t n,
                                         std::mt19937* rng) {
  std::vector<std::vector<T>> ranks(world, std::vector<T>(n));
  std::uniform_int_distribution<int64_t> ints(-1000000, 1000000);
  std::normal_distribution<double> reals(0.0, 1e3);
  for (std::vector<T>& v : ranks)
    for (T& x : v)
      x = std::is_integral<T>::value ? static_cast<T>(ints(*rng))
                                     : static_cast<T>(reals(*rng));
  return ranks;
}

// Every rank's all-reduce result `got` has reference_element's bits.
template <typename T>
testing::AssertionResult all_reduced(const std::vector<std::vector<T>>& in,
                                     const std::vector<std::vector<T>>& got,
                                     ReduceOp op) {
  for (size_t i = 0; i < in[0].size(); ++i) {
    const T expect = reference_element(in, i, op);
    for (size_t r = 0; r < got.size(); ++r)
      if (std::memcmp(&got[r][i], &expect, sizeof(T)) != 0)
        return testing::AssertionFailure()
               << "all_reduce rank " << r << " element " << i;
  }
  return testing::AssertionSuccess();
}

// Every rank's reduce-scatter output `out` has reference_element's bits of
// its chunk of the inputs.
template <typename T>
testing::AssertionResult reduce_scattered(
    const std::vector<std::vector<T>>& in,
    const std::vector<std::vector<T>>& out, ReduceOp op) {
  for (size_t r = 0; r < out.size(); ++r)
    for (size_t i = 0; i < out[r].size(); ++i) {
      const T expect = reference_element(in, r * out[r].size() + i, op);
      if (std::memcmp(&out[r][i], &expect, sizeof(T)) != 0)
        return testing::AssertionFailure()
               << "reduce_scatter rank " << r << " element " << i;
    }
  return testing::AssertionSuccess();
}

// Bitwise comparison of the chunked all-reduce and reduce-scatter (Note
// [Chunked reduction] in sim/reduction.cc) against reference_element, at
// sizes that are not multiples of the 16 KiB chunk: one element, just
// under, over and well past one chunk of each dtype.
template <typename T>
void expect_chunked_matches_reference() {
  std::mt19937 rng(16);
  for (int world : {1, 2, 3, 5, 8}) {
    for (size_t n :
         {size_t{1}, size_t{1023}, size_t{2049}, size_t{4097}, size_t{12289}}) {
      for (ReduceOp op :
           {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        SCOPED_TRACE(testing::Message() << "world " << world << " numel " << n
                                        << " " << to_string(op));
        const std::vector<std::vector<T>> in = random_ranks<T>(world, n, &rng);
        std::vector<std::vector<T>> got = in;
        std::vector<unsigned char> scratch;
        all_reduce_in_rank_order(buffers(got), op, &scratch);
        ASSERT_TRUE(all_reduced(in, got, op));

        // Reduce-scatter: every input holds world chunks of n elements.
        const size_t per_rank = n;
        std::vector<std::vector<T>> rs_in =
            random_ranks<T>(world, per_rank * world, &rng);
        std::vector<std::vector<T>> rs_out(world, std::vector<T>(per_rank));
        reduce_scatter_in_rank_order(buffers(rs_in), buffers(rs_out), op);
        ASSERT_TRUE(reduce_scattered(rs_in, rs_out, op));
      }
    }
  }
}

TEST(ReductionTest, ChunkedFloat32MatchesThePerElementFoldBitForBit) {
  expect_chunked_matches_reference<float>();
}

TEST(ReductionTest, ChunkedFloat64MatchesThePerElementFoldBitForBit) {
  expect_chunked_matches_reference<double>();
}

TEST(ReductionTest, ChunkedInt64MatchesThePerElementFoldBitForBit) {
  expect_chunked_matches_reference<int64_t>();
}

// ----- kAvg over a power of two: Note [Finishing in the last pass] -----------

// Float bit patterns from every exponent (a stride through all 2^32), every
// subnormal and small normal at the bottom of the range with both signs,
// and the specials.
std::vector<float> float_patterns() {
  std::vector<uint32_t> bits;
  for (uint32_t k = 0; k < (1u << 20); ++k) bits.push_back(k * 4099u + 17u);
  for (uint32_t k = 0; k < (1u << 24); k += 5) {
    bits.push_back(k);
    bits.push_back(k | 0x80000000u);
  }
  for (uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                     0xffc12345u, 0x7f7fffffu, 0x00000001u, 0x00800000u})
    bits.push_back(b);
  std::vector<float> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * sizeof(float));
  return out;
}

// Double bit patterns: random ones (every exponent), and the bottom of the
// range (subnormals into the normals) with both signs, and the specials.
std::vector<double> double_patterns() {
  std::mt19937_64 rng(2);
  std::vector<uint64_t> bits;
  for (int k = 0; k < (1 << 20); ++k) bits.push_back(rng());
  for (uint64_t k = 0; k < (uint64_t{1} << 20); ++k) {
    const uint64_t b = k * 0x1000000000001ull % (uint64_t{1} << 54);
    bits.push_back(b);
    bits.push_back(b | (uint64_t{1} << 63));
  }
  for (uint64_t b :
       {0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull,
        0x7ff0000000000001ull, 0x0000000000000001ull, 0x0010000000000000ull})
    bits.push_back(b);
  std::vector<double> out(bits.size());
  std::memcpy(out.data(), bits.data(), bits.size() * sizeof(double));
  return out;
}

// kAvg over W = 2, 4, 8 and 16 ranks multiplies by 1 / W instead of
// dividing; the result must be a true division's bits for every value,
// subnormal results, infinities and NaNs included. Rank 0 holds the
// patterns and every other rank -0.0, so the rank-order sum is the pattern
// itself (x + -0.0 == x for every x, a NaN quieted), and the expected
// element is that sum divided by W through a volatile divisor, which the
// compiler cannot turn into a multiplication. W = 2 and 4 reduce in place
// (Note [In-place all-reduce]), 8 and 16 in chunks; reduce-scatter goes
// through rank_order::reduce.
template <typename T>
void expect_power_of_two_average_divides(const std::vector<T>& patterns) {
  for (int world : {2, 4, 8, 16}) {
    SCOPED_TRACE(testing::Message() << "world " << world);
    const size_t n = patterns.size() / world * world;
    std::vector<std::vector<T>> in(world, std::vector<T>(n, T(-0.0)));
    std::copy(patterns.begin(), patterns.begin() + n, in[0].begin());
    volatile T divisor = static_cast<T>(world);
    std::vector<T> expect(n);
    for (size_t i = 0; i < n; ++i) {
      T sum = in[0][i];
      for (int r = 1; r < world; ++r) sum = sum + in[r][i];
      expect[i] = sum / divisor;
    }
    const auto mismatch = [&](const T* got, size_t count, size_t first) {
      for (size_t i = 0; i < count; ++i)
        if (std::memcmp(&got[i], &expect[first + i], sizeof(T)) != 0)
          return testing::AssertionFailure()
                 << "element " << first + i << ": got " << got[i]
                 << ", a division gives " << expect[first + i];
      return testing::AssertionSuccess();
    };

    std::vector<std::vector<T>> all = in;
    std::vector<unsigned char> scratch;
    all_reduce_in_rank_order(buffers(all), ReduceOp::kAvg, &scratch);
    for (int r = 0; r < world; ++r)
      ASSERT_TRUE(mismatch(all[r].data(), n, 0)) << "all_reduce rank " << r;

    std::vector<std::vector<T>> rs_in = in;
    std::vector<std::vector<T>> rs_out(world, std::vector<T>(n / world));
    reduce_scatter_in_rank_order(buffers(rs_in), buffers(rs_out),
                                 ReduceOp::kAvg);
    for (int r = 0; r < world; ++r)
      ASSERT_TRUE(mismatch(rs_out[r].data(), n / world, r * (n / world)))
          << "reduce_scatter rank " << r;
  }
}

TEST(ReductionTest, Float32AverageOverAPowerOfTwoIsTheDivisionBitForBit) {
  expect_power_of_two_average_divides(float_patterns());
}

TEST(ReductionTest, Float64AverageOverAPowerOfTwoIsTheDivisionBitForBit) {
  expect_power_of_two_average_divides(double_patterns());
}

// Buffers just over 16 MiB take the chunked path even at 2 to 4 ranks
// (Note [In-place all-reduce]); it folds to the same bits. World 3 and 4,
// kAvg (a division, then a multiplication) and kMax.
TEST(ReductionTest, AllReduceAboveTheInPlaceLimitIsThePerElementFold) {
  std::mt19937 rng(9);
  const size_t n = (size_t{16} << 20) / sizeof(float) + 5;
  for (int world : {3, 4}) {
    const std::vector<std::vector<float>> in =
        random_ranks<float>(world, n, &rng);
    for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMax}) {
      SCOPED_TRACE(testing::Message()
                   << "world " << world << " " << to_string(op));
      std::vector<std::vector<float>> got = in;
      std::vector<unsigned char> scratch;
      all_reduce_in_rank_order(buffers(got), op, &scratch);
      EXPECT_GT(scratch.size(), 0u) << "the chunked path's accumulator";
      ASSERT_TRUE(all_reduced(in, got, op));
    }
  }
}

// ----- Parts: Note [Parallel reduction] in sim/reduction.cc ------------------

// The elements of one part: 256 KiB of index space.
template <typename T>
constexpr size_t kPartElements = (size_t{256} << 10) / sizeof(T);

// Runs every part of the reduction once, last part first, each with a
// scratch of its own: neither the order of the parts nor a shared scratch
// may matter. Returns how many parts there were.
size_t reduce_every_part_backwards(CollectiveKind kind, ReduceOp op,
                                   const std::vector<Buffer>& in,
                                   const std::vector<Buffer>& out) {
  const size_t parts = reduction_parts(kind, in, out);
  for (size_t p = parts; p-- > 0;) {
    std::vector<unsigned char> own_scratch;
    reduce_part_in_rank_order(kind, op, in, out, p, &own_scratch);
  }
  return parts;
}

// Sizes around the part and chunk boundaries, none a multiple of either.
template <typename T>
std::vector<size_t> part_test_sizes() {
  const size_t p = kPartElements<T>;
  return {p / 3 + 7, p + 5, 2 * p + p / 2 + 3};
}

// Every part, run separately and backwards, gives reference_element's bits
// on every rank, for every op, world 1 to 8, at sizes that cut chunks and
// parts: the parts cover every element once and fold it in rank order.
template <typename T>
void expect_parts_match_reference() {
  std::mt19937 rng(4);
  for (int world = 1; world <= 8; ++world) {
    for (size_t n : part_test_sizes<T>()) {
      const std::vector<std::vector<T>> in = random_ranks<T>(world, n, &rng);
      // Reduce-scatter: every rank's input holds world outputs of n / world
      // + 1 elements (an index space a little over n).
      const size_t per_rank = n / world + 1;
      const std::vector<std::vector<T>> rs_in =
          random_ranks<T>(world, per_rank * world, &rng);
      for (ReduceOp op :
           {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        SCOPED_TRACE(testing::Message() << "world " << world << " numel " << n
                                        << " " << to_string(op));
        std::vector<std::vector<T>> got = in;
        const size_t parts = reduce_every_part_backwards(
            CollectiveKind::kAllReduce, op, buffers(got), buffers(got));
        EXPECT_EQ(parts, (n + kPartElements<T> - 1) / kPartElements<T>);
        ASSERT_TRUE(all_reduced(in, got, op));

        std::vector<std::vector<T>> rs_got = rs_in;
        std::vector<std::vector<T>> rs_out(world, std::vector<T>(per_rank));
        reduce_every_part_backwards(CollectiveKind::kReduceScatter, op,
                                    buffers(rs_got), buffers(rs_out));
        EXPECT_EQ(rs_got, rs_in) << "the inputs are read, not written";
        ASSERT_TRUE(reduce_scattered(rs_in, rs_out, op));
      }
    }
  }
}

TEST(ReductionPartsTest, Float32PartsMatchThePerElementFoldBitForBit) {
  expect_parts_match_reference<float>();
}

TEST(ReductionPartsTest, Float64PartsMatchThePerElementFoldBitForBit) {
  expect_parts_match_reference<double>();
}

TEST(ReductionPartsTest, Int64PartsMatchThePerElementFoldBitForBit) {
  expect_parts_match_reference<int64_t>();
}

// Every element of every part holds (1e8, 1, -1e8, 0, 0, ...): the rank
// order sum is 0, and a part that folded its ranks in any other order
// (from its own rank, say, or backwards) would give 1 somewhere.
TEST(ReductionPartsTest, EveryPartFoldsInRankOrder) {
  const size_t n = 3 * kPartElements<float> + 11;
  for (int world = 3; world <= 8; ++world) {
    std::vector<std::vector<float>> bufs(world, std::vector<float>(n, 0.0f));
    std::vector<std::vector<float>> rs_out(world,
                                           std::vector<float>(n / world));
    for (size_t i = 0; i < n; ++i) {
      bufs[0][i] = 1e8f;
      bufs[1][i] = 1.0f;
      bufs[2][i] = -1e8f;
    }
    reduce_every_part_backwards(CollectiveKind::kReduceScatter, ReduceOp::kSum,
                                buffers(bufs), buffers(rs_out));
    reduce_every_part_backwards(CollectiveKind::kAllReduce, ReduceOp::kSum,
                                buffers(bufs), buffers(bufs));
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(bufs[r], std::vector<float>(n, 0.0f)) << "world " << world;
      ASSERT_EQ(rs_out[r], std::vector<float>(n / world, 0.0f))
          << "world " << world;
    }
  }
}

// Runs part p alone and records, per element of the index space, which part
// wrote it: every element exactly once, by one part of contiguous elements.
// Positive inputs over at least two ranks make every all-reduce sum differ
// from every input, so a written element shows; a reduce-scatter's outputs
// start as a NaN that no sum of finite values is.
TEST(ReductionPartsTest, PartsCoverEveryElementOnceAndDoNotOverlap) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> positive(1.0f, 2.0f);
  const float unwritten = std::numeric_limits<float>::quiet_NaN();
  for (int world : {2, 3, 8}) {
    for (size_t n : part_test_sizes<float>()) {
      if (n < kPartElements<float>) continue;  // one part
      SCOPED_TRACE(testing::Message() << "world " << world << " numel " << n);
      // Both index spaces are `space` elements: an all-reduce of the
      // inputs, or a reduce-scatter of them into per_rank each.
      const size_t per_rank = n / world + 1;
      const size_t space = per_rank * world;
      std::vector<std::vector<float>> in(world, std::vector<float>(space));
      for (auto& v : in)
        for (float& x : v) x = positive(rng);
      for (CollectiveKind kind :
           {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter}) {
        const bool all_reduce = kind == CollectiveKind::kAllReduce;
        std::vector<int> writer(space, -1);
        std::vector<std::vector<float>> shape_out(
            world, std::vector<float>(per_rank));
        std::vector<std::vector<float>> shape_in = in;
        const size_t parts =
            reduction_parts(kind, buffers(shape_in), buffers(shape_out));
        ASSERT_GT(parts, 1u);
        for (size_t p = 0; p < parts; ++p) {
          std::vector<std::vector<float>> got = in;
          std::vector<std::vector<float>> out(
              world, std::vector<float>(per_rank, unwritten));
          std::vector<unsigned char> scratch;
          reduce_part_in_rank_order(kind, ReduceOp::kSum, buffers(got),
                                    buffers(out), p, &scratch);
          size_t first = space, last = 0;
          for (size_t i = 0; i < space; ++i) {
            // Written on rank 0; an all-reduce writes every rank alike.
            const bool written =
                all_reduce ? got[0][i] != in[0][i]
                           : !std::isnan(out[i / per_rank][i % per_rank]);
            for (int r = 1; all_reduce && r < world; ++r)
              ASSERT_EQ(got[r][i] != in[r][i], written) << "element " << i;
            if (!written) continue;
            ASSERT_EQ(writer[i], -1) << "element " << i << " written by parts "
                                     << writer[i] << " and " << p;
            writer[i] = static_cast<int>(p);
            first = std::min(first, i);
            last = i;
          }
          ASSERT_LE(first, last) << "part " << p << " wrote nothing";
          for (size_t i = first; i <= last; ++i)
            ASSERT_EQ(writer[i], static_cast<int>(p))
                << "part " << p << " is not contiguous at element " << i;
        }
        for (size_t i = 0; i < space; ++i)
          ASSERT_NE(writer[i], -1) << "no part wrote element " << i;
      }
    }
  }
}

// Small collectives, and the kinds that are not reductions, are one part.
TEST(ReductionPartsTest, SmallAndNonReducingCollectivesAreOnePart) {
  std::vector<std::vector<float>> small(8, std::vector<float>(
                                               kPartElements<float>));
  EXPECT_EQ(reduction_parts(CollectiveKind::kAllReduce, buffers(small),
                            buffers(small)),
            1u);
  std::vector<std::vector<float>> big(2, std::vector<float>(
                                             kPartElements<float> + 1));
  EXPECT_EQ(reduction_parts(CollectiveKind::kAllReduce, buffers(big),
                            buffers(big)),
            2u);
  for (CollectiveKind kind :
       {CollectiveKind::kAllGather, CollectiveKind::kBroadcast,
        CollectiveKind::kBarrier})
    EXPECT_EQ(reduction_parts(kind, buffers(big), buffers(big)), 1u);
}

TEST(ReductionTest, AllGatherConcatenatesInRankOrder) {
  std::vector<std::vector<int64_t>> in = {{1, 2}, {3, 4}, {5, 6}};
  std::vector<std::vector<int64_t>> out(3, std::vector<int64_t>(6, -1));
  std::vector<unsigned char> scratch;
  all_gather_in_rank_order(buffers(in), buffers(out), &scratch);
  for (const auto& v : out)
    EXPECT_EQ(v, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

// Each rank's input is its own chunk of its output: the staging keeps
// every rank's chunk intact while the outputs are written.
TEST(ReductionTest, AllGatherFromEachRanksOwnSlice) {
  const int w = 3;
  const size_t n = 2;
  std::vector<std::vector<double>> bufs(w, std::vector<double>(n * w, -1.0));
  std::vector<Buffer> in, out;
  for (int r = 0; r < w; ++r) {
    for (size_t i = 0; i < n; ++i) bufs[r][r * n + i] = 10.0 * r + i;
    in.push_back(Buffer::of(bufs[r].data() + r * n, n));
    out.push_back(Buffer::of(bufs[r].data(), n * w));
  }
  std::vector<unsigned char> scratch;
  all_gather_in_rank_order(in, out, &scratch);
  for (int r = 0; r < w; ++r)
    EXPECT_EQ(bufs[r], (std::vector<double>{0, 1, 10, 11, 20, 21}))
        << "rank " << r;
}

TEST(ReductionTest, BroadcastCopiesTheRootsBuffer) {
  std::vector<std::vector<float>> bufs = {{1, 2}, {3, 4}, {5, 6}};
  broadcast_from_root(buffers(bufs), 1);
  for (const auto& v : bufs) EXPECT_EQ(v, (std::vector<float>{3, 4}));
}

// The dispatch: all_reduce and broadcast in place on the inputs, the others
// into the outputs, a barrier touches nothing.
TEST(ReductionTest, MoveCollectiveDataDispatchesByKind) {
  std::vector<unsigned char> scratch;
  std::vector<std::vector<float>> a = {{1}, {2}};
  move_collective_data(CollectiveKind::kAllReduce, ReduceOp::kSum, 0,
                       buffers(a), buffers(a), &scratch);
  EXPECT_EQ(a, (std::vector<std::vector<float>>{{3}, {3}}));

  std::vector<std::vector<float>> rs_in = {{1, 2}, {3, 4}};
  std::vector<std::vector<float>> rs_out(2, std::vector<float>(1));
  move_collective_data(CollectiveKind::kReduceScatter, ReduceOp::kMax, 0,
                       buffers(rs_in), buffers(rs_out), &scratch);
  EXPECT_EQ(rs_out, (std::vector<std::vector<float>>{{3}, {4}}));

  std::vector<std::vector<float>> ag_in = {{7}, {8}};
  std::vector<std::vector<float>> ag_out(2, std::vector<float>(2));
  move_collective_data(CollectiveKind::kAllGather, ReduceOp::kSum, 0,
                       buffers(ag_in), buffers(ag_out), &scratch);
  EXPECT_EQ(ag_out, (std::vector<std::vector<float>>{{7, 8}, {7, 8}}));

  std::vector<std::vector<int64_t>> b = {{5}, {6}};
  move_collective_data(CollectiveKind::kBroadcast, ReduceOp::kSum, 1,
                       buffers(b), buffers(b), &scratch);
  EXPECT_EQ(b, (std::vector<std::vector<int64_t>>{{6}, {6}}));

  std::vector<std::vector<float>> untouched = {{1}, {2}};
  move_collective_data(CollectiveKind::kBarrier, ReduceOp::kSum, 0,
                       buffers(untouched), buffers(untouched), &scratch);
  EXPECT_EQ(untouched, (std::vector<std::vector<float>>{{1}, {2}}));
}

}  // namespace
}  // namespace zerostep
