#include "zero/agreement.h"

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "common/errors.h"
#include "sim/sim_world.h"

namespace zerostep {
namespace {

TEST(AgreementTest, BroadcastGivesEveryRankRankZerosParameters) {
  SimWorld sim({3, 1});
  std::vector<std::vector<float>> got(3);
  sim.run([&](int r) {
    got[r] = {float(r), float(r) + 0.5f, -1.0f * r};
    broadcast_initial_parameters(sim.comm(r), got[r].data(), got[r].size());
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(got[r], (std::vector<float>{0.0f, 0.5f, -0.0f})) << r;
}

TEST(AgreementTest, EveryRankRefusesWhenAnyRankIsInsideAWindow) {
  SimWorld sim({3, 1});
  auto errors = sim.run_collect([&](int r) {
    agree_between_windows(sim.comm(r), r == 2 ? 4 : 0, "save_checkpoint()");
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r] != nullptr) << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "save_checkpoint() inside an open accumulation window "
                    "(rank 2 has 4 backward() call(s)"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(AgreementTest, BetweenWindowsPassesWhenEveryRankIsAtZero) {
  SimWorld sim({2, 1});
  sim.run([&](int r) { agree_between_windows(sim.comm(r), 0, "x"); });
}

TEST(AgreementTest, OutcomesArriveInRankOrderAndRootFailureReachesAll) {
  SimWorld sim({3, 1});
  std::vector<std::vector<RankOutcome>> seen(3);
  std::vector<int> root(3, -1);
  sim.run([&](int r) {
    RankOutcome mine;
    mine.failed = r == 1;
    mine.bytes = 100 + r;
    mine.checksum = 0xfeedface00000000ull + r;
    seen[r] = share_outcomes(sim.comm(r), mine);
    // Only rank 0's flag counts.
    root[r] = root_failed(sim.comm(r), r != 0) ? 1 : 0;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(seen[r].size(), 3u);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(seen[r][k].failed, k == 1);
      EXPECT_EQ(seen[r][k].bytes, 100u + k);
      EXPECT_EQ(seen[r][k].checksum, 0xfeedface00000000ull + k);
    }
    EXPECT_EQ(root[r], 0) << r;
  }
}

}  // namespace
}  // namespace zerostep
