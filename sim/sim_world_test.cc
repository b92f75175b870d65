#include "sim/sim_world.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>

#include "comm/conformance.h"
#include "common/errors.h"

namespace zerostep {
namespace {

class SimRunner : public ConformanceRunner {
 public:
  void run(int world_size, const RankBody& body) override {
    SimWorld world({world_size, /*seed=*/1});
    world.run([&](int r) { body(world.comm(r)); });
  }
  std::vector<int> world_sizes() const override { return {1, 2, 3, 4, 8}; }
};

const bool registered = [] {
  register_communicator_conformance(
      "sim", [] { return std::make_unique<SimRunner>(); });
  return true;
}();

TEST(SimWorldTest, MismatchedCollectiveIsAnErrorOnEveryRank) {
  SimWorld world({3, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    std::vector<float> x(r == 2 ? 8 : 4, 1.0f);
    world.comm(r).all_reduce(Buffer::of(x.data(), x.size()), {});
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("mismatched collective #0"), std::string::npos)
          << what;
      EXPECT_NE(what.find("rank 2 called all_reduce(sum, float32 x 8)"),
                std::string::npos)
          << what;
    }
  }
}

TEST(SimWorldTest, DifferentOpsOnDifferentRanksAreAMismatchNotAHang) {
  SimWorld world({2, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    std::vector<float> x(4, 1.0f), y(2);
    if (r == 0) {
      world.comm(r).all_reduce(Buffer::of(x.data(), 4), {});
    } else {
      world.comm(r).reduce_scatter(Buffer::of(x.data(), 4),
                                   Buffer::of(y.data(), 2), {});
    }
  });
  EXPECT_TRUE(errors[0]);
  EXPECT_TRUE(errors[1]);
}

TEST(SimWorldTest, RankThatFailsReleasesEveryWaitingRank) {
  SimWorld world({4, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    if (r == 1) throw UsageError("rank 1 gave up");
    float x = 1;
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
  });
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(errors[r]) << r;
  try {
    std::rethrow_exception(errors[0]);
  } catch (const CommError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("rank 1 left the world"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 gave up"), std::string::npos) << what;
  }
  // run() reports the root cause, not a consequence.
  EXPECT_THROW(world.run([&](int r) {
    if (r == 1) throw UsageError("rank 1 gave up");
    float x = 1;
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
  }),
               UsageError);
}

TEST(SimWorldTest, RankThatReturnsEarlyIsReportedByTheOthers) {
  SimWorld world({2, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    if (r == 0) return;
    world.comm(r).barrier();
  });
  EXPECT_FALSE(errors[0]);
  ASSERT_TRUE(errors[1]);
  EXPECT_THROW(std::rethrow_exception(errors[1]), CommError);
}

TEST(SimWorldTest, ReductionIsInRankOrderAndIdenticalOnEveryRank) {
  // Values chosen so that float addition order matters: (a+b)+c != a+(b+c).
  const float vals[3] = {1e8f, -1e8f, 1.0f};
  SimWorld world({3, 7});
  std::vector<float> out(3);
  world.run([&](int r) {
    float x = vals[r];
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
    out[r] = x;
  });
  const float expect = (vals[0] + vals[1]) + vals[2];
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r], expect);
}

TEST(SimWorldTest, ResultsDoNotDependOnThreadScheduling) {
  std::vector<uint32_t> first;
  for (int trial = 0; trial < 5; ++trial) {
    SimWorld world({4, 7});
    std::vector<std::vector<float>> outs(4);
    world.run([&](int r) {
      std::mt19937 rng(100 + r);  // per-rank data, same every trial
      std::normal_distribution<float> nd;
      std::vector<float> x(257);
      for (float& v : x) v = nd(rng);
      // Jitter the arrival order differently each trial.
      for (int spin = 0; spin < (trial * 7 + r * 13) % 5 * 1000; ++spin)
        std::atomic_signal_fence(std::memory_order_seq_cst);
      world.comm(r).all_reduce(Buffer::of(x.data(), x.size()),
                               {ReduceOp::kAvg, Phase::kStep});
      outs[r] = x;
    });
    std::vector<uint32_t> bits(outs[0].size());
    std::memcpy(bits.data(), outs[0].data(), bits.size() * 4);
    for (int r = 1; r < 4; ++r) ASSERT_EQ(outs[r], outs[0]);
    if (trial == 0) first = bits;
    EXPECT_EQ(bits, first) << "trial " << trial;
  }
}

TEST(SimWorldTest, LedgerRecordsOpBytesAndPhase) {
  SimWorld world({2, 7});
  world.run([&](int r) {
    std::vector<float> g(10), p(5);
    world.comm(r).all_reduce(Buffer::of(g.data(), 10),
                             {ReduceOp::kAvg, Phase::kBackward});
    world.comm(r).all_gather(Buffer::of(p.data(), 5), Buffer::of(g.data(), 10),
                             {Phase::kStep});
  });
  const Ledger& l = world.ledger(1);
  ASSERT_EQ(l.entries().size(), 2u);
  EXPECT_EQ(l.entries()[0].kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(l.entries()[0].bytes, 40u);
  EXPECT_EQ(l.entries()[0].wire_bytes, 40u);  // 2(W-1)/W * 40
  EXPECT_EQ(l.entries()[1].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(l.bytes_in(Phase::kBackward), 40u);
  EXPECT_EQ(l.bytes_in(Phase::kStep), 40u);
}

TEST(SimWorldTest, ZeroRanksIsRejected) {
  EXPECT_THROW(SimWorld({0, 1}), UsageError);
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

TEST(SimWorldTest, ReduceScatterIntoItsOwnInputIsRejected) {
  SimWorld world({2, 7});
  EXPECT_THROW(world.run([&](int r) {
    std::vector<float> buf(8, 1.0f);
    world.comm(r).reduce_scatter(Buffer::of(buf.data(), 8),
                                 Buffer::of(buf.data() + 4, 4), {});
  }),
               UsageError);
}

}  // namespace
}  // namespace zerostep
