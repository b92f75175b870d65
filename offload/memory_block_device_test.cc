#include "offload/memory_block_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "common/errors.h"
#include "offload/block_device.h"

namespace zerostep {
namespace {

TEST(MemoryBlockDeviceTest, RoundTripAndDeferredCompletion) {
  MemoryBlockDevice dev("/sim/rank0.swap");
  EXPECT_EQ(dev.size(), 0u);
  dev.reserve(3 * kBlockAlign - 100);  // rounded up
  EXPECT_EQ(dev.size(), 3 * kBlockAlign);

  AlignedBuffer out(2 * kBlockAlign), in(2 * kBlockAlign);
  std::memset(out.data(), 0x11, out.size());
  const IoTicket w = dev.submit_write(kBlockAlign, out.data(), out.size());
  EXPECT_FALSE(dev.poll(w));
  // Deferred: the write copies the buffer when it executes, at wait().
  std::memset(out.data(), 0x22, out.size());
  EXPECT_EQ(dev.medium()[kBlockAlign], 0);
  const IoTicket r = dev.submit_read(kBlockAlign, in.data(), in.size());
  EXPECT_EQ(dev.in_flight(), 2u);
  EXPECT_EQ(in.data()[0], 0);  // nothing read yet
  dev.wait(r);                 // executes w, then r
  EXPECT_TRUE(dev.poll(w));
  EXPECT_EQ(in.data()[0], 0x22);
  EXPECT_EQ(in.data()[in.size() - 1], 0x22);
  dev.wait(w);
  EXPECT_EQ(dev.in_flight(), 0u);
  EXPECT_THROW(dev.wait(w), UsageError);  // retired
  EXPECT_THROW(dev.poll(12345), UsageError);
}

TEST(MemoryBlockDeviceTest, FlushRetiresEverything) {
  MemoryBlockDevice dev("m");
  dev.reserve(kBlockAlign);
  AlignedBuffer b(kBlockAlign);
  std::memset(b.data(), 7, b.size());
  const IoTicket t = dev.submit_write(0, b.data(), b.size());
  dev.flush();
  EXPECT_EQ(dev.flush_count(), 1u);
  EXPECT_EQ(dev.in_flight(), 0u);
  EXPECT_EQ(dev.medium()[10], 7);
  EXPECT_THROW(dev.wait(t), UsageError);
}

TEST(MemoryBlockDeviceTest, ContractViolationsAreUsageErrors) {
  MemoryBlockDevice dev("/sim/x");
  dev.reserve(2 * kBlockAlign);
  AlignedBuffer b(2 * kBlockAlign);
  EXPECT_THROW(dev.submit_read(100, b.data(), kBlockAlign), UsageError);
  EXPECT_THROW(dev.submit_read(0, b.data() + 8, kBlockAlign), UsageError);
  EXPECT_THROW(dev.submit_write(0, b.data(), 100), UsageError);
  EXPECT_THROW(dev.submit_write(0, b.data(), 0), UsageError);
  try {
    dev.submit_read(kBlockAlign, b.data(), 2 * kBlockAlign);
    FAIL() << "read past the end accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("/sim/x"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("reserve"), std::string::npos);
  }
}

TEST(MemoryBlockDeviceTest, ReserveBeyondCapacityIsNoSpace) {
  MemoryBlockDevice dev("/nvme/rank3.swap", 8 * kBlockAlign);
  dev.reserve(8 * kBlockAlign);
  try {
    dev.reserve(9 * kBlockAlign);
    FAIL() << "no ENOSPC";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/nvme/rank3.swap"), std::string::npos) << m;
    EXPECT_NE(m.find("No space left on device"), std::string::npos) << m;
    EXPECT_NE(m.find("nvme_path"), std::string::npos) << m;  // the fix
  }
  EXPECT_EQ(dev.size(), 8 * kBlockAlign);
}

}  // namespace
}  // namespace zerostep
