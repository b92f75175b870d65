#include "offload/faulty_block_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/errors.h"
#include "offload/block_device.h"
#include "offload/memory_block_device.h"

namespace zerostep {
namespace {

constexpr size_t kBytes = 2 * kBlockAlign;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class FaultyBlockDeviceTest : public ::testing::Test {
 protected:
  FaultyBlockDeviceTest() : medium_("/nvme/rank0.swap") {
    medium_.reserve(4 * kBytes);
  }
  // Writes `value` into every byte of [offset, offset + kBytes) through dev.
  void write(BlockDevice& dev, uint64_t offset, char value) {
    AlignedBuffer b(kBytes);
    std::memset(b.data(), value, kBytes);
    dev.wait(dev.submit_write(offset, b.data(), kBytes));
  }
  // The medium's bytes [offset, offset + kBytes).
  std::string on_medium(uint64_t offset) const {
    return std::string(medium_.medium().data() + offset, kBytes);
  }
  static std::string filled(char value, size_t n = kBytes) {
    return std::string(n, value);
  }

  MemoryBlockDevice medium_;
};

TEST_F(FaultyBlockDeviceTest, PassesThroughWithoutFaults) {
  FaultyBlockDevice dev(&medium_);
  EXPECT_EQ(dev.name(), "/nvme/rank0.swap");
  EXPECT_EQ(dev.size(), medium_.size());
  write(dev, 0, 'a');
  AlignedBuffer b(kBytes);
  const IoTicket t = dev.submit_read(0, b.data(), kBytes);
  EXPECT_TRUE(dev.poll(t));  // completed at submission
  dev.wait(t);
  EXPECT_EQ(std::string(b.data(), kBytes), filled('a'));
  dev.flush();
  EXPECT_EQ(dev.count(OpKind::kWrite), 1u);
  EXPECT_EQ(dev.count(OpKind::kRead), 1u);
  EXPECT_EQ(dev.count(OpKind::kFlush), 1u);
  EXPECT_TRUE(dev.injected().empty());
}

TEST_F(FaultyBlockDeviceTest, WriteIoErrorAndNoSpaceChangeNothing) {
  FaultyDeviceOptions o;
  o.seed = 42;
  FaultyBlockDevice dev(&medium_, o);
  dev.schedule(OpKind::kWrite, 0, IoFaultKind::kIoError);
  dev.schedule(OpKind::kWrite, 1, IoFaultKind::kNoSpace);
  try {
    write(dev, 0, 'x');
    FAIL() << "no EIO";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "/nvme/rank0.swap")) << e.what();
    EXPECT_TRUE(contains(e.what(), "Input/output error")) << e.what();
    EXPECT_TRUE(contains(e.what(), "seed=42")) << e.what();
    EXPECT_TRUE(contains(e.what(), "write #0: io_error")) << e.what();
  }
  try {
    write(dev, kBytes, 'y');
    FAIL() << "no ENOSPC";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "/nvme/rank0.swap")) << e.what();
    EXPECT_TRUE(contains(e.what(), "No space left on device")) << e.what();
    EXPECT_TRUE(contains(e.what(), "offset 8192")) << e.what();
  }
  EXPECT_EQ(on_medium(0), filled(0));
  EXPECT_EQ(on_medium(kBytes), filled(0));
  write(dev, 0, 'z');  // the third write is fine
  EXPECT_EQ(on_medium(0), filled('z'));
  ASSERT_EQ(dev.injected().size(), 2u);
  EXPECT_TRUE(contains(dev.describe(), "write #1: no_space at offset 8192"))
      << dev.describe();
}

TEST_F(FaultyBlockDeviceTest, ShortWriteLeavesASectorPrefix) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    MemoryBlockDevice medium("m");
    medium.reserve(kBytes);
    FaultyDeviceOptions o;
    o.seed = seed;
    FaultyBlockDevice dev(&medium, o);
    dev.schedule(OpKind::kWrite, 0, IoFaultKind::kShortWrite);
    AlignedBuffer b(kBytes);
    std::memset(b.data(), 's', kBytes);
    const IoTicket t = dev.submit_write(0, b.data(), kBytes);
    try {
      dev.wait(t);
      FAIL() << "no short write";
    } catch (const IoError& e) {
      EXPECT_TRUE(contains(e.what(), "short write")) << e.what();
      EXPECT_TRUE(contains(e.what(), "No space left")) << e.what();
    }
    const uint64_t prefix = dev.injected().at(0).prefix_bytes;
    EXPECT_LT(prefix, kBytes);
    EXPECT_EQ(prefix % 512, 0u);
    const std::string got(medium.medium().data(), kBytes);
    EXPECT_EQ(got, filled('s', prefix) + filled(0, kBytes - prefix));
    EXPECT_FALSE(dev.crashed());
  }
}

TEST_F(FaultyBlockDeviceTest, TornWriteCrashesTheDeviceUntilRestart) {
  FaultyDeviceOptions o;
  o.seed = 3;
  o.lose_unsynced_on_crash = false;
  FaultyBlockDevice dev(&medium_, o);
  write(dev, 0, 'o');
  dev.schedule(OpKind::kWrite, 1, IoFaultKind::kTornWrite);
  AlignedBuffer b(kBytes);
  std::memset(b.data(), 'n', kBytes);
  EXPECT_THROW(dev.submit_write(0, b.data(), kBytes), IoError);
  EXPECT_TRUE(dev.crashed());
  const uint64_t prefix = dev.injected().at(0).prefix_bytes;
  EXPECT_EQ(on_medium(0), filled('n', prefix) + filled('o', kBytes - prefix));
  try {
    dev.submit_read(0, b.data(), kBytes);
    FAIL() << "read after crash";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "simulated crash")) << e.what();
    EXPECT_TRUE(contains(e.what(), "write #1: torn_write")) << e.what();
  }
  EXPECT_THROW(dev.flush(), IoError);
  dev.restart();
  write(dev, 0, 'r');
  EXPECT_EQ(on_medium(0), filled('r'));
}

TEST_F(FaultyBlockDeviceTest, ReadAndFlushFaults) {
  FaultyBlockDevice dev(&medium_);
  write(dev, 0, 'd');
  dev.schedule(OpKind::kRead, 0, IoFaultKind::kIoError);
  dev.schedule(OpKind::kFlush, 0, IoFaultKind::kNoSpace);
  dev.schedule(OpKind::kReserve, 0, IoFaultKind::kNoSpace);
  AlignedBuffer b(kBytes);
  const IoTicket t = dev.submit_read(0, b.data(), kBytes);
  EXPECT_THROW(dev.wait(t), IoError);
  EXPECT_EQ(static_cast<unsigned char>(b.data()[0]), 0xA5);  // garbage
  try {
    dev.flush();
    FAIL() << "no flush fault";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "flush (fdatasync) of '/nvme/rank0.swap'"))
        << e.what();
  }
  EXPECT_THROW(dev.reserve(100 * kBytes), IoError);
  EXPECT_EQ(medium_.size(), 4 * kBytes);
  dev.flush();
  dev.reserve(5 * kBytes);
  EXPECT_EQ(medium_.size(), 5 * kBytes);
}

TEST_F(FaultyBlockDeviceTest, ScheduleRejectsFaultsThatDoNotApply) {
  FaultyBlockDevice dev(&medium_);
  EXPECT_THROW(dev.schedule(OpKind::kRead, 0, IoFaultKind::kShortWrite),
               UsageError);
  EXPECT_THROW(dev.schedule(OpKind::kFlush, 0, IoFaultKind::kTornWrite),
               UsageError);
  EXPECT_THROW(dev.schedule(OpKind::kRead, 0, IoFaultKind::kNoSpace), UsageError);
  write(dev, 0, 'a');
  EXPECT_THROW(dev.schedule(OpKind::kWrite, 0, IoFaultKind::kIoError),
               UsageError);  // already happened
  FaultyDeviceOptions bad;
  bad.sector_bytes = 3;
  EXPECT_THROW(FaultyBlockDevice(&medium_, bad), UsageError);
  bad = FaultyDeviceOptions();
  bad.fault_probability = 1.5;
  EXPECT_THROW(FaultyBlockDevice(&medium_, bad), UsageError);
}

// Writes made durable by a flush survive a crash; later ones each survive,
// vanish or survive as a prefix, by the seed. Same seed, same medium.
TEST_F(FaultyBlockDeviceTest, CrashLosesOnlyUnsyncedWritesReplayably) {
  std::vector<std::string> outcomes;
  std::vector<int> fates(3, 0);  // kept, lost, torn
  for (uint64_t seed = 0; seed < 30; ++seed) {
    for (int replay = 0; replay < 2; ++replay) {
      MemoryBlockDevice medium("m");
      medium.reserve(4 * kBytes);
      FaultyDeviceOptions o;
      o.seed = seed;
      FaultyBlockDevice dev(&medium, o);
      write(dev, 0, 'a');
      dev.flush();
      write(dev, kBytes, 'b');
      write(dev, 2 * kBytes, 'c');
      write(dev, 0, 'A');  // overwrites a durable write
      dev.crash();
      const std::string all(medium.medium().begin(), medium.medium().end());
      if (replay == 1) {
        EXPECT_EQ(all, outcomes.back()) << "seed " << seed;
        continue;
      }
      outcomes.push_back(all);
      // Each region holds the durable value, or the new value, or a
      // sector-aligned prefix of the new value over the old one.
      const char olds[3] = {'a', 0, 0}, news[3] = {'A', 'b', 'c'};
      for (int r = 0; r < 3; ++r) {
        const std::string got = all.substr(r * kBytes, kBytes);
        size_t prefix = 0;
        while (prefix < kBytes && got[prefix] == news[r]) ++prefix;
        EXPECT_EQ(got.substr(prefix), filled(olds[r], kBytes - prefix))
            << "seed " << seed << " region " << r;
        if (prefix == kBytes) {
          ++fates[0];
        } else if (prefix == 0) {
          ++fates[1];
        } else {
          ++fates[2];
          EXPECT_EQ(prefix % 512, 0u);
        }
      }
      EXPECT_EQ(all.substr(3 * kBytes), filled(0));
    }
  }
  // The seeds exercise every fate.
  EXPECT_GT(fates[0], 0);
  EXPECT_GT(fates[1], 0);
  EXPECT_GT(fates[2], 0);
}

TEST_F(FaultyBlockDeviceTest, RandomFaultsAreReplayableFromTheSeed) {
  auto run = [](uint64_t seed) {
    MemoryBlockDevice medium("m");
    medium.reserve(16 * kBlockAlign);
    FaultyDeviceOptions o;
    o.seed = seed;
    o.fault_probability = 0.2;
    FaultyBlockDevice dev(&medium, o);
    AlignedBuffer b(kBlockAlign);
    for (int i = 0; i < 200; ++i) {
      if (dev.crashed()) dev.restart();
      try {
        std::memset(b.data(), i, kBlockAlign);
        const uint64_t off = (i % 16) * kBlockAlign;
        dev.wait(i % 3 == 0 ? dev.submit_read(off, b.data(), kBlockAlign)
                            : dev.submit_write(off, b.data(), kBlockAlign));
        if (i % 10 == 9) dev.flush();
      } catch (const IoError&) {
      }
    }
    return dev.describe() + "|" +
           std::string(medium.medium().begin(), medium.medium().end());
  };
  const std::string a = run(11);
  EXPECT_EQ(a, run(11));
  EXPECT_NE(a, run(12));
  EXPECT_TRUE(contains(a, "torn_write")) << a.substr(0, 2000);
  EXPECT_TRUE(contains(a, "short_write"));
  EXPECT_TRUE(contains(a, "no_space"));
  EXPECT_TRUE(contains(a, "io_error"));
  EXPECT_TRUE(contains(a, ": crash"));
}

}  // namespace
}  // namespace zerostep
