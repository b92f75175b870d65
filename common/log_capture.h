// LogCapture (tests): collects what the library logs (common/log.h) while
// it lives, then puts the previous sink back.
//
//   LogCapture log;
//   ... code that logs ...
//   EXPECT_EQ(log.lines().size(), 1u);
//
// Thread safety: the library may log from any rank's thread; lines() may be
// read from any thread.
#ifndef ZEROSTEP_COMMON_LOG_CAPTURE_H_
#define ZEROSTEP_COMMON_LOG_CAPTURE_H_

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"

namespace zerostep {

class LogCapture {
 public:
  using Line = std::pair<LogLevel, std::string>;

  LogCapture()
      : sink_([this](LogLevel l, const std::string& m) {
          std::lock_guard<std::mutex> lock(mu_);
          lines_.emplace_back(l, m);
        }) {}
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Every line so far, in the order the sink received them.
  std::vector<Line> lines() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  // The messages at `level` so far.
  std::vector<std::string> at(LogLevel level) const {
    std::vector<std::string> out;
    for (const Line& l : lines())
      if (l.first == level) out.push_back(l.second);
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Line> lines_;
  ScopedLogSink sink_;  // last: installed once mu_ and lines_ exist
};

}  // namespace zerostep

#endif  // ZEROSTEP_COMMON_LOG_CAPTURE_H_
