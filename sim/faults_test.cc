#include "sim/faults.h"

#include <gtest/gtest.h>

#include <set>

#include "common/errors.h"

namespace zerostep {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(FaultsTest, TextRoundTripsExactly) {
  const std::string text =
      "crash:2@7,straggle:1@3x2:0.123,mismatch:0@4:dtype,lost:3@9,"
      "straggle:0@0:1e-05,mismatch:1@1:op,mismatch:1@2:count,timeout:12.5";
  const FaultOptions o = parse_fault_options(text);
  ASSERT_EQ(o.faults.size(), 7u);
  EXPECT_EQ(o.faults[0].kind, FaultKind::kCrash);
  EXPECT_EQ(o.faults[0].rank, 2);
  EXPECT_EQ(o.faults[0].collective, 7);
  EXPECT_EQ(o.faults[1].kind, FaultKind::kStraggle);
  EXPECT_EQ(o.faults[1].count, 2);
  EXPECT_EQ(o.faults[1].delay_s, 0.123);
  EXPECT_EQ(o.faults[2].field, MismatchField::kDtype);
  EXPECT_EQ(o.faults[3].kind, FaultKind::kLostPeer);
  EXPECT_EQ(o.timeout_s, 12.5);
  EXPECT_EQ(o.to_string(), text);
  EXPECT_EQ(parse_fault_options(o.to_string()).to_string(), text);
  EXPECT_TRUE(parse_fault_options("").empty());
  EXPECT_TRUE(parse_fault_options("none").empty());
  EXPECT_EQ(FaultOptions{}.to_string(), "timeout:60");
}

TEST(FaultsTest, HitsTheNamedRankAndCollectives) {
  const FaultOptions o = parse_fault_options("straggle:1@3x2:0.5,crash:0@4");
  EXPECT_FALSE(o.faults[0].hits(1, 2));
  EXPECT_TRUE(o.faults[0].hits(1, 3));
  EXPECT_TRUE(o.faults[0].hits(1, 4));
  EXPECT_FALSE(o.faults[0].hits(1, 5));
  EXPECT_FALSE(o.faults[0].hits(0, 3));
  EXPECT_TRUE(o.faults[1].hits(0, 4));
  EXPECT_FALSE(o.faults[1].hits(0, 5));
}

TEST(FaultsTest, BadTextNamesTheItemAndTheGrammar) {
  for (const char* bad : {"crash:2", "crash:x@1", "boom:1@2", "straggle:1@2",
                          "mismatch:1@2:size", "lost:1@2:3", "timeout:abc"}) {
    const std::string msg = message_of([&] { parse_fault_options(bad); });
    EXPECT_NE(msg.find(std::string("fault '") + bad + "'"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("crash:R@K"), std::string::npos) << msg;
  }
}

TEST(FaultsTest, ValidateChecksTheWorld) {
  EXPECT_NO_THROW(validate(parse_fault_options("crash:3@0"), 4));
  EXPECT_NE(message_of([] {
              validate(parse_fault_options("crash:4@0"), 4);
            }).find("rank 4 is not a rank of this world of 4"),
            std::string::npos);
  EXPECT_NE(message_of([] {
              validate(parse_fault_options("mismatch:0@0:op"), 1);
            }).find("needs at least 2 ranks"),
            std::string::npos);
  EXPECT_THROW(validate(parse_fault_options("timeout:0"), 2), UsageError);
  EXPECT_THROW(validate(parse_fault_options("straggle:0@0x0:1"), 2),
               UsageError);
  EXPECT_THROW(validate(parse_fault_options("straggle:0@0:-1"), 2), UsageError);
}

TEST(FaultsTest, SwarmDrawIsAFunctionOfTheSeed) {
  std::set<std::string> distinct;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    for (int w : {1, 2, 4}) {
      const FaultOptions a = draw_fault_options(seed, w, 30);
      EXPECT_EQ(a.to_string(), draw_fault_options(seed, w, 30).to_string());
      EXPECT_NO_THROW(validate(a, w)) << a.to_string();
      ASSERT_GE(a.faults.size(), 1u);
      ASSERT_LE(a.faults.size(), 3u);
      for (const Fault& f : a.faults) {
        EXPECT_LT(f.collective, 30);
        if (w == 1) {
          EXPECT_NE(f.kind, FaultKind::kMismatch);
        }
        if (f.kind == FaultKind::kStraggle) {
          EXPECT_GT(f.delay_s, 0.0);
          EXPECT_LE(f.delay_s, 2 * a.timeout_s);
        }
      }
      // Replays from its text.
      EXPECT_EQ(parse_fault_options(a.to_string()).to_string(), a.to_string());
      distinct.insert(a.to_string());
    }
  }
  // Every kind shows up, and the draws are not all alike.
  std::set<FaultKind> kinds;
  for (const std::string& s : distinct)
    for (const Fault& f : parse_fault_options(s).faults) kinds.insert(f.kind);
  EXPECT_EQ(kinds.size(), 4u);
  EXPECT_GT(distinct.size(), 400u);
}

}  // namespace
}  // namespace zerostep
