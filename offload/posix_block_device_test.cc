#include "offload/posix_block_device.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/errors.h"
#include "offload/block_device.h"

namespace zerostep {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A fresh directory under Bazel's TEST_TMPDIR (or /tmp), on a real file
// system.
std::string make_temp_dir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base ? base : "/tmp") + "/swapdev.XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) std::abort();
  return buf.data();
}

void fill(AlignedBuffer& b, uint64_t seed) {
  for (size_t i = 0; i < b.size(); ++i) {
    b.data()[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 12)) & 0xFF);
  }
}

// Many operations in flight on a small ring, then read back.
void round_trip(PosixBlockDevice& dev) {
  constexpr size_t kOps = 24;
  constexpr size_t kBytes = 64 * 1024;
  dev.reserve(kOps * kBytes);
  ASSERT_GE(dev.size(), kOps * kBytes);
  std::vector<AlignedBuffer> out, in;
  std::vector<IoTicket> tickets;
  for (size_t i = 0; i < kOps; ++i) {
    out.emplace_back(kBytes);
    fill(out.back(), i);
    tickets.push_back(dev.submit_write(i * kBytes, out[i].data(), kBytes));
  }
  // Out of order, with polls.
  for (size_t i = kOps; i-- > 0;) {
    (void)dev.poll(tickets[i]);
    dev.wait(tickets[i]);
  }
  EXPECT_EQ(dev.in_flight(), 0u);
  dev.flush();
  tickets.clear();
  for (size_t i = 0; i < kOps; ++i) {
    in.emplace_back(kBytes);
    tickets.push_back(dev.submit_read(i * kBytes, in[i].data(), kBytes));
  }
  dev.flush();  // retires the reads too
  for (size_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(std::memcmp(in[i].data(), out[i].data(), kBytes), 0) << i;
  }
  EXPECT_THROW(dev.wait(tickets[0]), UsageError);
}

// Where the kernel refuses io_uring (ENOSYS, EPERM under seccomp,
// kernel.io_uring_disabled) the device falls back to pread/pwrite: a case
// that claims io_uring then records a skip naming what the kernel refused
// and the path that ran instead, never a pass; where it runs, the case
// records "io_engine" in its XML.
std::string io_uring_skip_reason(const PosixBlockDevice& dev) {
  if (dev.io_engine() == "io_uring") {
    ::testing::Test::RecordProperty("io_engine", dev.io_engine());
    return "";
  }
  return "this kernel refuses io_uring, so the io_uring path did not run; "
         "the device ran " +
         dev.io_engine();
}

TEST(PosixBlockDeviceTest, RoundTripWithIoUring) {
  const std::string dir = make_temp_dir();
  PosixDeviceOptions o;
  o.queue_depth = 4;  // fewer entries than operations in flight
  auto dev = PosixBlockDevice::open_in_directory(dir, "rank0.swap", o);
  std::printf("engine=%s direct_io=%d\n", dev->io_engine().c_str(),
              dev->direct_io() ? 1 : 0);
  EXPECT_EQ(dev->name(), dir + "/rank0.swap");
  round_trip(*dev);
  const std::string why = io_uring_skip_reason(*dev);
  if (!why.empty())
    GTEST_SKIP() << why << " (the round trip passed on that path)";
}

TEST(PosixBlockDeviceTest, RoundTripSynchronousAndBuffered) {
  const std::string dir = make_temp_dir();
  PosixDeviceOptions o;
  o.use_io_uring = false;
  o.direct_io = false;
  auto dev = PosixBlockDevice::open_in_directory(dir + "/", "f.swap", o);
  EXPECT_EQ(dev->name(), dir + "/f.swap");
  EXPECT_TRUE(contains(dev->io_engine(), "pread/pwrite"));
  EXPECT_FALSE(dev->direct_io());
  round_trip(*dev);
}

TEST(PosixBlockDeviceTest, ReopenSeesTheData) {
  const std::string dir = make_temp_dir();
  AlignedBuffer out(kBlockAlign), in(kBlockAlign);
  fill(out, 5);
  {
    auto dev = PosixBlockDevice::open_in_directory(dir, "a.swap");
    dev->reserve(2 * kBlockAlign);
    dev->wait(dev->submit_write(kBlockAlign, out.data(), kBlockAlign));
    dev->flush();
  }
  auto dev = PosixBlockDevice::open_in_directory(dir, "a.swap");
  EXPECT_EQ(dev->size(), 2 * kBlockAlign);
  dev->wait(dev->submit_read(kBlockAlign, in.data(), kBlockAlign));
  EXPECT_EQ(std::memcmp(in.data(), out.data(), kBlockAlign), 0);
}

TEST(PosixBlockDeviceTest, MissingDirectoryNamesThePathAndTheFix) {
  const std::string dir = make_temp_dir() + "/no/such/dir";
  try {
    PosixBlockDevice::open_in_directory(dir, "rank0.swap");
    FAIL() << "opened a file in a missing directory";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "'" + dir + "' does not exist")) << e.what();
    EXPECT_TRUE(contains(e.what(), "mkdir -p")) << e.what();
  }
}

TEST(PosixBlockDeviceTest, NotADirectory) {
  const std::string dir = make_temp_dir();
  const std::string file = dir + "/plain";
  const int fd = ::open(file.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ::close(fd);
  try {
    PosixBlockDevice::open_in_directory(file, "rank0.swap");
    FAIL() << "used a file as a directory";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "'" + file + "' is not a directory"))
        << e.what();
  }
}

TEST(PosixBlockDeviceTest, UnwritableDirectoryNamesThePathAndTheFix) {
  // Permission bits do not stop root; sysfs refuses new files even to root.
  std::string dir = make_temp_dir();
  if (::geteuid() == 0) {
    dir = "/sys";
  } else {
    ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  }
  try {
    PosixBlockDevice::open_in_directory(dir, "rank0.swap");
    FAIL() << "created a swap file in " << dir;
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), dir)) << e.what();
    EXPECT_TRUE(contains(e.what(), "Permission denied")) << e.what();
    EXPECT_TRUE(contains(e.what(), "writable")) << e.what();
  }
}

TEST(PosixBlockDeviceTest, TruncateEmptiesTheFileOnlyOnceLocked) {
  const std::string dir = make_temp_dir();
  AlignedBuffer out(kBlockAlign);
  fill(out, 9);
  PosixDeviceOptions truncate;
  truncate.truncate = true;
  {
    auto dev = PosixBlockDevice::open_in_directory(dir, "t.swap");
    dev->reserve(2 * kBlockAlign);
    dev->wait(dev->submit_write(0, out.data(), kBlockAlign));
    dev->flush();
    // In use: a truncating open is refused and cuts nothing.
    EXPECT_THROW(PosixBlockDevice::open_in_directory(dir, "t.swap", truncate),
                 IoError);
    EXPECT_EQ(dev->size(), 2 * kBlockAlign);
  }
  auto dev = PosixBlockDevice::open_in_directory(dir, "t.swap", truncate);
  EXPECT_EQ(dev->size(), 0u);
}

TEST(PosixBlockDeviceTest, SecondOpenOfTheSameFileIsRefused) {
  const std::string dir = make_temp_dir();
  auto first = PosixBlockDevice::open_in_directory(dir, "rank0.swap");
  try {
    PosixBlockDevice::open_in_directory(dir, "rank0.swap");
    FAIL() << "two devices on one file";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(e.what(), "in use by another process")) << e.what();
    EXPECT_TRUE(contains(e.what(), dir + "/rank0.swap")) << e.what();
  }
  first.reset();
  EXPECT_NE(PosixBlockDevice::open_in_directory(dir, "rank0.swap"), nullptr);
}

TEST(PosixBlockDeviceTest, BadFileNameAndMisuse) {
  const std::string dir = make_temp_dir();
  EXPECT_THROW(PosixBlockDevice::open_in_directory(dir, ""), UsageError);
  EXPECT_THROW(PosixBlockDevice::open_in_directory(dir, "a/b"), UsageError);
  auto dev = PosixBlockDevice::open_in_directory(dir, "x.swap");
  dev->reserve(kBlockAlign);
  AlignedBuffer b(2 * kBlockAlign);
  EXPECT_THROW(dev->submit_read(0, b.data() + 512, kBlockAlign), UsageError);
  EXPECT_THROW(dev->submit_read(0, b.data(), 2 * kBlockAlign), UsageError);
  EXPECT_THROW(dev->wait(99), UsageError);
}

// A file truncated behind the device: the read meets end of file.
TEST(PosixBlockDeviceTest, ShortReadAtEndOfFile) {
  const std::string dir = make_temp_dir();
  auto dev = PosixBlockDevice::open_in_directory(dir, "t.swap");
  dev->reserve(4 * kBlockAlign);
  ASSERT_EQ(::truncate((dir + "/t.swap").c_str(), kBlockAlign), 0);
  AlignedBuffer b(2 * kBlockAlign);
  try {
    dev->wait(dev->submit_read(2 * kBlockAlign, b.data(), 2 * kBlockAlign));
    FAIL() << "read past end of file";
  } catch (const IoError& e) {
    EXPECT_TRUE(contains(
        e.what(), "read of 8192 bytes at offset 8192 on '" + dir + "/t.swap'"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "end of file; the file is 4096 bytes"))
        << e.what();
  }
}

// A real write error from the kernel: RLIMIT_FSIZE makes a write that
// crosses the limit short and the retry fail with EFBIG, the same path a
// filling drive takes (short write, then ENOSPC). On the device's path:
// io_uring (a skip where the kernel refuses it) or pread/pwrite.
void short_write_then_errno(bool uring) {
  const std::string dir = make_temp_dir();
  PosixDeviceOptions o;
  o.use_io_uring = uring;
  auto dev =
      PosixBlockDevice::open_in_directory(dir, uring ? "u.swap" : "s.swap", o);
  if (uring) {
    const std::string why = io_uring_skip_reason(*dev);
    if (!why.empty())
      GTEST_SKIP() << why
                   << " (ShortWriteThenErrnoIsReportedSynchronously covers it)";
  }
  dev->reserve(2 << 20);
  AlignedBuffer b(2 << 20);
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit limit = old;
  limit.rlim_cur = 1 << 20;
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string message;
  try {
    dev->wait(dev->submit_write(0, b.data(), 2 << 20));
  } catch (const IoError& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(contains(
      message, "write of 2097152 bytes at offset 0 on '" + dev->name() + "'"))
      << message;
  EXPECT_TRUE(contains(message,
                       "short write (1048576 of 2097152 bytes), "
                       "then File too large (errno 27)"))
      << message;
}

TEST(PosixBlockDeviceTest, ShortWriteThenErrnoIsReportedWithIoUring) {
  short_write_then_errno(/*uring=*/true);
}

TEST(PosixBlockDeviceTest, ShortWriteThenErrnoIsReportedSynchronously) {
  short_write_then_errno(/*uring=*/false);
}

TEST(PosixBlockDeviceTest, DestroyingWithOperationsInFlightIsSafe) {
  const std::string dir = make_temp_dir();
  std::vector<AlignedBuffer> bufs;
  for (int i = 0; i < 8; ++i) bufs.emplace_back(256 * 1024);
  {
    auto dev = PosixBlockDevice::open_in_directory(dir, "d.swap");
    dev->reserve(8 * 256 * 1024);
    for (int i = 0; i < 8; ++i) {
      dev->submit_write(i * 256 * 1024, bufs[i].data(), 256 * 1024);
    }
    EXPECT_EQ(dev->in_flight(), 8u);
  }  // the destructor waits before the buffers go
}

}  // namespace
}  // namespace zerostep
