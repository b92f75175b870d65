#include "config/precision.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "config/keys.h"
#include "config/text.h"

namespace zerostep {
namespace {

using config_keys::names_under;
using config_text::closest;
using config_text::lower;

using Json = ConfigJson;

}  // namespace

std::optional<bool> PrecisionSection::section_enabled(const std::string& key,
                                                      const Json& v) {
  if (!v.is_object()) {
    report_->add(key, v.dump(), "must be a JSON object",
                 "write { \"enabled\": true } or remove the section");
    return std::nullopt;
  }
  auto it = v.find("enabled");
  if (it == v.end()) return false;
  return report_->read_bool(key + ".enabled", *it);
}

void PrecisionSection::enable_precision(const std::string& key, Precision p) {
  if (!precision_key_.empty()) {
    report_->add(key + ".enabled", "true",
                 "cannot be combined with " + precision_key_ +
                     ".enabled = true: one training dtype at a time",
                 "enable one of fp16 and bf16");
    return;
  }
  precision_key_ = key;
  out_->dtype = p;
}

void PrecisionSection::parse_fp16(const Json& v) {
  auto enabled = section_enabled("fp16", v);
  if (!enabled) return;
  PrecisionConfig& pc = *out_;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& name = it.key();
    const std::string key = "fp16." + name;
    const Json& p = it.value();
    if (name == "enabled") continue;
    if (name == "loss_scale") {
      if (auto d = report_->read_number(key, p, "0 (dynamic) or a scale > 0")) {
        if (!(*d >= 0) || !std::isfinite(*d))
          report_->add(key, p.dump(),
                       "must be 0 (dynamic) or a finite scale > 0",
                       "write 0 for dynamic loss scaling, or e.g. 1024");
        else
          pc.loss_scale = *d;
      }
    } else if (name == "initial_scale_power") {
      if (auto n =
              report_->read_whole(key, p, "an integer in [0, 63], e.g. 16")) {
        if (*n < 0 || *n > 63)
          report_->add(key, p.dump(),
                       "must be in [0, 63] (the scale is 2^power)",
                       "write e.g. 16");
        else
          pc.initial_scale_power = static_cast<int>(*n);
      }
    } else if (name == "loss_scale_window" || name == "hysteresis") {
      if (auto n = report_->read_whole(key, p, "an integer >= 1")) {
        if (*n < 1)
          report_->add(
              key, p.dump(), "must be >= 1",
              name == "hysteresis" ? "write e.g. 2" : "write e.g. 1000");
        else if (name == "hysteresis")
          pc.hysteresis = *n;
        else
          pc.loss_scale_window = *n;
      }
    } else if (name == "consecutive_hysteresis") {
      if (auto b = report_->read_bool(key, p)) pc.consecutive_hysteresis = *b;
    } else if (name == "min_loss_scale") {
      if (auto d = report_->read_number(key, p, "a number > 0, e.g. 1")) {
        if (!(*d > 0) || !std::isfinite(*d))
          report_->add(key, p.dump(), "must be a finite number > 0",
                       "write e.g. 1");
        else
          pc.min_loss_scale = *d;
      }
    } else if (!report_->unimplemented(key, p)) {
      static const std::vector<std::string> kNames = names_under("fp16");
      report_->unknown_key(key, p, "fp16", closest(name, {&kNames}));
    }
  }
  if (*enabled)
    enable_precision("fp16", Precision::kFp16);
  else
    report_->ignore("fp16");
}

void PrecisionSection::parse_bf16(const std::string& section, const Json& v) {
  if (section == "bf16" && v.is_null()) {
    // DeepSpeed reads a null bf16 as absent (and then looks at bfloat16).
    report_->ignore(section);
    return;
  }
  auto enabled = section_enabled(section, v);
  if (!enabled) return;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() == "enabled") continue;
    const std::string key = section + "." + it.key();
    if (!report_->unimplemented(key, it.value())) {
      static const std::vector<std::string> kNames = names_under("bf16");
      report_->unknown_key(key, it.value(), section,
                           closest(it.key(), {&kNames}));
    }
  }
  if (*enabled)
    enable_precision(section, Precision::kBf16);
  else
    report_->ignore(section);
}

void PrecisionSection::parse_data_types(const Json& v) {
  if (!v.is_object()) {
    report_->add("data_types", v.dump(), "must be a JSON object",
                 "write { \"grad_accum_dtype\": \"fp32\" }");
    return;
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string key = "data_types." + it.key();
    const bool accum = it.key() == "grad_accum_dtype";
    if (!accum && it.key() != "param_dtype") {
      if (!report_->unimplemented(key, it.value())) {
        static const std::vector<std::string> kNames =
            names_under("data_types");
        report_->unknown_key(key, it.value(), "data_types",
                             closest(it.key(), {&kNames}));
      }
      continue;
    }
    // null: DeepSpeed's default (None), see docs/config.md.
    if (it.value().is_null()) continue;
    const std::string want = "\"fp32\", \"bf16\" or \"fp16\"";
    std::optional<Precision> p;
    if (it.value().is_string())
      p = precision_from_string(lower(it.value().get<std::string>()));
    if (!p) {
      report_->add(key, it.value().dump(), "must be " + want, "write " + want);
      continue;
    }
    if (accum) {
      out_->grad_accum_dtype = *p;
    } else {
      param_dtype_ = *p;
      param_dtype_dump_ = it.value().dump();
    }
  }
}

void PrecisionSection::check() {
  const PrecisionConfig& pc = *out_;
  if (param_dtype_ && *param_dtype_ != pc.dtype) {
    report_->add("data_types.param_dtype", param_dtype_dump_,
                 std::string("must be the training dtype (\"") +
                     to_string(pc.dtype) +
                     "\", from fp16 and bf16), as DeepSpeed checks too",
                 std::string("write \"") + to_string(pc.dtype) +
                     "\", remove it, or enable the training dtype it names");
  }
  if (pc.grad_accum_dtype != Precision::kFp32 &&
      pc.grad_accum_dtype != pc.dtype) {
    report_->add(
        "data_types.grad_accum_dtype",
        std::string("\"") + to_string(pc.grad_accum_dtype) + "\"",
        std::string("must be \"fp32\" or the training dtype (\"") +
            to_string(pc.dtype) + "\")",
        pc.dtype == Precision::kFp32
            ? std::string("write \"fp32\", or enable ") +
                  to_string(pc.grad_accum_dtype)
            : std::string("write \"fp32\" or \"") + to_string(pc.dtype) + "\"");
  }
}

}  // namespace zerostep
