#include "config/problems.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "config/keys.h"
#include "config/text.h"

namespace zerostep {

using config_text::contains;
using config_text::looks_numeric;
using config_text::lower;

bool is_auto(const ConfigJson& v) {
  return v.is_string() && lower(v.get<std::string>()) == "auto";
}

std::string auto_rule(const std::string& key) {
  const config_keys::AutoRule* r = config_keys::find_auto_rule(key);
  if (r == nullptr)
    return "\"auto\" stands for a trainer's value only in the keys Hugging "
           "Face's DeepSpeed integration fills (docs/config.md lists them), "
           "and " +
           key + " is not one of them";
  return std::string(
             "\"auto\" is the trainer's value: Hugging Face's "
             "DeepSpeed integration fills it with ") +
         r->rule +
         ", and parse_config was not given TrainerValues::" + r->field;
}

std::string auto_fix(const std::string& key, const std::string& write) {
  const config_keys::AutoRule* r = config_keys::find_auto_rule(key);
  if (r == nullptr || *r->field == '\0') return write;
  return std::string("set TrainerValues::") + r->field +
         " in the trainer values given to parse_config, or " + write;
}

ProblemReporter::ProblemReporter(std::vector<ConfigProblem>* problems,
                                 std::vector<std::string>* ignored_keys)
    : problems_(problems), ignored_keys_(ignored_keys) {
  ZS_CHECK(problems_ != nullptr);
}

void ProblemReporter::add(std::string key, std::string value, std::string rule,
                          std::string fix) {
  if (filled_ != nullptr) {
    auto it = filled_->find(key);
    if (it != filled_->end())
      rule +=
          " (the file says \"auto\" here; parse_config filled in the "
          "trainer's value: " +
          it->second + ")";
  }
  problems_->push_back(
      {std::move(key), std::move(value), std::move(rule), std::move(fix)});
}

void ProblemReporter::add_auto(const std::string& key, const ConfigJson& v,
                               const std::string& write) {
  add(key, v.dump(), auto_rule(key), auto_fix(key, write));
}

void ProblemReporter::ignore(const std::string& key) {
  ZS_CHECK_MSG(ignored_keys_ != nullptr, "no list for ignored key " << key);
  const std::string bounded = elide(key, kConfigProblemFieldBytes);
  if (!contains(*ignored_keys_, bounded)) ignored_keys_->push_back(bounded);
}

bool ProblemReporter::unimplemented(const std::string& key,
                                    const ConfigJson& v) {
  using config_keys::Treatment;
  const config_keys::DeepSpeedKey* k = config_keys::find_key(key);
  if (k == nullptr || k->treatment == Treatment::kRead) return false;
  if (k->treatment == Treatment::kIgnored ||
      (k->treatment == Treatment::kIgnoredWhen && k->harmless(v))) {
    ignore(key);
    return true;
  }
  if (is_auto(v)) {
    add_auto(key, v, k->fix);
    return true;
  }
  std::string rule;
  if (k->rule != nullptr) {
    rule = k->rule;
  } else {
    rule = std::string("changes training; zerostep does not implement it (") +
           k->why + ")";
  }
  add(key, v.dump(), std::move(rule), k->fix);
  return true;
}

void ProblemReporter::unknown_key(const std::string& key, const ConfigJson& v,
                                  const std::string& where,
                                  const std::string& suggestion) {
  // Another framework's name is a surer guess than the closest spelling.
  const std::string other = config_keys::synonym(key);
  const std::string guess = other.empty() ? suggestion : other;
  add(key, v.dump(),
      where == "ds_config" ? "is not a ds_config key zerostep knows"
                           : "is not a key zerostep knows in " + where,
      guess.empty() ? "remove it; docs/config.md lists every supported key"
                    : "did you mean \"" + guess + "\"?");
}

std::optional<bool> ProblemReporter::read_bool(const std::string& key,
                                               const ConfigJson& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (is_auto(v)) {
    add_auto(key, v, "write true or false (a JSON boolean, no quotes)");
    return std::nullopt;
  }
  std::string fix = "write true or false (a JSON boolean, no quotes)";
  if (v.is_string()) {
    std::string s = lower(v.get<std::string>());
    if (s == "true" || s == "false") {
      fix = "write " + s + " (a JSON boolean, no quotes)";
    }
  }
  add(key, v.dump(), "must be a JSON boolean (true or false)", fix);
  return std::nullopt;
}

std::optional<double> ProblemReporter::read_number(const std::string& key,
                                                   const ConfigJson& v,
                                                   const std::string& want) {
  if (v.is_number()) return v.get<double>();
  type_error(key, v, "a JSON number", want);
  return std::nullopt;
}

std::optional<int64_t> ProblemReporter::read_whole(const std::string& key,
                                                   const ConfigJson& v,
                                                   const std::string& want) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    return v.get<int64_t>();
  }
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(u);
    }
    add(key, v.dump(), "is too large for a 64-bit integer", "write " + want);
    return std::nullopt;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^63 is exactly representable; anything >= it does not fit.
    if (std::isfinite(d) && std::trunc(d) == d && d >= -9.2233720368547758e18 &&
        d < 9.2233720368547758e18) {
      return static_cast<int64_t>(d);
    }
    add(key, v.dump(), "must be a whole number", "write " + want);
    return std::nullopt;
  }
  type_error(key, v, "a whole JSON number", want);
  return std::nullopt;
}

void ProblemReporter::type_error(const std::string& key, const ConfigJson& v,
                                 const std::string& type,
                                 const std::string& want) {
  if (is_auto(v)) {
    add_auto(key, v, "write " + want);
    return;
  }
  std::string fix = "write " + want;
  if (v.is_string() && looks_numeric(v.get<std::string>())) {
    fix = "write " + v.get<std::string>() + " (a JSON number, no quotes)";
  }
  add(key, v.dump(), "must be " + type, fix);
}

ConfigProblem& ProblemReporter::problem(size_t i) {
  ZS_CHECK(i < problems_->size());
  return (*problems_)[i];
}

}  // namespace zerostep
