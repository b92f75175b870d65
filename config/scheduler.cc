#include "config/scheduler.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "config/keys.h"
#include "config/problems.h"
#include "config/text.h"

namespace zerostep {
namespace {

using config_keys::kSchedulerKeys;
using config_keys::kSchedulerParams;
using config_keys::kWarmupCosineLRParams;
using config_keys::kWarmupDecayLRParams;
using config_keys::kWarmupLRParams;
using config_text::contains;
using config_text::lower;

using Json = ConfigJson;

std::string closest(const std::string& word,
                    const std::vector<std::string>& candidates) {
  return config_text::closest(word, {&candidates});
}

constexpr const char* kSupportedTypes =
    "WarmupLR, WarmupDecayLR, WarmupCosineLR";

using Type = LrScheduleSpec::Type;

const std::vector<std::string>& params_of(Type t) {
  switch (t) {
    case Type::kWarmupLR:
      return kWarmupLRParams;
    case Type::kWarmupDecayLR:
      return kWarmupDecayLRParams;
    case Type::kWarmupCosineLR:
      return kWarmupCosineLRParams;
    case Type::kNone:
      break;
  }
  return kSchedulerParams;
}

// "WarmupLR and WarmupDecayLR": the schedules other than `t` that take `name`.
std::string owners_of(const std::string& name, Type t) {
  std::vector<std::string> owners;
  for (Type o :
       {Type::kWarmupLR, Type::kWarmupDecayLR, Type::kWarmupCosineLR}) {
    if (o != t && contains(params_of(o), name)) owners.push_back(to_string(o));
  }
  std::string s;
  for (size_t i = 0; i < owners.size(); ++i) {
    if (i > 0) s += i + 1 == owners.size() ? " and " : ", ";
    s += owners[i];
  }
  return s;
}

// "a, b, c".
std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += ", ";
    s += names[i];
  }
  return s;
}

// A finite JSON number >= 0. `what` says what the value means.
std::optional<double> read_nonneg(ProblemReporter& report,
                                  const std::string& key, const Json& v,
                                  const std::string& want,
                                  const std::string& what) {
  if (v.is_array()) {
    report.add(key, v.dump(),
               "must be a single JSON number (" + what +
                   "); DeepSpeed's per-parameter-group lists are not supported",
               "write one number, " + want);
    return std::nullopt;
  }
  if (!v.is_number()) {
    report.type_error(key, v, "a JSON number (" + what + ")", want);
    return std::nullopt;
  }
  double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) {
    report.add(key, v.dump(), "must be a finite number >= 0 (" + what + ")",
               "write " + want);
    return std::nullopt;
  }
  return d;
}

// warmup_num_steps: a JSON integer >= 1.
std::optional<int64_t> read_warmup_num_steps(ProblemReporter& report,
                                             const std::string& key,
                                             const Json& v) {
  const std::string want = "a positive integer, e.g. 1000";
  if (v.is_number_float()) {
    double d = v.get<double>();
    const bool whole = std::isfinite(d) && std::trunc(d) == d && d >= 1 &&
                       d < 9.2233720368547758e18;
    std::ostringstream as_int;
    if (whole) as_int << static_cast<int64_t>(d);
    report.add(
        key, v.dump(),
        "must be a JSON integer (DeepSpeed raises ValueError unless it is "
        "an int: 1000.0 is not)",
        whole ? "write " + as_int.str() + " (no decimal point)"
              : "write " + want);
    return std::nullopt;
  }
  if (!v.is_number_integer()) {
    report.type_error(key, v, "a JSON integer (the number of warmup steps)",
                      want);
    return std::nullopt;
  }
  if (v.is_number_unsigned() &&
      v.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    report.add(key, v.dump(), "is too large for a 64-bit integer",
               "write " + want);
    return std::nullopt;
  }
  int64_t n = v.get<int64_t>();
  if (n < 1) {
    report.add(key, v.dump(),
               "must be a positive integer (DeepSpeed raises ValueError)",
               "write " + want + "; values below 2 act as 2");
    return std::nullopt;
  }
  return n;
}

// total_num_steps: a whole JSON number >= 1.
std::optional<int64_t> read_total_num_steps(ProblemReporter& report,
                                            const std::string& key,
                                            const Json& v) {
  const std::string want =
      "the number of optimizer steps in the run, e.g. 10000";
  std::optional<int64_t> n;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() >
        static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      report.add(key, v.dump(), "is too large for a 64-bit integer",
                 "write " + want);
      return std::nullopt;
    }
    n = static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (v.is_number_float()) {
    // DeepSpeed does arithmetic with it, so 1e5 works there too.
    double d = v.get<double>();
    if (!(std::isfinite(d) && std::trunc(d) == d &&
          d >= -9.2233720368547758e18 && d < 9.2233720368547758e18)) {
      report.add(key, v.dump(), "must be a whole number of optimizer steps",
                 "write " + want);
      return std::nullopt;
    }
    n = static_cast<int64_t>(d);
  } else {
    report.type_error(key, v, "a whole JSON number (optimizer steps)", want);
    return std::nullopt;
  }
  if (*n < 1) {
    report.add(key, v.dump(), "must be >= 1 (optimizer steps in the run)",
               "write " + want);
    return std::nullopt;
  }
  return n;
}

// warmup_type: "log" or "linear", exactly.
std::optional<WarmupType> read_warmup_type(ProblemReporter& report,
                                           const std::string& key,
                                           const Json& v) {
  const std::string want = "\"log\" or \"linear\"";
  if (!v.is_string() || is_auto(v)) {
    report.type_error(key, v, "a JSON string, \"log\" or \"linear\"", want);
    return std::nullopt;
  }
  const std::string s = v.get<std::string>();
  if (s == "log") {
    return WarmupType::kLog;
  }
  if (s == "linear") {
    return WarmupType::kLinear;
  }
  static const std::vector<std::string> kWarmupTypes = {"log", "linear"};
  std::string guess = closest(s, kWarmupTypes);
  report.add(
      key, v.dump(),
      "must be \"log\" or \"linear\", in lower case (DeepSpeed would "
      "silently warm up with \"log\" instead)",
      guess.empty() ? "write " + want : "did you mean \"" + guess + "\"?");
  return std::nullopt;
}

// last_batch_iteration: only DeepSpeed's default -1.
void check_last_batch_iteration(ProblemReporter& report, const std::string& key,
                                const Json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned() &&
      v.get<int64_t>() == -1) {
    return;  // DeepSpeed's default: start from the beginning.
  }
  report.add(key, v.dump(),
             "only -1 (the default, start at the beginning) is supported; a "
             "resumed run takes the iteration from its checkpoint",
             "remove it");
}

class ScheduleParser {
 public:
  ScheduleParser(LrScheduleSpec* out, std::vector<ConfigProblem>* problems,
                 const std::map<std::string, std::string>* filled)
      : out_(out), report_(problems, nullptr) {
    report_.set_filled(filled);
  }

  void run(const Json& section) {
    *out_ = LrScheduleSpec();
    if (!section.is_object()) {
      add("scheduler", section.dump(),
          is_auto(section) ? auto_rule("scheduler") : "must be a JSON object",
          "write { \"type\": \"WarmupLR\", \"params\": { \"warmup_num_steps\": "
          "1000 } }, or remove the section for a constant lr");
      return;
    }
    check_section_keys(section);
    const bool type_known = parse_type(section);
    const Json* params = find_params(section);
    if (params == nullptr) return;
    parse_params(*params, type_known);
  }

 private:
  bool needs_total() const {
    return out_->type == Type::kWarmupDecayLR ||
           out_->type == Type::kWarmupCosineLR;
  }

  void add(std::string key, std::string value, std::string rule,
           std::string fix) {
    report_.add(std::move(key), std::move(value), std::move(rule),
                std::move(fix));
  }

  // Every key of the section besides "type" and "params" is a problem.
  void check_section_keys(const Json& section) {
    for (auto it = section.begin(); it != section.end(); ++it) {
      if (contains(kSchedulerKeys, it.key())) continue;
      std::string guess = closest(it.key(), kSchedulerKeys);
      add("scheduler." + it.key(), it.value().dump(),
          "is not a key of the scheduler section (DeepSpeed reads only "
          "\"type\" and \"params\")",
          guess.empty() ? "remove it; schedule parameters go in "
                          "\"params\""
                        : "did you mean \"" + guess + "\"?");
    }
  }

  // The section's "params" object, or nullptr (a problem reported) when it
  // is missing or not an object.
  const Json* find_params(const Json& section) {
    auto params = section.find("params");
    if (params == section.end()) {
      add("scheduler.params", "",
          "is required when the scheduler section is present (DeepSpeed "
          "calls the schedule's constructor with **params and fails without "
          "it)",
          needs_total()
              ? "add \"params\": { \"total_num_steps\": <optimizer steps in "
                "the run> }"
              : "add \"params\": {} to keep every default, or e.g. "
                "\"params\": { \"warmup_num_steps\": 1000 }");
      return nullptr;
    }
    if (!params->is_object()) {
      add("scheduler.params", params->dump(),
          is_auto(*params) ? auto_rule("scheduler.params")
                           : "must be a JSON object",
          "write { \"warmup_num_steps\": 1000, ... }");
      return nullptr;
    }
    return &*params;
  }

  // Each parameter, then the total_num_steps its type requires.
  void parse_params(const Json& params, bool type_known) {
    bool total_seen = false;
    for (auto it = params.begin(); it != params.end(); ++it) {
      if (it.key() == "total_num_steps") total_seen = true;
      parse_param(it.key(), it.value(), type_known);
    }
    if (type_known && needs_total() && !total_seen) {
      add("scheduler.params.total_num_steps", "",
          std::string("is required by ") + to_string(out_->type) +
              " (the step at which " +
              (out_->type == Type::kWarmupDecayLR
                   ? "the decay reaches warmup_min_lr"
                   : "the ratio reaches cos_min_ratio") +
              "); DeepSpeed has no default",
          "add \"total_num_steps\": <the number of optimizer steps in the "
          "run>");
    }
  }

  // Returns whether the type is one of the three; sets out_->type if so.
  bool parse_type(const Json& section) {
    const std::string key = "scheduler.type";
    const std::string want =
        "write \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"";
    auto type = section.find("type");
    if (type == section.end()) {
      add(key, "",
          "is required when the scheduler section is present (without it "
          "DeepSpeed silently trains with a constant lr)",
          "add \"type\": \"WarmupLR\" (or \"WarmupDecayLR\", "
          "\"WarmupCosineLR\"), or remove the scheduler section");
      return false;
    }
    if (is_auto(*type)) {
      report_.add_auto(key, *type, want);
      return false;
    }
    if (!type->is_string()) {
      add(key, type->dump(), "must be a JSON string", want);
      return false;
    }
    const std::string t = type->get<std::string>();
    for (Type c :
         {Type::kWarmupLR, Type::kWarmupDecayLR, Type::kWarmupCosineLR}) {
      const std::string name = to_string(c);
      if (t == name) {
        out_->type = c;
        return true;
      }
      if (lower(t) == lower(name)) {
        add(key, type->dump(),
            "must be spelt exactly \"" + name +
                "\" (DeepSpeed looks the class up by name, case-sensitively)",
            "did you mean \"" + name + "\"?");
        return false;
      }
    }
    if (t == "LRRangeTest" || t == "OneCycle") {
      add(key, type->dump(),
          "is a DeepSpeed schedule zerostep does not implement; supported: " +
              std::string(kSupportedTypes),
          "use one of those, or remove the scheduler section for a constant "
          "lr");
      return false;
    }
    static const std::vector<std::string> kTypes = {"WarmupLR", "WarmupDecayLR",
                                                    "WarmupCosineLR"};
    std::string guess = closest(t, kTypes);
    add(key, type->dump(),
        "is not a schedule zerostep implements; supported: " +
            std::string(kSupportedTypes),
        guess.empty() ? want : "did you mean \"" + guess + "\"?");
    return false;
  }

  void parse_param(const std::string& name, const Json& v, bool type_known) {
    const std::string key = "scheduler.params." + name;
    const Type t = out_->type;
    if (name == "last_batch_iteration") {
      check_last_batch_iteration(report_, key, v);
      return;
    }
    if (type_known && !contains(params_of(t), name) &&
        contains(kSchedulerParams, name)) {
      report_other_schedules_param(key, name, v);
      return;
    }
    if (!contains(kSchedulerParams, name)) {
      report_unknown_param(key, name, v, type_known);
      return;
    }
    parse_known_param(key, name, v, type_known);
  }

  // A parameter of another schedule than the known type `out_->type`.
  void report_other_schedules_param(const std::string& key,
                                    const std::string& name, const Json& v) {
    const Type t = out_->type;
    std::string fix = "remove it";
    if (t == Type::kWarmupCosineLR &&
        (name == "warmup_min_lr" || name == "warmup_max_lr")) {
      fix +=
          ": WarmupCosineLR scales optimizer.params.lr by a ratio; set the "
          "peak lr there and the start as warmup_min_ratio";
    } else if (t == Type::kWarmupLR && name == "total_num_steps") {
      fix += ", or use \"type\": \"WarmupDecayLR\" to decay after the warmup";
    } else {
      fix +=
          ", or use \"type\": \"WarmupCosineLR\" for ratios of "
          "optimizer.params.lr";
    }
    add(key, v.dump(),
        "is a parameter of " + owners_of(name, t) + "; " + to_string(t) +
            " does not take it (DeepSpeed raises TypeError)",
        fix);
  }

  // A parameter of no schedule: "did you mean" among the type's (all
  // schedules' when the type is unknown).
  void report_unknown_param(const std::string& key, const std::string& name,
                            const Json& v, bool type_known) {
    const Type t = out_->type;
    std::vector<std::string> candidates = params_of(t);
    if (!contains(candidates, "last_batch_iteration")) {
      candidates.push_back("last_batch_iteration");
    }
    std::string guess = config_keys::synonym(key);
    if (guess.empty()) guess = closest(name, candidates);
    add(key, v.dump(),
        type_known ? std::string("is not a parameter of ") + to_string(t)
                   : std::string("is not a parameter of any schedule "
                                 "zerostep implements"),
        guess.empty() ? "remove it; " +
                            (type_known ? std::string(to_string(t))
                                        : std::string("the schedule")) +
                            " takes " + join(candidates)
                      : "did you mean \"" + guess + "\"?");
  }

  // A parameter the schedule takes: its value into *out_.
  void parse_known_param(const std::string& key, const std::string& name,
                         const Json& v, bool type_known) {
    const Type t = out_->type;
    if (name == "warmup_min_lr") {
      if (auto d = read_nonneg(report_, key, v, "0 or a small lr, e.g. 1e-6",
                               "the lr at the start of the warmup")) {
        out_->warmup_min_lr = *d;
      }
    } else if (name == "warmup_max_lr" && v.is_null()) {
      // DeepSpeed's WarmupLR reads None as optimizer.params.lr, which is
      // its default; WarmupDecayLR passes None on, so there null means
      // optimizer.params.lr instead of its default 0.001.
      if (type_known && t == Type::kWarmupLR) return;
      add(key, v.dump(),
          "null means optimizer.params.lr in DeepSpeed, which zerostep "
          "supports only as WarmupLR's default, not for " +
              std::string(type_known ? to_string(t) : "this schedule") +
              " (whose default is 0.001)",
          "write the peak lr, e.g. the value of optimizer.params.lr, or "
          "remove the key for 0.001");
    } else if (name == "warmup_max_lr") {
      if (auto d = read_nonneg(report_, key, v, "the peak lr, e.g. 0.001",
                               "the lr at the end of the warmup")) {
        out_->warmup_max_lr = *d;
      }
    } else if (name == "warmup_num_steps") {
      if (auto n = read_warmup_num_steps(report_, key, v))
        out_->warmup_num_steps = *n;
    } else if (name == "total_num_steps") {
      if (auto n = read_total_num_steps(report_, key, v))
        out_->total_num_steps = *n;
    } else if (name == "warmup_type") {
      // null: DeepSpeed warns and warms up with "log", its default.
      if (v.is_null()) return;
      if (auto w = read_warmup_type(report_, key, v)) out_->warmup_type = *w;
    } else if (name == "warmup_min_ratio") {
      if (auto d = read_nonneg(report_, key, v, "a ratio such as 0 or 0.01",
                               "the ratio of optimizer.params.lr at the "
                               "start of the warmup")) {
        out_->warmup_min_ratio = *d;
      }
    } else if (name == "cos_min_ratio") {
      if (auto d = read_nonneg(report_, key, v, "a ratio such as 0.0001 or 0.1",
                               "the ratio of optimizer.params.lr at the end "
                               "of the cosine decay")) {
        out_->cos_min_ratio = *d;
      }
    }
  }

  LrScheduleSpec* out_;
  ProblemReporter report_;
};

}  // namespace

const char* to_string(LrScheduleSpec::Type t) {
  switch (t) {
    case Type::kNone:
      return "none";
    case Type::kWarmupLR:
      return "WarmupLR";
    case Type::kWarmupDecayLR:
      return "WarmupDecayLR";
    case Type::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "?";
}

const char* to_string(WarmupType t) {
  switch (t) {
    case WarmupType::kLog:
      return "log";
    case WarmupType::kLinear:
      return "linear";
  }
  return "?";
}

void parse_lr_schedule(const nlohmann::json& section, LrScheduleSpec* out,
                       std::vector<ConfigProblem>* problems) {
  // std::map's key order, which is what this overload reports in.
  parse_lr_schedule(nlohmann::ordered_json(section), out, problems);
}

void parse_lr_schedule(const nlohmann::ordered_json& section,
                       LrScheduleSpec* out,
                       std::vector<ConfigProblem>* problems,
                       const std::map<std::string, std::string>* filled) {
  ScheduleParser(out, problems, filled).run(section);
}

}  // namespace zerostep
