#include "config/trainer_values.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "config/keys.h"
#include "config/zero.h"

namespace zerostep {
namespace config_auto {
namespace {

using Json = ConfigJson;

// The value at dotted `path` in `doc`, or null when a section on the way is
// absent or not an object.
Json* value_at(Json* doc, const std::string& path) {
  Json* node = doc;
  size_t begin = 0;
  while (true) {
    if (!node->is_object()) return nullptr;
    const size_t dot = path.find('.', begin);
    const std::string name = path.substr(begin, dot - begin);
    auto it = node->find(name);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    begin = dot + 1;
  }
}

// The ZeRO stage the document asks for, read as the zero_optimization
// reader accepts it; 0 when absent or invalid (that reader reports it).
int stage_of(const Json& doc) {
  auto zero = doc.find("zero_optimization");
  if (zero == doc.end()) return 0;
  if (zero->is_boolean()) return zero->get<bool>() ? 1 : 0;
  if (!zero->is_object()) return 0;
  auto stage = zero->find("stage");
  if (stage == zero->end() || !stage->is_number()) return 0;
  const double d = stage->get<double>();
  return d == 1.0 || d == 2.0 || d == 3.0 ? static_cast<int>(d) : 0;
}

// A positive whole number the file writes at `path`, if it does.
std::optional<int64_t> whole_at(Json* doc, const std::string& path) {
  const Json* v = value_at(doc, path);
  if (v == nullptr || !v->is_number()) return std::nullopt;
  const double d = v->get<double>();
  if (!(d >= 1 && d < 9.2233720368547758e18) || std::trunc(d) != d)
    return std::nullopt;
  return static_cast<int64_t>(d);
}

std::string text(const Json& v) { return v.dump(); }

// A value the trainer determines for one key, and how ("learning_rate =
// 0.001"); no value when the fields it needs were not given.
struct TrainerValue {
  std::optional<Json> value;
  std::string how;
};

class Filler {
 public:
  Filler(Json* doc, const TrainerValues& t, int world)
      : doc_(doc), t_(t), world_(world), stage_(stage_of(*doc)) {}

  FillResult run() {
    check_hidden_size();
    for (const config_keys::AutoRule& rule : config_keys::kAutoRules) {
      const std::string path = rule.path;
      visit(rule, path);
      if (path == "bf16.enabled") visit(rule, "bfloat16.enabled");
    }
    return std::move(r_);
  }

 private:
  void visit(const config_keys::AutoRule& rule, const std::string& path) {
    Json* v = value_at(doc_, path);
    if (v == nullptr) return;
    if (is_auto(*v)) {
      if (below_stage3_only(rule.path)) {
        default_below_stage3(path);
        return;
      }
      TrainerValue tv = value_for(rule.path);
      if (!tv.value) return;  // the section reports it (add_auto)
      *v = *tv.value;
      r_.filled.push_back(path + " = " + text(*v));
      r_.how[path] = tv.how;
      return;
    }
    if (!t_.must_match || rule.fill_only || v->is_null()) return;
    // The trainer's own value: train_batch_size from its micro and gas.
    if (rule.path == std::string("train_batch_size")) {
      if (!t_.micro_batch_size || !t_.gradient_accumulation_steps) return;
      int64_t want = 0;
      if (__builtin_mul_overflow(*t_.micro_batch_size,
                                 *t_.gradient_accumulation_steps, &want) ||
          __builtin_mul_overflow(want, static_cast<int64_t>(world_), &want) ||
          !v->is_number() || v->get<double>() == static_cast<double>(want))
        return;
      mismatch(path, *v,
               "world_size " + std::to_string(world_) + " × micro " +
                   std::to_string(*t_.micro_batch_size) + " × gas " +
                   std::to_string(*t_.gradient_accumulation_steps) + " = " +
                   std::to_string(want));
      return;
    }
    TrainerValue tv = value_for(rule.path);
    if (!tv.value || !comparable(*v, *tv.value) || same(*v, *tv.value)) return;
    mismatch(path, *v, tv.how);
  }

  void mismatch(const std::string& path, const Json& v,
                const std::string& how) {
    r_.mismatches.push_back(
        {path, text(v),
         "differs from the trainer's value, " + how +
             " (Hugging Face's integration refuses a value written in the "
             "file that disagrees with the trainer's; so does parse_config "
             "while TrainerValues::must_match is true)",
         "write \"auto\" to take the trainer's value, or make the two "
         "agree"});
  }

  // The stage-3 sizes the integration fills at stage 3 only.
  bool below_stage3_only(const std::string& rule_path) const {
    return stage_ < 3 &&
           (rule_path == "zero_optimization.stage3_prefetch_bucket_size" ||
            rule_path ==
                "zero_optimization.stage3_param_persistence_threshold");
  }

  // Below stage 3 the integration leaves them "auto", which DeepSpeed reads
  // as its default; they do nothing there.
  void default_below_stage3(const std::string& path) {
    const ZeroConfig defaults;
    const int64_t d = path == "zero_optimization.stage3_prefetch_bucket_size"
                          ? defaults.stage3_prefetch_bucket_size
                          : defaults.stage3_param_persistence_threshold;
    const std::string section = "zero_optimization.";
    doc_->at("zero_optimization").erase(path.substr(section.size()));
    r_.filled.push_back(path + " = " + std::to_string(d) +
                        " (DeepSpeed's default: the integration fills it at "
                        "stage 3 only)");
  }

  // Comparable when both are numbers, both booleans, or both arrays of as
  // many numbers (a value of another type is the sections' problem).
  static bool comparable(const Json& a, const Json& b) {
    if (a.is_number() && b.is_number()) return true;
    if (a.is_boolean() && b.is_boolean()) return true;
    if (!a.is_array() || !b.is_array() || a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!a[i].is_number() || !b[i].is_number()) return false;
    return true;
  }
  static bool same(const Json& a, const Json& b) {
    if (a.is_number()) return a.get<double>() == b.get<double>();
    if (a.is_boolean()) return a.get<bool>() == b.get<bool>();
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].get<double>() != b[i].get<double>()) return false;
    return true;
  }

  static TrainerValue from(const char* field, const std::optional<double>& v) {
    if (!v) return {};
    return {Json(*v), std::string(field) + " = " + text(Json(*v))};
  }
  static TrainerValue from(const char* field, const std::optional<int64_t>& v) {
    if (!v) return {};
    return {Json(*v), std::string(field) + " = " + std::to_string(*v)};
  }

  TrainerValue value_for(const std::string& path) {
    const TrainerValues& t = t_;
    if (path == "train_micro_batch_size_per_gpu")
      return from("micro_batch_size", t.micro_batch_size);
    if (path == "gradient_accumulation_steps")
      return from("gradient_accumulation_steps", t.gradient_accumulation_steps);
    if (path == "train_batch_size") return train_batch_size();
    if (path == "gradient_clipping")
      return from("max_grad_norm", t.max_grad_norm);
    if (path == "optimizer.params.lr" ||
        path == "scheduler.params.warmup_max_lr")
      return from("learning_rate", t.learning_rate);
    if (path == "optimizer.params.betas") {
      if (!t.adam_beta1 || !t.adam_beta2) return {};
      Json b = Json::array({*t.adam_beta1, *t.adam_beta2});
      return {b, "[adam_beta1, adam_beta2] = " + text(b)};
    }
    if (path == "optimizer.params.eps")
      return from("adam_epsilon", t.adam_epsilon);
    if (path == "optimizer.params.weight_decay")
      return from("weight_decay", t.weight_decay);
    if (path == "scheduler.params.warmup_min_lr")
      return {Json(0), "0 (not a trainer value)"};
    if (path == "fp16.enabled" || path == "bf16.enabled") {
      if (!t.dtype) return {};
      const Precision want =
          path == "fp16.enabled" ? Precision::kFp16 : Precision::kBf16;
      return {Json(*t.dtype == want),
              std::string("dtype = ") + to_string(*t.dtype)};
    }
    if (path == "zero_optimization.reduce_bucket_size") {
      if (!hidden_ok()) return {};
      const int64_t h = *t.hidden_size;
      return {Json(h * h), "hidden_size " + std::to_string(h) + " squared"};
    }
    if (path == "zero_optimization.stage3_prefetch_bucket_size") {
      if (!hidden_ok()) return {};
      const int64_t h = *t.hidden_size;
      // The integration's int(0.9 * hidden_size * hidden_size), in double.
      const double x = 0.9 * static_cast<double>(h) * static_cast<double>(h);
      return {Json(static_cast<int64_t>(x)),
              "int(0.9 × hidden_size " + std::to_string(h) + " squared)"};
    }
    if (path == "zero_optimization.stage3_param_persistence_threshold") {
      if (!hidden_ok()) return {};
      const int64_t h = *t.hidden_size;
      return {Json(10 * h), "10 × hidden_size " + std::to_string(h)};
    }
    if (path == "scheduler.params.total_num_steps")
      return from("total_steps", t.total_steps);
    if (path == "scheduler.params.warmup_num_steps") return warmup_steps();
    ZS_CHECK_MSG(false, "no trainer value for the \"auto\" rule " << path);
    return {};
  }

  // world_size × micro × gas, with the micro batch and GAS the document
  // has once their own "auto" is filled (where it writes them: with
  // must_match they are the trainer's, or a problem of their own), else the
  // trainer's, else (GAS) 1. A micro batch or GAS "auto" left unfilled
  // leaves this one too.
  TrainerValue train_batch_size() {
    if (world_ < 1) return {};  // parse_config reports the world size
    auto pick = [&](const char* key, const std::optional<int64_t>& trainer,
                    std::optional<int64_t> otherwise) {
      const Json* v = value_at(doc_, key);
      if (v != nullptr && !v->is_null()) return whole_at(doc_, key);
      return trainer ? trainer : otherwise;
    };
    const std::optional<int64_t> micro = pick(
        "train_micro_batch_size_per_gpu", t_.micro_batch_size, std::nullopt);
    const std::optional<int64_t> gas =
        pick("gradient_accumulation_steps", t_.gradient_accumulation_steps, 1);
    if (!micro || !gas) return {};
    int64_t tbs = 0;
    if (__builtin_mul_overflow(*micro, *gas, &tbs) ||
        __builtin_mul_overflow(tbs, static_cast<int64_t>(world_), &tbs))
      return {};  // the batch section reports the overflow
    return {Json(tbs), "world_size " + std::to_string(world_) + " × micro " +
                           std::to_string(*micro) + " × gas " +
                           std::to_string(*gas)};
  }

  // warmup_steps when > 0, else ceil(total_steps × warmup_ratio).
  TrainerValue warmup_steps() {
    const TrainerValues& t = t_;
    if (t.warmup_steps && *t.warmup_steps > 0)
      return from("warmup_steps", t.warmup_steps);
    if (t.warmup_ratio && t.total_steps) {
      const double x =
          std::ceil(static_cast<double>(*t.total_steps) * *t.warmup_ratio);
      if (!std::isfinite(x) || std::fabs(x) >= 9.2e18) return {};
      return {Json(static_cast<int64_t>(x)),
              "ceil(total_steps " + std::to_string(*t.total_steps) +
                  " × warmup_ratio " + text(Json(*t.warmup_ratio)) + ")"};
    }
    // warmup_steps 0 without a ratio: the integration's ceil(n × 0.0).
    if (t.warmup_steps) return from("warmup_steps", t.warmup_steps);
    return {};
  }

  bool hidden_ok() const {
    if (!t_.hidden_size || *t_.hidden_size < 1) return false;
    int64_t sq = 0;
    return !__builtin_mul_overflow(*t_.hidden_size, *t_.hidden_size, &sq);
  }

  // A hidden size no bucket can be made of is the caller's mistake.
  void check_hidden_size() {
    if (!t_.hidden_size || hidden_ok()) return;
    r_.mismatches.push_back(
        {"TrainerValues::hidden_size", std::to_string(*t_.hidden_size),
         "must be >= 1 and its square must fit in 64 bits (the model's "
         "hidden size, which the bucket sizes' \"auto\" are made of)",
         "pass the model's hidden size (config.json's hidden_size), or leave "
         "it unset"});
  }

  Json* doc_;
  const TrainerValues& t_;
  const int world_;
  const int stage_;
  FillResult r_;
};

}  // namespace

FillResult fill_auto(ConfigJson* doc, const TrainerValues& trainer,
                     int world_size) {
  ZS_CHECK(doc != nullptr);
  if (!doc->is_object()) return {};
  return Filler(doc, trainer, world_size).run();
}

}  // namespace config_auto

std::string to_string(const TrainerValues& t) {
  std::string s;
  auto add = [&](const char* name, const std::string& v) {
    s += (s.empty() ? "" : " ") + std::string(name) + "=" + v;
  };
  auto i = [&](const char* name, const std::optional<int64_t>& v) {
    if (v) add(name, std::to_string(*v));
  };
  auto d = [&](const char* name, const std::optional<double>& v) {
    if (v) add(name, ConfigJson(*v).dump());
  };
  i("micro_batch_size", t.micro_batch_size);
  i("gradient_accumulation_steps", t.gradient_accumulation_steps);
  d("learning_rate", t.learning_rate);
  d("adam_beta1", t.adam_beta1);
  d("adam_beta2", t.adam_beta2);
  d("adam_epsilon", t.adam_epsilon);
  d("weight_decay", t.weight_decay);
  d("max_grad_norm", t.max_grad_norm);
  i("warmup_steps", t.warmup_steps);
  d("warmup_ratio", t.warmup_ratio);
  i("total_steps", t.total_steps);
  if (t.dtype) add("dtype", to_string(*t.dtype));
  i("hidden_size", t.hidden_size);
  add("must_match", t.must_match ? "true" : "false");
  return s;
}

}  // namespace zerostep
