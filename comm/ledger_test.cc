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

// Labels are opaque to comm: recorded as given, grouped by their text (two
// arrays with the same text are one label), defaults as documented.
TEST(LedgerTest, RecordsLabelsAndGroupsThemByText) {
  static constexpr char kWarmup[] = "warmup";
  static const char kWarmupCopy[] = "warmup";
  SimWorld world({2, 1});
  world.run([&](int r) {
    std::vector<float> full(8), part(4);
    Communicator& c = world.comm(r);
    c.all_reduce(Buffer::of(full.data(), 8), {ReduceOp::kSum, kWarmup});
    c.all_gather(Buffer::of(part.data(), 4), Buffer::of(full.data(), 8),
                 {kWarmupCopy});
    c.all_reduce(Buffer::of(full.data(), 8), {});
    c.broadcast(Buffer::of(full.data(), 8), {});
    c.barrier();
  });
  const Ledger& l = world.ledger(1);
  ASSERT_EQ(l.entries().size(), 5u);
  EXPECT_EQ(l.entries()[0].label, kWarmup);
  EXPECT_EQ(l.entries()[1].label, kWarmupCopy);
  EXPECT_EQ(l.count_in("warmup"), 2u);
  EXPECT_EQ(l.bytes_in("warmup"), 2u * 32);
  EXPECT_STREQ(l.entries()[2].label, "step");
  EXPECT_STREQ(l.entries()[3].label, "setup");
  EXPECT_STREQ(l.entries()[4].label, kBarrierLabel);
  EXPECT_EQ(l.count_in("setup"), 2u);
  EXPECT_EQ(l.bytes_in("setup"), 32u);
  EXPECT_EQ(l.count_in("other"), 0u);
}

}  // namespace
}  // namespace zerostep
