#include "comm/ledger.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace zerostep {
namespace {

// A rank of a world of `world_size` whose collectives move nothing: the
// ledger counts what was asked for, not what arrived, so one rank and no
// peers are enough (and comm's tests need no backend from a higher package).
class NullCommunicator final : public Communicator {
 public:
  explicit NullCommunicator(int world_size, bool device = false)
      : world_size_(world_size), device_(device) {}
  int rank() const override { return 0; }
  bool overlaps_async() const override { return device_; }
  bool reads_device_memory() const override { return device_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "null"; }
  void all_reduce(Buffer, const AllReduceOptions&) override {}
  void reduce_scatter(Buffer, Buffer, const ReduceScatterOptions&) override {}
  void all_gather(Buffer, Buffer, const AllGatherOptions&) override {}
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer, Buffer, const ReduceScatterOptions&) override {
    return std::make_shared<CompletedWork>();
  }
  void broadcast(Buffer, const BroadcastOptions&) override {}
  void barrier() override {}

 private:
  int world_size_;
  bool device_;
};

// The recorder is transparent: an engine over it sees the backend's own
// abilities (an NCCL backend must not be staged through host copies, and
// it prefetches).
TEST(LedgerTest, TheRecorderReportsWhatItsBackendCanDo) {
  for (bool device : {false, true}) {
    NullCommunicator inner(2, device);
    Ledger l;
    RecordingCommunicator c(&inner, &l);
    EXPECT_EQ(c.reads_device_memory(), device);
    EXPECT_EQ(c.overlaps_async(), device);
  }
}

TEST(LedgerTest, WireBytesFollowTheRingFormulas) {
  NullCommunicator inner(4);
  Ledger ledger;
  RecordingCommunicator c(&inner, &ledger);
  std::vector<float> full(400), part(100);
  c.all_reduce(Buffer::of(full.data(), 400), {});
  c.reduce_scatter(Buffer::of(full.data(), 400), Buffer::of(part.data(), 100),
                   {});
  c.all_gather(Buffer::of(part.data(), 100), Buffer::of(full.data(), 400), {});
  const auto& e = ledger.entries();
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].wire_bytes, 2u * 3 * 1600 / 4);
  EXPECT_EQ(e[1].wire_bytes, 3u * 1600 / 4);
  EXPECT_EQ(e[2].wire_bytes, 3u * 1600 / 4);
  EXPECT_EQ(ledger.total_bytes(), 3u * 1600);
  EXPECT_EQ(ledger.total_wire_bytes(), 4u * 3 * 1600 / 4);
  EXPECT_EQ(e[2].seq, 2);
}

// Labels are opaque to comm: recorded as given, grouped by their text (two
// arrays with the same text are one label), defaults as documented.
TEST(LedgerTest, RecordsLabelsAndGroupsThemByText) {
  static constexpr char kWarmup[] = "warmup";
  static const char kWarmupCopy[] = "warmup";
  NullCommunicator inner(2);
  Ledger l;
  RecordingCommunicator c(&inner, &l);
  std::vector<float> full(8), part(4);
  c.all_reduce(Buffer::of(full.data(), 8), {ReduceOp::kSum, kWarmup});
  c.all_gather(Buffer::of(part.data(), 4), Buffer::of(full.data(), 8),
               {kWarmupCopy});
  c.all_reduce(Buffer::of(full.data(), 8), {});
  c.broadcast(Buffer::of(full.data(), 8), {});
  c.barrier();
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
