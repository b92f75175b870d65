// What zerostep's command-line programs share.
//
// Strict numbers from the command line and the environment: the whole
// text must be the number (no leading blank or '+', nothing after it, no
// overflow, finite), within the range the caller states. Anything else is
// a UsageError naming the setting, the text given, the rule and a value
// that would do, so that "--nproc=2x" or "--master-port=99999" is refused
// instead of read as 2 or wrapped into another port (atoi and strtol read
// a prefix and saturate or wrap).
//
// `name` is printed as given before "=": "--nproc" for a flag,
// "MASTER_PORT" for an environment variable. Texts longer than 64 bytes
// are elided in the message (common/errors.h, elide()).
//
// Also: a program's last-resort error line without LibTorch's backtrace,
// and the memory the process may still take (available_memory()).
//
// Thread safety: pure functions, except available_memory(), which reads
// /proc and /sys. No LibTorch.
#ifndef ZEROSTEP_COMMON_CLI_H_
#define ZEROSTEP_COMMON_CLI_H_

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

namespace zerostep {

// The strict readers under the parse_* functions, for a program that words
// its own errors (tools/harness_flags.cc): kOk and *out set, or why not.
enum class NumberText { kOk, kNotANumber, kOutOfRange };
NumberText read_int(const std::string& text, int64_t* out);
NumberText read_uint64(const std::string& text, uint64_t* out);
NumberText read_double(const std::string& text, double* out);  // finite
// A byte count: digits, optionally followed by one of K, M, G, T (either
// case), each 1024 times the one before ("64M" is 67108864).
NumberText read_bytes(const std::string& text, uint64_t* out);

// An integer in [min, max], e.g. parse_int("--nproc", "4", 1, 4096). The
// error's fix suggests `example` (default: min).
int64_t parse_int(const std::string& name, const std::string& text, int64_t min,
                  int64_t max, std::optional<int64_t> example = std::nullopt);

// Any unsigned 64-bit integer (seeds): digits only.
uint64_t parse_uint64(const std::string& name, const std::string& text);

// A finite decimal number in [min, max] ("1e-3" and "0.5" are numbers;
// "nan", "inf" and "0x1p3" are not).
double parse_double(const std::string& name, const std::string& text,
                    double min, double max,
                    std::optional<double> example = std::nullopt);

// A byte count (read_bytes) in [min, max], e.g.
// parse_bytes("--max-body-bytes", "64M", 1, 1ULL << 40). The error's fix
// suggests `example`.
uint64_t parse_bytes(const std::string& name, const std::string& text,
                     uint64_t min, uint64_t max, const std::string& example);

// e.what() without the C++ backtrace LibTorch appends to its c10::Error
// messages ("\nException raised from ..." or "\nframe #0: ..."), for a
// program's last-resort error line (an exception that is not a
// zerostep::Error, such as a failed allocation); other messages whole.
std::string message_without_backtrace(const std::exception& e);

// Memory this process may still take before the kernel reclaims or kills:
// MemAvailable of /proc/meminfo, lowered to the headroom under the
// process's memory cgroup limit where one is set (v2: memory.max -
// memory.current; v1: memory.limit_in_bytes - memory.usage_in_bytes);
// `source` names which. nullopt where neither can be read. For a
// program that refuses work it cannot hold before starting it (the
// harness's --world).
struct AvailableMemory {
  uint64_t bytes = 0;
  std::string source;
};
std::optional<AvailableMemory> available_memory();
// The readers under it: the bytes of "MemAvailable:  N kB" in the text of
// /proc/meminfo; memory.max - memory.current (0 when current is above),
// nullopt for "max" (no limit) or text that is not a number.
std::optional<uint64_t> meminfo_available_bytes(const std::string& meminfo);
std::optional<uint64_t> cgroup_headroom_bytes(const std::string& max_text,
                                              const std::string& current_text);

}  // namespace zerostep

#endif  // ZEROSTEP_COMMON_CLI_H_
