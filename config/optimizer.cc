#include "config/optimizer.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "config/keys.h"
#include "config/text.h"

namespace zerostep {
namespace {

using config_keys::kOptimizerKeys;
using config_keys::names_under;
using config_text::closest;
using config_text::contains;
using config_text::lower;

using Json = ConfigJson;

}  // namespace

void OptimizerSection::parse(const Json& v) {
  if (!v.is_object()) {
    report_->add(
        "optimizer", v.dump(), "must be a JSON object",
        "write { \"type\": \"AdamW\", \"params\": { \"lr\": 0.001 } }");
    return;
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string key = "optimizer." + it.key();
    if (!contains(kOptimizerKeys, it.key()) &&
        !report_->unimplemented(key, it.value())) {
      static const std::vector<std::string> kNames = names_under("optimizer");
      report_->unknown_key(key, it.value(), "optimizer",
                           closest(it.key(), {&kNames}));
    }
  }
  bool type_known = false;
  bool type_is_adam = false;
  auto type = v.find("type");
  if (type == v.end()) {
    report_->add("optimizer.type", "",
                 "is required when the optimizer section is present",
                 "add \"type\": \"AdamW\" (or \"Adam\", \"SGD\")");
  } else if (!type->is_string()) {
    report_->add("optimizer.type", type->dump(), "must be a JSON string",
                 "write \"AdamW\", \"Adam\" or \"SGD\"");
  } else {
    const std::string t = lower(type->get<std::string>());
    if (t == "adam") {
      // DeepSpeed's "Adam" decouples weight decay (adam_w_mode defaults
      // to true); params.adam_w_mode = false selects L2 Adam below.
      out_->type = OptimizerType::kAdamW;
      type_is_adam = true;
      type_known = true;
    } else if (t == "adamw") {
      out_->type = OptimizerType::kAdamW;
      type_known = true;
    } else if (t == "sgd") {
      out_->type = OptimizerType::kSGD;
      type_known = true;
    } else {
      static const std::vector<std::string> kTypes = {"Adam", "AdamW", "SGD"};
      std::string guess = closest(t, {&kTypes});
      report_->add("optimizer.type", type->dump(),
                   "is not an optimizer zerostep implements; supported: Adam, "
                   "AdamW, SGD (any letter case)",
                   guess.empty() ? "write \"AdamW\", \"Adam\" or \"SGD\""
                                 : "did you mean \"" + guess + "\"?");
    }
  }
  auto params = v.find("params");
  // null: DeepSpeed constructs the optimizer with no parameters given.
  if (params == v.end() || params->is_null()) return;
  if (!params->is_object()) {
    report_->add("optimizer.params", params->dump(), "must be a JSON object",
                 "write { \"lr\": 0.001, ... }");
    return;
  }
  const bool sgd = type_known && out_->type == OptimizerType::kSGD;
  const bool adam = type_known && !sgd;
  OptimizerConfig& o = *out_;
  for (auto it = params->begin(); it != params->end(); ++it) {
    const std::string& name = it.key();
    const std::string key = "optimizer.params." + name;
    const Json& p = it.value();
    if (name == "lr") {
      if (auto d = report_->read_number(key, p, "a number >= 0, e.g. 0.001")) {
        if (*d < 0) {
          report_->add(key, p.dump(), "must be >= 0",
                       "write a number >= 0, e.g. 0.001");
        } else {
          o.lr = *d;
        }
      }
    } else if (name == "betas") {
      if (sgd) {
        not_for_type(key, p, "Adam and AdamW");
      } else {
        parse_betas(key, p);
      }
    } else if (name == "eps") {
      if (sgd) {
        not_for_type(key, p, "Adam and AdamW");
      } else if (auto d =
                     report_->read_number(key, p, "a number > 0, e.g. 1e-8")) {
        if (!(*d > 0)) {
          report_->add(key, p.dump(),
                       "must be > 0 (it keeps the update finite)",
                       "write a small positive number, e.g. 1e-8");
        } else {
          o.eps = *d;
        }
      }
    } else if (name == "weight_decay") {
      if (auto d = report_->read_number(key, p, "a number >= 0, e.g. 0.01")) {
        if (*d < 0) {
          report_->add(key, p.dump(), "must be >= 0",
                       "write 0 for none, or a positive number such as 0.01");
        } else {
          o.weight_decay = *d;
        }
      }
    } else if (name == "momentum") {
      if (adam) {
        not_for_type(key, p, "SGD");
      } else if (auto d =
                     report_->read_number(key, p, "a number >= 0, e.g. 0.9")) {
        if (*d < 0) {
          report_->add(key, p.dump(), "must be >= 0",
                       "write a number >= 0, e.g. 0.9");
        } else {
          o.momentum = *d;
        }
      }
    } else if (name == "bias_correction") {
      if (sgd) {
        not_for_type(key, p, "Adam and AdamW");
      } else if (p.is_null()) {
        report_->add(key, p.dump(),
                     "null is not the default here: DeepSpeed's Adam kernels "
                     "read it as false (no bias correction), while an absent "
                     "bias_correction means true",
                     "write true (bias-corrected Adam) or false, or remove "
                     "it for true");
      } else if (auto b = report_->read_bool(key, p)) {
        o.bias_correction = *b;
      }
    } else if (name == "adam_w_mode") {
      if (p.is_null()) {
        report_->add(key, p.dump(),
                     "null is not the default here: DeepSpeed hands it to "
                     "its Adam, which reads it as false (L2 weight decay), "
                     "while an absent adam_w_mode means true",
                     "write true (decoupled weight decay, AdamW) or false "
                     "(L2, Adam), or remove it for true");
      } else if (!p.is_boolean()) {
        report_->add(key, p.dump(), "must be a JSON boolean",
                     "write true (decoupled weight decay, AdamW) or false (L2, "
                     "Adam)");
      } else if (!type_is_adam) {
        report_->ignore(key);  // DeepSpeed reads it for "Adam" only
      } else if (!p.get<bool>()) {
        o.type = OptimizerType::kAdam;
      }
    } else if (!report_->unimplemented(key, p)) {
      static const std::vector<std::string> kNames =
          names_under("optimizer.params");
      report_->unknown_key(key, p, "optimizer.params",
                           closest(name, {&kNames}));
    }
  }
}

void OptimizerSection::not_for_type(const std::string& key, const Json& v,
                                    const std::string& types) {
  report_->add(key, v.dump(),
               "applies to " + types + " only, not to optimizer.type \"" +
                   to_string(out_->type) + "\"",
               "remove it, or change optimizer.type");
}

void OptimizerSection::parse_betas(const std::string& key, const Json& v) {
  const std::string want = "[b1, b2], two numbers in [0, 1), e.g. [0.9, 0.999]";
  if (is_auto(v)) {
    report_->add_auto(key, v, "write " + want);
    return;
  }
  if (!v.is_array() || v.size() != 2) {
    report_->add(key, v.dump(), "must be a JSON array of two numbers",
                 "write " + want);
    return;
  }
  double b[2] = {out_->beta1, out_->beta2};
  bool ok = true;
  for (size_t i = 0; i < 2; ++i) {
    const std::string k = key + "[" + std::to_string(i) + "]";
    auto d = report_->read_number(k, v[i], "a number in [0, 1)");
    if (!d) {
      ok = false;
    } else if (!(*d >= 0 && *d < 1)) {
      report_->add(k, v[i].dump(), "must be in [0, 1)",
                   i == 0 ? "write a number in [0, 1), e.g. 0.9"
                          : "write a number in [0, 1), e.g. 0.999");
      ok = false;
    } else {
      b[i] = *d;
    }
  }
  if (ok) {
    out_->beta1 = b[0];
    out_->beta2 = b[1];
  }
}

const char* to_string(OptimizerType t) {
  switch (t) {
    case OptimizerType::kAdam:
      return "Adam";
    case OptimizerType::kAdamW:
      return "AdamW";
    case OptimizerType::kSGD:
      return "SGD";
  }
  return "unknown";
}

}  // namespace zerostep
