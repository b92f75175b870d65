// The log hook: where zerostep's library code reports things a user should
// know but that are not errors (ds_config keys accepted without effect, a
// model that will use more memory than the user may expect).
//
//   zerostep::set_log_sink([](zerostep::LogLevel level, const std::string& m) {
//     my_logger(level == zerostep::LogLevel::kWarning ? WARN : INFO, m);
//   });
//
// The default sink writes "zerostep: <level>: <message>\n" to stderr. The
// library never writes to stdout or stderr by any other path. Messages are
// whole lines without a trailing newline; each names what it is about.
//
// Who logs what (the complete list; keep it in step with the code):
//   kInfo     Engine constructor, rank 0: the ds_config keys accepted
//             without effect (Config::ignored_keys), once, in one message.
//   kWarning  Engine constructor at stage 3, rank 0: more than half of the
//             model's elements stay whole on every rank (outside every
//             Zero3Block or below the persistence threshold), with the
//             counts and the fix (stage3_whole_model_warning in
//             zero/grouping.h).
//   kInfo     load_checkpoint, rank 0: a checkpoint written in another
//             training dtype (fp32 / bf16 / fp16) than the engine's, and
//             what that means for the weights and the loss scale.
//   kWarning  load_checkpoint, every rank: a manifest of the older format
//             zerostep-checkpoint-1, which carries no checksum of its own
//             (engine/checkpoint_io.h).
//   kInfo     GlooCommunicator::from_environment, every rank, once: the
//             address its transport binds, on which interface, and why
//             (Note [Binding where the other hosts can reach] in
//             comm/net_interface.h).
//   kInfo     NcclCommunicator::from_environment, every rank, once: its
//             device, the address NCCL's sockets bind and the
//             NCCL_SOCKET_IFNAME it runs with, and why.
//
// Thread safety: set_log_sink and log_message may be called from any
// thread; the sink is called under a lock, so it need not be reentrant but
// must not call set_log_sink or log_message itself.
#ifndef ZEROSTEP_COMMON_LOG_H_
#define ZEROSTEP_COMMON_LOG_H_

#include <functional>
#include <string>

namespace zerostep {

enum class LogLevel { kInfo, kWarning };

// "info" or "warning".
const char* to_string(LogLevel level);

using LogSink = std::function<void(LogLevel, const std::string&)>;

// Replaces the process-wide sink and returns the previous one. An empty
// function restores the default (stderr).
LogSink set_log_sink(LogSink sink);

// Hands `message` to the current sink.
void log_message(LogLevel level, const std::string& message);

// Installs `sink` for its lifetime, then puts the previous one back.
class ScopedLogSink {
 public:
  explicit ScopedLogSink(LogSink sink);
  ~ScopedLogSink();
  ScopedLogSink(const ScopedLogSink&) = delete;
  ScopedLogSink& operator=(const ScopedLogSink&) = delete;

 private:
  LogSink previous_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_COMMON_LOG_H_
