#include "common/cli.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace {

// The message parse_* threw, or "" when it returned.
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(ParseIntTest, TakesWholeDecimalIntegersInRange) {
  EXPECT_EQ(parse_int("--nproc", "4", 1, 8), 4);
  EXPECT_EQ(parse_int("--nproc", "1", 1, 8), 1);
  EXPECT_EQ(parse_int("--nproc", "8", 1, 8), 8);
  EXPECT_EQ(parse_int("--x", "-3", -5, 5), -3);
  EXPECT_EQ(parse_int("--x", "007", 0, 10), 7);
  const int64_t lo = std::numeric_limits<int64_t>::min();
  const int64_t hi = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(parse_int("--x", "9223372036854775807", lo, hi), hi);
  EXPECT_EQ(parse_int("--x", "-9223372036854775808", lo, hi), lo);
}

TEST(ParseIntTest, RefusesWhatAtoiWouldReadAsSomethingElse) {
  // atoi: 2, 0, 0, 2, 0, 1 (or wrapped); each is an error naming the
  // setting, the text, the rule and a value that would do.
  for (const char* text : {"2x", "abc", "", " 2", "+2", "1.5", "0x10", "2 "}) {
    const std::string e =
        error_of([&] { parse_int("--nproc", text, 1, 65536); });
    EXPECT_EQ(e, "--nproc=" + std::string(text) +
                     ": not an integer: must be an integer from 1 to 65536. "
                     "Fix: write e.g. --nproc=1")
        << text;
  }
}

TEST(ParseIntTest, RefusesOverflowAndValuesOutOfRange) {
  EXPECT_EQ(
      error_of([] { parse_int("--world", "99999999999999999999", 1, 8); }),
      "--world=99999999999999999999: out of range: must be an integer "
      "from 1 to 8. Fix: write e.g. --world=1");
  // Fits in int64 but not in the range (atoi would wrap it into an int).
  EXPECT_EQ(
      error_of([] { parse_int("--world", "99999999999", 1, 2147483647); }),
      "--world=99999999999: must be an integer from 1 to 2147483647. "
      "Fix: write e.g. --world=1");
  EXPECT_EQ(error_of([] { parse_int("MASTER_PORT", "99999", 0, 65535); }),
            "MASTER_PORT=99999: must be an integer from 0 to 65535. Fix: "
            "write e.g. MASTER_PORT=0");
  EXPECT_EQ(error_of([] { parse_int("--port", "99999", 0, 65535, 8000); }),
            "--port=99999: must be an integer from 0 to 65535. Fix: write "
            "e.g. --port=8000");
  EXPECT_NE(error_of([] { parse_int("--nproc", "0", 1, 8); }), "");
  EXPECT_NE(error_of([] { parse_int("--nproc", "-1", 1, 8); }), "");
  EXPECT_NE(error_of([] { parse_int("--nproc", "9", 1, 8); }), "");
}

TEST(ParseIntTest, ElidesALongText) {
  const std::string text(1000, '7');
  const std::string e = error_of([&] { parse_int("--x", text, 0, 1); });
  EXPECT_NE(e.find("(1000 bytes)"), std::string::npos) << e;
  EXPECT_LT(e.size(), 200u) << e;
}

TEST(ParseUint64Test, TakesTheWholeRangeAndNothingElse) {
  EXPECT_EQ(parse_uint64("--seed", "0"), 0u);
  EXPECT_EQ(parse_uint64("--seed", "18446744073709551615"),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(error_of([] { parse_uint64("--seed", "18446744073709551616"); }),
            "--seed=18446744073709551616: out of range: must be digits only, "
            "at most 18446744073709551615. Fix: write e.g. --seed=1");
  // strtoull reads "-1" as 2^64 - 1 and "12abc" as 12.
  for (const char* text : {"-1", "12abc", "", "+1", " 1"})
    EXPECT_EQ(error_of([&] { parse_uint64("--seed", text); }),
              "--seed=" + std::string(text) +
                  ": not a non-negative integer: must be digits only, at most "
                  "18446744073709551615. Fix: write e.g. --seed=1")
        << text;
}

TEST(ParseBytesTest, TakesDigitsWithAnOptionalBinaryUnit) {
  EXPECT_EQ(parse_bytes("--b", "0", 0, 1ULL << 50, "1M"), 0u);
  EXPECT_EQ(parse_bytes("--b", "1500", 0, 1ULL << 50, "1M"), 1500u);
  EXPECT_EQ(parse_bytes("--b", "64M", 0, 1ULL << 50, "1M"), 64u << 20);
  EXPECT_EQ(parse_bytes("--b", "3k", 0, 1ULL << 50, "1M"), 3072u);
  EXPECT_EQ(parse_bytes("--b", "2G", 0, 1ULL << 50, "1M"), 2ULL << 30);
  EXPECT_EQ(parse_bytes("--b", "5T", 0, 1ULL << 50, "1M"), 5ULL << 40);
  uint64_t x = 0;
  EXPECT_EQ(read_bytes("16777216T", &x), NumberText::kOutOfRange);  // 2^64
  EXPECT_EQ(read_bytes("16777215T", &x), NumberText::kOk);
}

TEST(ParseBytesTest, RefusesOtherTextAndValuesOutOfRange) {
  const std::string rule =
      "must be a byte count from 1 to 1024 (digits, optionally with K, M, G "
      "or T: 1024, 1024^2, 1024^3, 1024^4 times). Fix: write e.g. --b=1K";
  for (const char* text : {"", "M", "1.5M", "-1", "1MB", "1 M", "+1", "0x10"})
    EXPECT_EQ(error_of([&] { parse_bytes("--b", text, 1, 1024, "1K"); }),
              "--b=" + std::string(text) + ": not a byte count: " + rule)
        << text;
  EXPECT_EQ(error_of([] { parse_bytes("--b", "2K", 1, 1024, "1K"); }),
            "--b=2K: " + rule);
  EXPECT_EQ(error_of([] { parse_bytes("--b", "0", 1, 1024, "1K"); }),
            "--b=0: " + rule);
  EXPECT_EQ(error_of([] { parse_bytes("--b", "99999999999999999999", 1, 1024,
                                      "1K"); }),
            "--b=99999999999999999999: out of range: " + rule);
}

TEST(ParseDoubleTest, TakesFiniteDecimalNumbersInRange) {
  EXPECT_EQ(parse_double("--t", "0.5", 0, 10), 0.5);
  EXPECT_EQ(parse_double("--t", "1e-3", 0, 10), 1e-3);
  EXPECT_EQ(parse_double("--t", "10", 0, 10), 10.0);
  EXPECT_EQ(parse_double("--t", "-2.5", -3, 0), -2.5);
}

TEST(ParseDoubleTest, RefusesNonNumbersNonFiniteAndOutOfRange) {
  // atof: 0, 0, inf, nan, 3, 0 (hex 8 with strtod).
  for (const char* text : {"abc", "", "inf", "nan", "3s", "0x1p3", " 1"})
    EXPECT_EQ(error_of([&] { parse_double("--long-poll-s", text, 0, 3600); }),
              "--long-poll-s=" + std::string(text) +
                  ": not a number: must be a finite number from 0 to 3600. "
                  "Fix: write e.g. --long-poll-s=0")
        << text;
  EXPECT_EQ(error_of([] { parse_double("--long-poll-s", "-1", 0, 3600); }),
            "--long-poll-s=-1: must be a finite number from 0 to 3600. Fix: "
            "write e.g. --long-poll-s=0");
  EXPECT_EQ(error_of([] { parse_double("--t", "x", 0, 60, 30.0); }),
            "--t=x: not a number: must be a finite number from 0 to 60. Fix: "
            "write e.g. --t=30");
  EXPECT_NE(error_of([] { parse_double("--t", "1e999", 0, 1e300); }), "");
}

TEST(MessageWithoutBacktraceTest, CutsLibTorchsBacktraceOnly) {
  const std::runtime_error alloc(
      "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: "
      "can't allocate memory\nframe #0: <unknown function> + 0x4c062\n"
      "frame #1: c10::ThrowEnforceNotMet");
  EXPECT_EQ(message_without_backtrace(alloc),
            "[enforce fail at alloc_cpu.cpp:75] err == 0. "
            "DefaultCPUAllocator: can't allocate memory");
  const std::runtime_error check(
      "shape mismatch\nException raised from mm at Blas.cpp:12 (most recent "
      "call first):\nframe #0: c10::Error::Error");
  EXPECT_EQ(message_without_backtrace(check), "shape mismatch");
  const UsageError plain("two\nlines");
  EXPECT_EQ(message_without_backtrace(plain), "two\nlines");
}

TEST(AvailableMemoryTest, ReadsMemAvailableAndTheCgroupHeadroom) {
  EXPECT_EQ(meminfo_available_bytes("MemTotal:       24000000 kB\n"
                                    "MemFree:         1000000 kB\n"
                                    "MemAvailable:   20971520 kB\n"
                                    "Buffers:          100 kB\n"),
            uint64_t{20971520} * 1024);
  EXPECT_EQ(meminfo_available_bytes("MemTotal: 1 kB\n"), std::nullopt);
  EXPECT_EQ(meminfo_available_bytes("MemAvailable: 12x kB\n"), std::nullopt);
  EXPECT_EQ(meminfo_available_bytes("MemAvailable: 12 MB\n"), std::nullopt);
  EXPECT_EQ(cgroup_headroom_bytes("8589934592\n", "1073741824\n"),
            uint64_t{7516192768});
  EXPECT_EQ(cgroup_headroom_bytes("100\n", "200\n"), uint64_t{0});
  EXPECT_EQ(cgroup_headroom_bytes("max\n", "200\n"), std::nullopt);
  EXPECT_EQ(cgroup_headroom_bytes("", ""), std::nullopt);
  // This machine's own: Linux has /proc/meminfo.
  const std::optional<AvailableMemory> here = available_memory();
  ASSERT_TRUE(here.has_value());
  EXPECT_GT(here->bytes, 0u);
  EXPECT_FALSE(here->source.empty());
}

}  // namespace
}  // namespace zerostep
