// zerostep's error model: one small hierarchy used by every layer.
//
//   Error            base; what() is a complete, user-facing sentence.
//   ├─ ConfigError   a ds_config that cannot be used; lists every problem at
//   │                once (key, value, rule, fix), with "did you mean" hints.
//   ├─ UsageError    an API call that is not allowed in the engine's state
//   │                (step() with no backward, set_gradient_accumulation_boundary
//   │                in unmanaged mode, ...). Nothing was changed.
//   ├─ CommError     a collective failed or ranks disagreed; raised on every
//   │                rank that takes part, never a hang.
//   ├─ IoError       a file or device operation failed; names the path.
//   └─ InternalError a broken invariant (ZS_CHECK): a bug in zerostep.
//
// LibTorch throws c10::Error; code at the edge (Engine) catches it and
// rethrows as UsageError with context.
//
// Thread safety: the classes are immutable values.
#ifndef ZEROSTEP_COMMON_ERRORS_H_
#define ZEROSTEP_COMMON_ERRORS_H_

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace zerostep {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One problem in a config: which key, what value, which rule, how to fix it.
// `s` whole when it has at most `max_bytes` bytes; otherwise its first
// bytes (cut at a UTF-8 character boundary) followed by "... (N bytes)",
// N being s's size, in max_bytes at most (for max_bytes >= 32), so that an
// error message never echoes an unbounded input and eliding twice changes
// nothing.
std::string elide(const std::string& s, size_t max_bytes);

// The longest key and value a ConfigProblem keeps (elide()).
inline constexpr size_t kConfigProblemFieldBytes = 200;

struct ConfigProblem {
  std::string key;    // dotted path, e.g. "zero_optimization.stage"
  std::string value;  // the offending value as JSON text ("" if absent)
  std::string rule;   // what the value must satisfy
  std::string fix;    // what to write instead
};

class ConfigError : public Error {
 public:
  // Keys and values longer than kConfigProblemFieldBytes are elided (in
  // problems() too), rules and fixes beyond 4 KiB.
  explicit ConfigError(std::vector<ConfigProblem> problems);
  // Same problems, message naming where the config came from:
  // "invalid ds_config '<source>': N problems ...".
  ConfigError(std::vector<ConfigProblem> problems, const std::string& source);
  // The same for another kind of configuration: "invalid <kind>
  // '<source>': ..." (e.g. kind "model config" for a Hugging Face
  // config.json, models/hf_config.h).
  ConfigError(std::vector<ConfigProblem> problems, const std::string& source,
              const std::string& kind);
  const std::vector<ConfigProblem>& problems() const { return problems_; }

 private:
  std::vector<ConfigProblem> problems_;
};

class UsageError : public Error {
 public:
  using Error::Error;
};

class CommError : public Error {
 public:
  using Error::Error;
};

class IoError : public Error {
 public:
  using Error::Error;
};

class InternalError : public Error {
 public:
  using Error::Error;
};

namespace internal {
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& detail);
}  // namespace internal

}  // namespace zerostep

// Invariant checks. Never compiled out (not even with -DNDEBUG): a broken
// invariant in a training engine silently corrupts weights. One condition per
// check, so the message says exactly which one failed.
#define ZS_CHECK(cond)                                                     \
  do {                                                                     \
    if (!(cond)) ::zerostep::internal::check_failed(__FILE__, __LINE__,   \
                                                    #cond, std::string()); \
  } while (0)

#define ZS_CHECK_MSG(cond, msg)                                          \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::ostringstream zs_check_os_;                                   \
      zs_check_os_ << msg;                                               \
      ::zerostep::internal::check_failed(__FILE__, __LINE__, #cond,      \
                                         zs_check_os_.str());            \
    }                                                                    \
  } while (0)

#endif  // ZEROSTEP_COMMON_ERRORS_H_
