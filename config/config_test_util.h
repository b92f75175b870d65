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

// The TrainerValues that to_string(TrainerValues) wrote ("micro_batch_size=2
// dtype=bf16 must_match=false"); a name it does not write fails the test.
inline TrainerValues trainer_values_from_string(const std::string& text) {
  TrainerValues t;
  std::istringstream in(text);
  std::string item;
  while (in >> item) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      ADD_FAILURE() << "not name=value: " << item;
      continue;
    }
    const std::string name = item.substr(0, eq), v = item.substr(eq + 1);
    if (name == "micro_batch_size")
      t.micro_batch_size = std::stoll(v);
    else if (name == "gradient_accumulation_steps")
      t.gradient_accumulation_steps = std::stoll(v);
    else if (name == "learning_rate")
      t.learning_rate = std::stod(v);
    else if (name == "adam_beta1")
      t.adam_beta1 = std::stod(v);
    else if (name == "adam_beta2")
      t.adam_beta2 = std::stod(v);
    else if (name == "adam_epsilon")
      t.adam_epsilon = std::stod(v);
    else if (name == "weight_decay")
      t.weight_decay = std::stod(v);
    else if (name == "max_grad_norm")
      t.max_grad_norm = std::stod(v);
    else if (name == "warmup_steps")
      t.warmup_steps = std::stoll(v);
    else if (name == "warmup_ratio")
      t.warmup_ratio = std::stod(v);
    else if (name == "total_steps")
      t.total_steps = std::stoll(v);
    else if (name == "dtype")
      t.dtype = precision_from_string(v);
    else if (name == "hidden_size")
      t.hidden_size = std::stoll(v);
    else if (name == "must_match")
      t.must_match = v == "true";
    else
      ADD_FAILURE() << "unknown trainer value " << name;
  }
  return t;
}

}  // namespace testing_config
}  // namespace zerostep

#define EXPECT_HAS(haystack, needle)                             \
  EXPECT_TRUE(::zerostep::testing_config::has(haystack, needle)) \
      << "'" << needle << "' not in: " << haystack

#endif  // ZEROSTEP_CONFIG_CONFIG_TEST_UTIL_H_
