#include "config/zero.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "config/keys.h"
#include "config/text.h"

namespace zerostep {
namespace {

using config_keys::find_key;
using config_keys::names_under;
using config_keys::setting_of;
using config_text::closest;
using config_text::lower;

using Json = ConfigJson;

// The stage the section asks for, read the way the "stage" reader accepts
// it: 0 when absent, -1 when it will be rejected. Known before the keys are
// walked, so that offload_param can be judged wherever it stands.
int peek_stage(const Json& section) {
  auto it = section.find("stage");
  if (it == section.end()) return 0;
  if (!it->is_number()) return -1;
  const double d = it->get<double>();
  if (d != std::trunc(d) || d < 0 || d > 3) return -1;
  return static_cast<int>(d);
}

// Two values of one setting agree when they are the same JSON value, or
// the same number however written (5e7 and 50000000).
bool same_value(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

std::string quoted(OffloadDevice d) {
  return std::string("\"") + to_string(d) + "\"";
}

}  // namespace

void ZeroSection::parse(const Json& v) {
  if (v.is_boolean()) {
    // DeepSpeed's deprecated form (read_zero_config_deprecated).
    out_->stage = v.get<bool>() ? 1 : 0;
    return;
  }
  if (!v.is_object()) {
    report_->add("zero_optimization", v.dump(), "must be a JSON object",
                 "write { \"stage\": 2, ... }");
    return;
  }
  ZeroConfig& z = *out_;
  const int stage = peek_stage(v);
  // Below stage 3 DeepSpeed never reads offload_param (nor the deprecated
  // cpu_offload_param that stands for it).
  const bool param_offload_ignored = stage >= 0 && stage < 3;
  // The first key met for each setting, for aliases.
  std::map<std::string, std::pair<std::string, const Json*>> settings;
  std::optional<bool> cpu_offload, cpu_offload_param;
  std::optional<OffloadDevice> optimizer_device, param_device;
  bool optimizer_given = false, param_given = false;
  OffloadConfig ignored_param;  // offload_param below stage 3: not used
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& name = it.key();
    const std::string key = "zero_optimization." + name;
    const Json& p = it.value();
    // A stage-3 size under its name or its stage3_ alias. "auto" is
    // DeepSpeed's default (its schema drops "auto"), except where the
    // Hugging Face integration fills it (Note [Trainer values]:
    // stage3_prefetch_bucket_size at stage 3, from the model's hidden
    // size): left there, nobody filled it. Each of these trades memory
    // for speed, never a result. False when `name` is neither.
    auto stage3_size = [&](const std::string& base, const std::string& want,
                           int64_t* out) {
      if (name != base && name != "stage3_" + base) return false;
      if (!is_auto(p) || config_keys::find_auto_rule(key) != nullptr)
        parse_count(key, p, want, out);
      return true;
    };
    auto [first, inserted] =
        settings.emplace(setting_of(key), std::pair(key, &p));
    if (!inserted && !same_value(*first->second.second, p)) {
      const std::string& other = first->second.first;
      report_->add(
          key, p.dump(),
          "names the same DeepSpeed setting as " + other + " (= " +
              elide(first->second.second->dump(), kConfigProblemFieldBytes) +
              ") but gives it another value",
          "keep one of " + other + " and " + key);
      continue;
    }
    if (name == "stage") {
      if (auto n = report_->read_whole(key, p, "one of 0, 1, 2, 3")) {
        if (*n < 0 || *n > 3) {
          report_->add(key, p.dump(), "must be 0, 1, 2 or 3",
                       "write one of 0, 1, 2, 3");
          stage_valid_ = false;
        } else {
          z.stage = static_cast<int>(*n);
        }
      } else {
        stage_valid_ = false;
      }
    } else if (name == "overlap_comm") {
      // null: DeepSpeed's default (true at stage 3, where zerostep always
      // reduces during backward; false below).
      if (p.is_null()) continue;
      if (auto b = report_->read_bool(key, p)) z.overlap_comm = *b;
    } else if (name == "contiguous_gradients") {
      if (auto b = report_->read_bool(key, p)) z.contiguous_gradients = *b;
    } else if (name == "reduce_once_per_step") {
      if (auto b = report_->read_bool(key, p)) z.reduce_once_per_step = *b;
    } else if (name == "gather_once_per_step") {
      if (auto b = report_->read_bool(key, p)) z.gather_once_per_step = *b;
    } else if (name == "reduce_bucket_size") {
      parse_size_zero_as_one(key, p, "a number of elements >= 0, e.g. 5e8",
                             &z.reduce_bucket_size);
    } else if (name == "allgather_bucket_size") {
      parse_allgather_bucket_size(key, p);
    } else if (name == "stage3_param_persistence_threshold" ||
               name == "param_persistence_threshold") {
      parse_count(key, p, "a number of elements >= 0, e.g. 1e5",
                  &z.stage3_param_persistence_threshold);
    } else if (stage3_size("prefetch_bucket_size",
                           "a number of elements >= 0, e.g. 5e7 (0: off)",
                           &z.stage3_prefetch_bucket_size) ||
               stage3_size("max_reuse_distance",
                           "a number of elements >= 0, e.g. 1e9 (0: release "
                           "every block after its forward)",
                           &z.stage3_max_reuse_distance) ||
               stage3_size("max_live_parameters",
                           "a number of elements >= 0, e.g. 1e9",
                           &z.stage3_max_live_parameters)) {
      // Read by stage3_size.
    } else if (name == "offload_optimizer") {
      optimizer_given = true;
      optimizer_device =
          parse_offload(key, p, &z.offload_optimizer, /*ignored=*/false);
    } else if (name == "offload_param") {
      param_given = true;
      param_device = parse_offload(
          key, p, param_offload_ignored ? &ignored_param : &z.offload_param,
          param_offload_ignored);
    } else if (name == "cpu_offload" || name == "cpu_offload_param") {
      if (p.is_null()) continue;  // Optional in DeepSpeed: not given.
      std::optional<bool> b = report_->read_bool(key, p);
      if (!b) continue;
      if (name == "cpu_offload") {
        cpu_offload = b;
      } else if (param_offload_ignored) {
        report_->ignore(key);
      } else {
        cpu_offload_param = b;
      }
    } else if (name == "sub_group_size") {
      parse_size_zero_as_one(key, p, "a number of elements >= 0, e.g. 1e9",
                             &z.sub_group_size);
    } else if (!report_->unimplemented(key, p)) {
      static const std::vector<std::string> kNames =
          names_under("zero_optimization");
      report_->unknown_key(key, p, "zero_optimization",
                           closest(name, {&kNames}));
    }
  }
  if (cpu_offload) {
    reconcile_legacy("zero_optimization.cpu_offload", *cpu_offload,
                     "zero_optimization.offload_optimizer", optimizer_device,
                     optimizer_given, &z.offload_optimizer);
  }
  if (cpu_offload_param) {
    reconcile_legacy("zero_optimization.cpu_offload_param", *cpu_offload_param,
                     "zero_optimization.offload_param", param_device,
                     param_given, &z.offload_param);
  }
}

void ZeroSection::reconcile_legacy(const std::string& legacy_key, bool legacy,
                                   const std::string& section_key,
                                   std::optional<OffloadDevice> section_device,
                                   bool section_given, OffloadConfig* o) {
  const OffloadDevice wanted =
      legacy ? OffloadDevice::kCpu : OffloadDevice::kNone;
  if (!section_given) {
    o->device = wanted;
    if (section_key == "zero_optimization.offload_param") o->buffer_count = 5;
    if (legacy && legacy_key == "zero_optimization.cpu_offload")
      optimizer_offload_key_ = legacy_key;
    return;
  }
  if (!section_device || *section_device == wanted) return;  // agree
  report_->add(legacy_key, legacy ? "true" : "false",
               "is DeepSpeed's deprecated spelling of " + section_key +
                   ".device = " + quoted(wanted) + ", but " + section_key +
                   ".device is " + quoted(*section_device),
               "keep one of " + legacy_key + " and " + section_key);
}

void ZeroSection::parse_count(const std::string& key, const Json& v,
                              const std::string& want, int64_t* out) {
  if (auto n = report_->read_whole(key, v, want)) {
    if (*n < 0) {
      report_->add(key, v.dump(), "must be >= 0", "write " + want);
    } else {
      *out = *n;
    }
  }
}

void ZeroSection::parse_size_zero_as_one(const std::string& key, const Json& v,
                                         const std::string& want,
                                         int64_t* out) {
  if (auto n = report_->read_whole(key, v, want)) {
    if (*n < 0) {
      report_->add(key, v.dump(), "must be a number of elements >= 0",
                   "write " + want);
    } else {
      *out = *n == 0 ? 1 : *n;
    }
  }
}

void ZeroSection::parse_allgather_bucket_size(const std::string& key,
                                              const Json& v) {
  const std::string want = "a positive number of elements, e.g. 5e8";
  if (auto n = report_->read_whole(key, v, want)) {
    if (*n < 1) {
      report_->add(key, v.dump(),
                   "must be a positive number of elements (DeepSpeed's "
                   "schema takes 0, but its stages 1 and 2 then divide by "
                   "zero)",
                   "write " + want);
    } else {
      out_->allgather_bucket_size = *n;
    }
  }
}

void ZeroSection::parse_allgather_size(const Json& v) {
  parse_allgather_bucket_size("allgather_size", v);
}

std::optional<OffloadDevice> ZeroSection::parse_offload(const std::string& key,
                                                        const Json& v,
                                                        OffloadConfig* out,
                                                        bool ignored) {
  if (v.is_null()) {
    report_->ignore(key);
    return OffloadDevice::kNone;
  }
  if (!v.is_object()) {
    report_->add(key, v.dump(), "must be a JSON object",
                 "write { \"device\": \"cpu\" } or remove the section");
    return std::nullopt;
  }
  const bool param = key == "zero_optimization.offload_param";
  OffloadConfig& o = *out;
  if (param) o.buffer_count = 5;
  bool device_ok = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& name = it.key();
    const std::string k = key + "." + name;
    const Json& p = it.value();
    if (name == "device") {
      const std::string d = p.is_string() ? lower(p.get<std::string>()) : "";
      if (d == "none") {
        o.device = OffloadDevice::kNone;
      } else if (d == "cpu") {
        o.device = OffloadDevice::kCpu;
      } else if (d == "nvme") {
        o.device = OffloadDevice::kNvme;
      } else {
        report_->add(k, p.dump(), "must be \"none\", \"cpu\" or \"nvme\"",
                     "write one of \"none\", \"cpu\", \"nvme\"");
        device_ok = false;
      }
    } else if (name == "nvme_path") {
      if (p.is_null()) continue;  // Optional in DeepSpeed: not given.
      if (p.is_string() && !p.get<std::string>().empty())
        o.nvme_path = p.get<std::string>();
      else
        report_->add(
            k, p.dump(), "must be a non-empty JSON string (a directory)",
            "write the directory on the NVMe drive, e.g. \"/local_nvme\"");
    } else if (name == "pin_memory") {
      if (auto b = report_->read_bool(k, p)) o.pin_memory = *b;
    } else if (name == "buffer_count") {
      if (auto n = report_->read_whole(k, p, "an integer >= 2, e.g. 4")) {
        if (*n < 2)
          report_->add(k, p.dump(),
                       "must be >= 2 (one buffer in use, one in flight)",
                       "write e.g. 4");
        else
          o.buffer_count = *n;
      }
    } else if (ignored ? find_key(k) != nullptr
                       : report_->unimplemented(k, p)) {
      // Every such key is harmless (keys.cc); when the whole section is
      // ignored only the section is listed.
    } else {
      const std::vector<std::string> names = names_under(key);
      report_->unknown_key(k, p, key.substr(key.find('.') + 1),
                           closest(name, {&names}));
    }
  }
  if (ignored) {
    report_->ignore(key);
    return device_ok ? std::optional(o.device) : std::nullopt;
  }
  if (o.device == OffloadDevice::kNone) {
    report_->ignore(key);
    return device_ok ? std::optional(o.device) : std::nullopt;
  }
  if (!param) optimizer_offload_key_ = key + ".device";
  if (o.device == OffloadDevice::kNvme && o.nvme_path.empty())
    report_->add(key + ".nvme_path", "(missing)",
                 "is required with \"device\": \"nvme\"",
                 "add \"nvme_path\": \"<a directory on the NVMe drive>\"");
  return o.device;
}

void ZeroSection::check_offload() {
  const ZeroConfig& z = *out_;
  if (!stage_valid_) return;
  // Below stage 3 offload_param was ignored (parse()).
  ZS_CHECK(z.offload_param.device == OffloadDevice::kNone || z.stage == 3);
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0)
    report_->add(
        optimizer_offload_key_,
        optimizer_offload_key_ == "zero_optimization.cpu_offload"
            ? std::string("true")
            : quoted(z.offload_optimizer.device),
        "optimizer offload partitions the optimizer state: it needs "
        "zero_optimization.stage 1, 2 or 3",
        "set zero_optimization.stage to 1, 2 or 3, or remove the offload");
}

const char* to_string(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "unknown";
}

}  // namespace zerostep
