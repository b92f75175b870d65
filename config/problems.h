// ProblemReporter: what every ds_config section parser shares. It collects
// the problems a parse finds, so that one ConfigError lists them all at once
// (key, value, rule, fix; common/errors.h), and the DeepSpeed keys accepted
// without being acted on (Config::ignored_keys); its typed readers turn a
// JSON value into a bool, a number or a whole number, or record why not.
//
// Problems are appended in the order the calls are made; parsers walk the
// document with ConfigJson (ordered_json), so the order is the document's.
//
// Thread safety: a ProblemReporter belongs to one parse; not thread-safe.
// Ownership: it appends to vectors it does not own, which must outlive it.
#ifndef ZEROSTEP_CONFIG_PROBLEMS_H_
#define ZEROSTEP_CONFIG_PROBLEMS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {

// The JSON type every parser reads: keeps the document's key order, so
// problems and ignored keys come out in the order the user wrote them.
using ConfigJson = nlohmann::ordered_json;

// True when `v` is the string "auto" in any letter case.
bool is_auto(const ConfigJson& v);

// Why an "auto" left in the document (one parse_config could not fill:
// Note [Trainer values] in config/trainer_values.h) is a problem at `key`:
// for a key Hugging Face's integration fills, its rule and the
// TrainerValues field that was not given; for any other key, that "auto"
// means nothing there.
std::string auto_rule(const std::string& key);
// The fix for it: set that TrainerValues field, or `write` (a fix such as
// "write a number >= 0, e.g. 0.001"); for any other key, `write` alone.
std::string auto_fix(const std::string& key, const std::string& write);

class ProblemReporter {
 public:
  // Appends problems to *problems and ignored keys to *ignored_keys.
  // `ignored_keys` may be null for a parser that ignores no key (ignore()
  // is then a bug: InternalError).
  ProblemReporter(std::vector<ConfigProblem>* problems,
                  std::vector<std::string>* ignored_keys);

  // A problem at `key`. When `key` holds a value parse_config filled in
  // for "auto" (set_filled), the rule says so and how it was computed.
  void add(std::string key, std::string value, std::string rule,
           std::string fix);
  // The problem of an "auto" left at `key` (auto_rule, auto_fix); `write`
  // is the fix's "write ..." part.
  void add_auto(const std::string& key, const ConfigJson& v,
                const std::string& write);
  // The keys parse_config filled in for "auto", each with how
  // ("learning_rate = 0.001"); the map must outlive the reporter.
  void set_filled(const std::map<std::string, std::string>* filled) {
    filled_ = filled;
  }
  // Records a DeepSpeed key accepted and not acted on, once.
  void ignore(const std::string& key);
  // A DeepSpeed key zerostep does not implement (config/keys.h Note [Key
  // decisions]): ignored when harmless at `v`, else a problem with the
  // table's rule and fix. False, with nothing recorded, when `key` (a dotted
  // path) is not such a key: one the caller reads, or an unknown one.
  bool unimplemented(const std::string& key, const ConfigJson& v);
  // "is not a ds_config key zerostep knows" (`where` == "ds_config") or
  // "is not a key zerostep knows in <where>". The fix is "did you mean": the
  // ds_config name when `key` is another framework's name for a setting
  // (config_keys::synonym), else `suggestion` when it is not empty.
  void unknown_key(const std::string& key, const ConfigJson& v,
                   const std::string& where, const std::string& suggestion);

  // --- typed readers: return the value, or record why not ---
  // `want` completes "write ..." in a fix, e.g. "a number >= 0".

  std::optional<bool> read_bool(const std::string& key, const ConfigJson& v);
  std::optional<double> read_number(const std::string& key, const ConfigJson& v,
                                    const std::string& want);
  // A whole number; integral floats (5e8, as DeepSpeed files often write
  // bucket sizes) are accepted.
  std::optional<int64_t> read_whole(const std::string& key, const ConfigJson& v,
                                    const std::string& want);
  // "must be <type>" for a value of the wrong JSON type; "auto" gets
  // add_auto, a number in quotes a fix that unquotes it.
  void type_error(const std::string& key, const ConfigJson& v,
                  const std::string& type, const std::string& want);

  // The problems so far, to inspect or amend one (e.g. a fix that needs keys
  // read later).
  size_t size() const { return problems_->size(); }
  bool empty() const { return problems_->empty(); }
  ConfigProblem& problem(size_t i);

 private:
  std::vector<ConfigProblem>* problems_;
  std::vector<std::string>* ignored_keys_;
  const std::map<std::string, std::string>* filled_ = nullptr;
};

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_PROBLEMS_H_
