#include "common/cli.h"

#include <cctype>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <fstream>
#include <sstream>
#include <system_error>

#include "common/errors.h"

namespace zerostep {
namespace {

constexpr size_t kTextBytes = 64;

[[noreturn]] void refuse(const std::string& name, const std::string& text,
                         const std::string& rule, const std::string& example) {
  throw UsageError(name + "=" + elide(text, kTextBytes) + ": " + rule +
                   ". Fix: write e.g. " + name + "=" + example);
}

// from_chars over the whole text.
template <typename T>
NumberText read_whole(const std::string& text, T* out) {
  const char* end = text.data() + text.size();
  T x{};
  const auto r = std::from_chars(text.data(), end, x);
  if (r.ec == std::errc::result_out_of_range) return NumberText::kOutOfRange;
  if (text.empty() || r.ec != std::errc() || r.ptr != end)
    return NumberText::kNotANumber;
  *out = x;
  return NumberText::kOk;
}

std::string show(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

NumberText read_int(const std::string& text, int64_t* out) {
  return read_whole(text, out);
}

NumberText read_uint64(const std::string& text, uint64_t* out) {
  return read_whole(text, out);
}

NumberText read_double(const std::string& text, double* out) {
  double x = 0;
  const NumberText r = read_whole(text, &x);
  if (r != NumberText::kOk) return r;
  // from_chars reads "inf" and "nan"; neither is a setting's value.
  if (!std::isfinite(x)) return NumberText::kNotANumber;
  *out = x;
  return NumberText::kOk;
}

NumberText read_bytes(const std::string& text, uint64_t* out) {
  std::string digits = text;
  int shift = 0;
  if (!digits.empty()) {
    const char* units = "KMGT";
    for (int i = 0; i < 4; ++i)
      if (std::toupper(static_cast<unsigned char>(digits.back())) == units[i])
        shift = 10 * (i + 1);
    if (shift != 0) digits.pop_back();
  }
  uint64_t x = 0;
  const NumberText r = read_whole(digits, &x);
  if (r != NumberText::kOk) return r;
  if (shift != 0 && x > (UINT64_MAX >> shift)) return NumberText::kOutOfRange;
  *out = x << shift;
  return NumberText::kOk;
}

int64_t parse_int(const std::string& name, const std::string& text, int64_t min,
                  int64_t max, std::optional<int64_t> example) {
  const std::string fix = std::to_string(example.value_or(min));
  const std::string rule = "must be an integer from " + std::to_string(min) +
                           " to " + std::to_string(max);
  int64_t x = 0;
  const NumberText r = read_int(text, &x);
  if (r != NumberText::kOk)
    refuse(
        name, text,
        (r == NumberText::kOutOfRange ? "out of range: " : "not an integer: ") +
            rule,
        fix);
  if (x < min || x > max) refuse(name, text, rule, fix);
  return x;
}

uint64_t parse_uint64(const std::string& name, const std::string& text) {
  uint64_t x = 0;
  const NumberText r = read_uint64(text, &x);
  if (r != NumberText::kOk)
    refuse(name, text,
           std::string(r == NumberText::kOutOfRange
                           ? "out of range: "
                           : "not a non-negative integer: ") +
               "must be digits only, at most 18446744073709551615",
           "1");
  return x;
}

uint64_t parse_bytes(const std::string& name, const std::string& text,
                     uint64_t min, uint64_t max, const std::string& example) {
  const std::string rule =
      "must be a byte count from " + std::to_string(min) + " to " +
      std::to_string(max) + " (digits, optionally with K, M, G or T: 1024, " +
      "1024^2, 1024^3, 1024^4 times)";
  uint64_t x = 0;
  const NumberText r = read_bytes(text, &x);
  if (r != NumberText::kOk)
    refuse(name, text,
           (r == NumberText::kOutOfRange ? "out of range: "
                                         : "not a byte count: ") +
               rule,
           example);
  if (x < min || x > max) refuse(name, text, rule, example);
  return x;
}

double parse_double(const std::string& name, const std::string& text,
                    double min, double max, std::optional<double> example) {
  const std::string fix = show(example.value_or(min));
  const std::string rule =
      "must be a finite number from " + show(min) + " to " + show(max);
  double x = 0;
  // A double out of range ("1e999") is not a finite number either.
  if (read_double(text, &x) != NumberText::kOk)
    refuse(name, text, "not a number: " + rule, fix);
  if (x < min || x > max) refuse(name, text, rule, fix);
  return x;
}

std::string message_without_backtrace(const std::exception& e) {
  std::string m = e.what();
  for (const char* marker : {"\nException raised from ", "\nframe #"}) {
    const size_t at = m.find(marker);
    if (at != std::string::npos) m.erase(at);
  }
  return m;
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The digits of `text` without the surrounding blanks and newline.
std::string trimmed(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return text.substr(b, text.find_last_not_of(" \t\n") - b + 1);
}

}  // namespace

std::optional<uint64_t> meminfo_available_bytes(const std::string& meminfo) {
  std::istringstream lines(meminfo);
  std::string key;
  while (lines >> key) {
    if (key == "MemAvailable:") {
      std::string number, unit;
      uint64_t kib = 0;
      if (!(lines >> number >> unit) || unit != "kB" ||
          read_uint64(number, &kib) != NumberText::kOk ||
          kib > UINT64_MAX / 1024)
        return std::nullopt;
      return kib * 1024;
    }
    std::getline(lines, key);
  }
  return std::nullopt;
}

std::optional<uint64_t> cgroup_headroom_bytes(const std::string& max_text,
                                              const std::string& current_text) {
  uint64_t max = 0, current = 0;
  if (read_uint64(trimmed(max_text), &max) != NumberText::kOk ||
      read_uint64(trimmed(current_text), &current) != NumberText::kOk)
    return std::nullopt;
  return max > current ? max - current : 0;
}

std::optional<AvailableMemory> available_memory() {
  std::optional<AvailableMemory> result;
  if (const auto bytes = meminfo_available_bytes(read_text("/proc/meminfo")))
    result = AvailableMemory{*bytes, "MemAvailable in /proc/meminfo"};
  // The process's memory cgroup, from its line in /proc/self/cgroup:
  // "0::/path" (v2: memory.max, memory.current under /sys/fs/cgroup) or
  // "N:memory:/path" (v1: memory.limit_in_bytes, memory.usage_in_bytes
  // under /sys/fs/cgroup/memory; "no limit" reads as about 2^63).
  std::istringstream groups(read_text("/proc/self/cgroup"));
  std::string line;
  while (std::getline(groups, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const bool v2 = line.compare(0, first, "0") == 0 && controllers.empty();
    if (!v2 && controllers != "memory") continue;
    std::string dir = (v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory") +
                      line.substr(second + 1);
    if (dir.back() == '/') dir.pop_back();  // the root group
    const std::string limit =
        dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes");
    const auto headroom = cgroup_headroom_bytes(
        read_text(limit),
        read_text(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes")));
    if (headroom && (!result || *headroom < result->bytes))
      result = AvailableMemory{*headroom,
                               "the cgroup limit " + limit + " less its use"};
  }
  return result;
}

}  // namespace zerostep
