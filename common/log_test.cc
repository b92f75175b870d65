#include "common/log.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace zerostep {
namespace {

TEST(LogTest, SinkReceivesEveryMessageWithItsLevel) {
  std::vector<std::pair<LogLevel, std::string>> seen;
  LogSink previous = set_log_sink(
      [&](LogLevel l, const std::string& m) { seen.emplace_back(l, m); });
  log_message(LogLevel::kInfo, "one");
  log_message(LogLevel::kWarning, "two");
  set_log_sink(previous);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, LogLevel::kInfo);
  EXPECT_EQ(seen[0].second, "one");
  EXPECT_EQ(seen[1].first, LogLevel::kWarning);
  EXPECT_EQ(seen[1].second, "two");
}

TEST(LogTest, EmptySinkRestoresTheStderrDefault) {
  std::vector<std::string> seen;
  set_log_sink([&](LogLevel, const std::string& m) { seen.push_back(m); });
  set_log_sink(nullptr);
  testing::internal::CaptureStderr();
  log_message(LogLevel::kWarning, "to stderr");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(seen.empty());
  EXPECT_EQ(err, "zerostep: warning: to stderr\n");
}

TEST(LogTest, SetReturnsThePreviousSink) {
  int calls = 0;
  set_log_sink([&](LogLevel, const std::string&) { ++calls; });
  LogSink previous = set_log_sink(nullptr);
  ASSERT_TRUE(static_cast<bool>(previous));
  previous(LogLevel::kInfo, "x");
  EXPECT_EQ(calls, 1);
}

TEST(LogTest, ScopedLogSinkPutsThePreviousSinkBack) {
  std::vector<std::string> outer, inner;
  LogSink previous =
      set_log_sink([&](LogLevel, const std::string& m) { outer.push_back(m); });
  {
    ScopedLogSink scoped(
        [&](LogLevel, const std::string& m) { inner.push_back(m); });
    log_message(LogLevel::kInfo, "in scope");
  }
  log_message(LogLevel::kInfo, "after");
  set_log_sink(previous);
  EXPECT_EQ(inner, std::vector<std::string>{"in scope"});
  EXPECT_EQ(outer, std::vector<std::string>{"after"});
}

}  // namespace
}  // namespace zerostep
