#include "config/zero.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "config/keys.h"
#include "config/text.h"

namespace zerostep {
namespace {

using config_keys::kOffloadKeys;
using config_keys::kZeroIgnored;
using config_keys::kZeroSupported;
using config_text::closest;
using config_text::contains;
using config_text::lower;

using Json = ConfigJson;

}  // namespace

void ZeroSection::parse(const Json& v) {
  if (!v.is_object()) {
    report_->add("zero_optimization", v.dump(), "must be a JSON object",
                 "write { \"stage\": 2, ... }");
    return;
  }
  ZeroConfig& z = *out_;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& name = it.key();
    const std::string key = "zero_optimization." + name;
    const Json& p = it.value();
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
      if (auto b = report_->read_bool(key, p)) z.overlap_comm = *b;
    } else if (name == "contiguous_gradients") {
      if (auto b = report_->read_bool(key, p)) z.contiguous_gradients = *b;
    } else if (name == "reduce_bucket_size" ||
               name == "allgather_bucket_size") {
      const std::string want = "a positive number of elements, e.g. 5e8";
      if (auto n = report_->read_whole(key, p, want)) {
        if (*n < 1) {
          report_->add(key, p.dump(), "must be a positive number of elements",
                       "write " + want);
        } else if (name == "reduce_bucket_size") {
          z.reduce_bucket_size = *n;
        } else {
          z.allgather_bucket_size = *n;
        }
      }
    } else if (name == "stage3_param_persistence_threshold") {
      const std::string want = "a number of elements >= 0, e.g. 1e5";
      if (auto n = report_->read_whole(key, p, want)) {
        if (*n < 0) {
          report_->add(key, p.dump(), "must be >= 0", "write " + want);
        } else {
          z.stage3_param_persistence_threshold = *n;
        }
      }
    } else if (name == "offload_optimizer" || name == "offload_param") {
      parse_offload(key, p);
    } else if (name == "cpu_offload") {
      // DeepSpeed's old spelling of offload_optimizer.device = "cpu".
      if (auto b = report_->read_bool(key, p)) {
        if (*b && z.offload_optimizer.device == OffloadDevice::kNone)
          z.offload_optimizer.device = OffloadDevice::kCpu;
        if (*b && optimizer_offload_key_.empty()) optimizer_offload_key_ = key;
      }
    } else if (name == "sub_group_size") {
      const std::string want = "a positive number of elements, e.g. 1e9";
      if (auto n = report_->read_whole(key, p, want)) {
        if (*n < 1)
          report_->add(key, p.dump(), "must be a positive number of elements",
                       "write " + want);
        else
          z.sub_group_size = *n;
      }
    } else if (contains(kZeroIgnored, name)) {
      report_->ignore(key);
    } else {
      report_->unknown_key(key, p, "zero_optimization",
                           closest(name, {&kZeroSupported, &kZeroIgnored}));
    }
  }
}

void ZeroSection::parse_offload(const std::string& key, const Json& v) {
  if (v.is_null()) {
    report_->ignore(key);
    return;
  }
  if (!v.is_object()) {
    report_->add(key, v.dump(), "must be a JSON object",
                 "write { \"device\": \"cpu\" } or remove the section");
    return;
  }
  const bool param = key == "zero_optimization.offload_param";
  OffloadConfig& o = param ? out_->offload_param : out_->offload_optimizer;
  if (param) o.buffer_count = 5;
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
      }
    } else if (name == "nvme_path") {
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
    } else if (contains(kOffloadKeys, name)) {
      report_->ignore(k);
    } else {
      report_->unknown_key(k, p, key.substr(key.find('.') + 1),
                           closest(name, {&kOffloadKeys}));
    }
  }
  if (o.device == OffloadDevice::kNone) {
    report_->ignore(key);
    return;
  }
  if (!param) optimizer_offload_key_ = key + ".device";
  if (o.device == OffloadDevice::kNvme && o.nvme_path.empty())
    report_->add(key + ".nvme_path", "(missing)",
                 "is required with \"device\": \"nvme\"",
                 "add \"nvme_path\": \"<a directory on the NVMe drive>\"");
}

void ZeroSection::check_offload() {
  const ZeroConfig& z = *out_;
  if (!stage_valid_) return;
  if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0)
    report_->add(
        optimizer_offload_key_,
        optimizer_offload_key_ == "zero_optimization.cpu_offload"
            ? std::string("true")
            : std::string("\"") + to_string(z.offload_optimizer.device) + "\"",
        "optimizer offload partitions the optimizer state: it needs "
        "zero_optimization.stage 1, 2 or 3",
        "set zero_optimization.stage to 1, 2 or 3, or remove the offload");
  if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3)
    report_->add(
        "zero_optimization.offload_param.device",
        std::string("\"") + to_string(z.offload_param.device) + "\"",
        "parameter offload needs zero_optimization.stage 3 (only stage 3 "
        "partitions parameters)",
        "set zero_optimization.stage to 3, or remove offload_param");
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
