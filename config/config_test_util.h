// Helpers for the parse_config tests (config/*_test.cc): the problems a
// document has, substring expectations on their messages, and reading the
// corpus' files.
//
// Thread safety: test-only functions; no shared state.
#ifndef ZEROSTEP_CONFIG_CONFIG_TEST_UTIL_H_
#define ZEROSTEP_CONFIG_CONFIG_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"

namespace zerostep {
namespace testing_config {

// `path` (relative to the workspace) among the test's runfiles; `path` as
// it is outside Bazel.
inline std::string runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return path;
  return std::string(srcdir) + "/" + workspace + "/" + path;
}

// The whole file ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The problems parse_config reports; fails the test when it does not throw.
inline std::vector<ConfigProblem> problems_of(const std::string& json,
                                              int world_size = 1) {
  try {
    parse_config(json, world_size);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  ADD_FAILURE() << "parse_config accepted: " << json;
  return {};
}

// The one problem reported for `json`; fails the test unless exactly one.
inline ConfigProblem only_problem(const std::string& json, int world_size = 1) {
  std::vector<ConfigProblem> ps = problems_of(json, world_size);
  EXPECT_EQ(ps.size(), 1u) << json;
  if (ps.empty()) return {};
  return ps[0];
}

inline const ConfigProblem* find_key(const std::vector<ConfigProblem>& ps,
                                     const std::string& key) {
  for (const ConfigProblem& p : ps) {
    if (p.key == key) return &p;
  }
  return nullptr;
}

inline bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace testing_config
}  // namespace zerostep

#define EXPECT_HAS(haystack, needle)                             \
  EXPECT_TRUE(::zerostep::testing_config::has(haystack, needle)) \
      << "'" << needle << "' not in: " << haystack

#endif  // ZEROSTEP_CONFIG_CONFIG_TEST_UTIL_H_
