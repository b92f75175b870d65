#include "sim/shape_only_comm.h"

#include <gtest/gtest.h>

#include <functional>

#include "comm/ledger.h"
#include "common/errors.h"

namespace zerostep {
namespace {

// One call sequence, run on any communicator with a compute hook.
void sequence(Communicator& c, const std::function<void(double)>& compute,
              bool with_data) {
  const int w = c.world_size();
  std::vector<float> big(with_data ? 4096 * w : 0), part(with_data ? 4096 : 0);
  auto B = [&](std::vector<float>& v, size_t n) {
    return Buffer{with_data ? static_cast<void*>(v.data()) : nullptr, n,
                  DType::kFloat32};
  };
  compute(1e-4);
  c.broadcast(B(big, 4096 * w), {0, "setup"});
  auto w1 = c.reduce_scatter_async(B(big, 4096 * w), B(part, 4096),
                                   {ReduceOp::kSum, "backward"});
  compute(3e-6);
  auto w2 = c.reduce_scatter_async(B(big, 4096 * w), B(part, 4096),
                                   {ReduceOp::kSum, "backward"});
  compute(2e-3);
  w1->wait();
  w2->wait();
  c.all_reduce(B(big, 4096 * w), {ReduceOp::kAvg, "step"});
  compute(5e-5);
  c.all_gather(B(part, 4096), B(big, 4096 * w), {"step"});
  c.barrier();
}

// Note [Symmetric ranks]: one shape-only rank keeps SimWorld's clock.
TEST(ShapeOnlyCommTest, ClockEqualsSimWorldsOnTheSameSequence) {
  for (int w : {1, 2, 4, 16}) {
    SimOptions o;
    o.world_size = w;
    SimWorld world(o);
    world.run([&](int r) {
      sequence(
          world.comm(r), [&](double s) { world.compute(r, s); }, true);
    });
    ShapeOnlyCommunicator shape(w, o.cost);
    Ledger ledger;
    RecordingCommunicator rec(&shape, &ledger);
    sequence(
        rec, [&](double s) { shape.compute(s); }, false);
    for (int r = 0; r < w; ++r) {
      EXPECT_DOUBLE_EQ(shape.clock().now_s, world.clock(r).now_s) << w;
      EXPECT_DOUBLE_EQ(shape.clock().comm_s, world.clock(r).comm_s) << w;
      EXPECT_DOUBLE_EQ(shape.clock().exposed_comm_s,
                       world.clock(r).exposed_comm_s)
          << w;
    }
    // The same ledger, entry for entry.
    ASSERT_EQ(ledger.entries().size(), world.ledger(0).entries().size());
    for (size_t i = 0; i < ledger.entries().size(); ++i) {
      const LedgerEntry& a = ledger.entries()[i];
      const LedgerEntry& b = world.ledger(0).entries()[i];
      EXPECT_EQ(a.kind, b.kind);
      EXPECT_EQ(a.bytes, b.bytes);
      EXPECT_EQ(a.wire_bytes, b.wire_bytes);
      EXPECT_STREQ(a.label, b.label);
    }
  }
}

TEST(ShapeOnlyCommTest, SizesAreCheckedWithoutData) {
  ShapeOnlyCommunicator c(4, CostModel{});
  EXPECT_THROW(c.all_gather({nullptr, 3, DType::kFloat32},
                            {nullptr, 10, DType::kFloat32}, {}),
               UsageError);
  EXPECT_THROW(c.reduce_scatter({nullptr, 10, DType::kFloat32},
                                {nullptr, 3, DType::kFloat32}, {}),
               UsageError);
  EXPECT_THROW(ShapeOnlyCommunicator(0, CostModel{}), UsageError);
}

}  // namespace
}  // namespace zerostep
