#include "common/errors.h"

namespace zerostep {

std::string elide(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  const std::string suffix = "... (" + std::to_string(s.size()) + " bytes)";
  // The result fits in max_bytes, so eliding it again changes nothing.
  size_t cut = max_bytes > suffix.size() ? max_bytes - suffix.size() : 0;
  // Back off over UTF-8 continuation bytes (10xxxxxx).
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + suffix;
}

namespace {

std::vector<ConfigProblem> bounded(std::vector<ConfigProblem> problems) {
  for (ConfigProblem& p : problems) {
    p.key = elide(p.key, kConfigProblemFieldBytes);
    p.value = elide(p.value, kConfigProblemFieldBytes);
    p.rule = elide(p.rule, 4096);
    p.fix = elide(p.fix, 4096);
  }
  return problems;
}

std::string format_problems(const std::vector<ConfigProblem>& problems,
                            const std::string& source,
                            const std::string& kind) {
  std::ostringstream os;
  os << "invalid " << kind;
  if (!source.empty()) os << " '" << source << "'";
  os << ": " << problems.size()
     << (problems.size() == 1 ? " problem" : " problems");
  for (const ConfigProblem& p : problems) {
    os << "\n  - " << p.key;
    if (!p.value.empty()) os << " = " << p.value;
    os << ": " << p.rule;
    if (!p.fix.empty()) os << ". Fix: " << p.fix;
  }
  return os.str();
}

}  // namespace

ConfigError::ConfigError(std::vector<ConfigProblem> problems)
    : ConfigError(std::move(problems), "") {}

ConfigError::ConfigError(std::vector<ConfigProblem> problems,
                         const std::string& source)
    : ConfigError(std::move(problems), source, "ds_config") {}

ConfigError::ConfigError(std::vector<ConfigProblem> problems,
                         const std::string& source, const std::string& kind)
    : Error(format_problems(problems = bounded(std::move(problems)),
                            elide(source, 4096), kind)),
      problems_(std::move(problems)) {}

namespace internal {

void check_failed(const char* file, int line, const char* cond,
                  const std::string& detail) {
  std::ostringstream os;
  os << "internal invariant failed at " << file << ":" << line << ": " << cond;
  if (!detail.empty()) os << " (" << detail << ")";
  os << ". This is a zerostep bug; please report it with the run's seed.";
  throw InternalError(os.str());
}

}  // namespace internal
}  // namespace zerostep
