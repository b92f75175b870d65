#include "common/errors.h"

namespace zerostep {
namespace {

std::string format_problems(const std::vector<ConfigProblem>& problems,
                            const std::string& source) {
  std::ostringstream os;
  os << "invalid ds_config";
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
    : Error(format_problems(problems, "")), problems_(std::move(problems)) {}

ConfigError::ConfigError(std::vector<ConfigProblem> problems,
                         const std::string& source)
    : Error(format_problems(problems, source)),
      problems_(std::move(problems)) {}

namespace internal {

void check_failed(const char* file, int line, const char* cond,
                  const std::string& detail) {
  std::ostringstream os;
  os << "internal invariant failed at " << file << ":" << line << ": "
     << cond;
  if (!detail.empty()) os << " (" << detail << ")";
  os << ". This is a zerostep bug; please report it with the run's seed.";
  throw InternalError(os.str());
}

}  // namespace internal
}  // namespace zerostep
