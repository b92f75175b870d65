#include "comm/ledger.h"

#include <gtest/gtest.h>

#include "sim/sim_world.h"

namespace zerostep {
namespace {

TEST(LedgerTest, WireBytesFollowTheRingFormulas) {
  SimWorld world({4, 1});
  world.run([&](int r) {
    std::vector<float> full(400), part(100);
    Communicator& c = world.comm(r);
    c.all_reduce(Buffer::of(full.data(), 400), {});
    c.reduce_scatter(Buffer::of(full.data(), 400), Buffer::of(part.data(), 100),
                     {});
    c.all_gather(Buffer::of(part.data(), 100), Buffer::of(full.data(), 400),
                 {});
  });
  const auto& e = world.ledger(0).entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].wire_bytes, 2u * 3 * 1600 / 4);
  EXPECT_EQ(e[1].wire_bytes, 3u * 1600 / 4);
  EXPECT_EQ(e[2].wire_bytes, 3u * 1600 / 4);
  EXPECT_EQ(world.ledger(0).total_bytes(), 3u * 1600);
  EXPECT_EQ(world.ledger(0).total_wire_bytes(), 4u * 3 * 1600 / 4);
  EXPECT_EQ(e[2].seq, 2);
}

}  // namespace
}  // namespace zerostep
