#include "common/log.h"

#include <cstdio>
#include <mutex>
#include <utility>

namespace zerostep {
namespace {

void stderr_sink(LogLevel level, const std::string& message) {
  std::fprintf(stderr, "zerostep: %s: %s\n", to_string(level), message.c_str());
  std::fflush(stderr);
}

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

LogSink& current_sink() {
  static LogSink sink = stderr_sink;
  return sink;
}

}  // namespace

const char* to_string(LogLevel level) {
  return level == LogLevel::kWarning ? "warning" : "info";
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  LogSink previous = std::move(current_sink());
  current_sink() = sink ? std::move(sink) : LogSink(stderr_sink);
  return previous;
}

void log_message(LogLevel level, const std::string& message) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  current_sink()(level, message);
}

ScopedLogSink::ScopedLogSink(LogSink sink)
    : previous_(set_log_sink(std::move(sink))) {}

ScopedLogSink::~ScopedLogSink() { set_log_sink(std::move(previous_)); }

}  // namespace zerostep
