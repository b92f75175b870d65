#include "engine/config.h"

#include "engine/config_text.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "common/errors.h"

namespace zerostep {
namespace {

using config_text::closest;
using config_text::contains;
using config_text::looks_numeric;
using config_text::lower;


// ordered_json keeps the document's key order, so problems and ignored_keys
// come out in the order the user wrote them.
using Json = nlohmann::ordered_json;

constexpr const char* kAutoRule =
    "\"auto\" is a placeholder that the Hugging Face Trainer replaces before "
    "DeepSpeed reads the file; zerostep reads the file as written";

constexpr const char* kBatchRelation =
    "train_batch_size = train_micro_batch_size_per_gpu × "
    "gradient_accumulation_steps × world_size";

const std::vector<std::string> kDataTypesKeys = {"grad_accum_dtype"};

const std::vector<std::string> kTopSupported = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "managed_gradient_accumulation",
    "gradient_accumulation_scaling",
    "optimizer",
    "gradient_clipping",
    "steps_per_print",
    "zero_optimization",
    "fp16",
    "bf16",
    "bfloat16",
    "data_types",
    "amp",
};

// DeepSpeed keys accepted and not acted on.
const std::vector<std::string> kTopIgnored = {
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "activation_checkpointing",
    "wall_clock_breakdown",
    "memory_breakdown",
    "dump_state",
    "prescale_gradients",
    "gradient_predivide_factor",
    "sparse_gradients",
    "communication_data_type",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "aio",
    "autotuning",
    "elasticity",
    "data_efficiency",
    "curriculum_learning",
    "compression_training",
    "checkpoint",
    "seq_parallel_communication_data_type",
    "eigenvalue",
    "progressive_layer_drop",
    "quantize_training",
    "sparse_attention",
    "load_universal_checkpoint",
    "use_node_local_storage",
    "nebula",
    "weight_quantization",
    "hybrid_engine",
};

// DeepSpeed keys that zerostep knows and always rejects (with a message of
// their own, never "unknown key").
const std::vector<std::string> kTopRejected = {
    "scheduler",
    "pipeline",
    "pipeline_parallel_size",
};

const std::vector<std::string> kZeroSupported = {
    "stage",
    "overlap_comm",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "contiguous_gradients",
    "stage3_param_persistence_threshold",
    "offload_optimizer",
    "offload_param",
    "sub_group_size",
    "cpu_offload",
};

const std::vector<std::string> kZeroIgnored = {
    "reduce_scatter",
    "allgather_partitions",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "stage3_prefetch_bucket_size",
    "stage3_gather_16bit_weights_on_model_save",
    "round_robin_gradients",
    "elastic_checkpoint",
    "ignore_unused_parameters",
    "load_from_fp32_weights",
    "zero_hpz_partition_size",
    "zero_quantized_weights",
    "zero_quantized_gradients",
    "mics_shard_size",
    "memory_efficient_linear",
};

const std::vector<std::string> kOptimizerKeys = {"type", "params"};
const std::vector<std::string> kOptimizerParams = {"lr", "betas", "eps",
                                                   "weight_decay", "momentum"};
const std::vector<std::string> kOptimizerParamsIgnored = {"torch_adam",
                                                          "adam_w_mode"};
// Note: adam_w_mode is read (for "Adam") before the ignored list is
// consulted; it stays listed here for did-you-mean suggestions.

bool is_auto(const Json& v) {
  return v.is_string() && lower(v.get<std::string>()) == "auto";
}

// "e.g. 16 or 32": the multiples of `d` around `t`.
std::string multiples_near(int64_t t, int64_t d) {
  int64_t below = t / d * d;
  std::string s = "e.g. ";
  if (below > 0) s += std::to_string(below) + " or ";
  return s + std::to_string(below + d);
}

struct BatchTriple {
  int64_t tbs = 0;
  int64_t micro = 0;
  int64_t gas = 0;
};

// One batch key as given: value is set when present and valid.
struct BatchInput {
  std::optional<int64_t> value;
  std::string dump;  // JSON text of the value, for messages
};

// Applies train_batch_size = micro × gas × world to whichever keys are given
// and derives the rest. Returns nullopt after adding problems to *out.
std::optional<BatchTriple> resolve_batch(const BatchInput& t,
                                         const BatchInput& m,
                                         const BatchInput& g, int64_t w,
                                         std::vector<ConfigProblem>* out) {
  auto overflow = [&](const std::string& key, const std::string& dump) {
    out->push_back({key, dump,
                    "makes micro × gas × world_size overflow a 64-bit integer",
                    "use smaller batch sizes"});
    return std::nullopt;
  };
  int64_t product = 0;
  if (t.value && m.value && g.value) {
    if (__builtin_mul_overflow(*m.value, *g.value, &product) ||
        __builtin_mul_overflow(product, w, &product)) {
      return overflow("train_batch_size", t.dump);
    }
    if (*t.value == product) return BatchTriple{*t.value, *m.value, *g.value};
    const std::string arithmetic =
        std::to_string(*m.value) + " × " + std::to_string(*g.value) + " × " +
        std::to_string(w) + " = " + std::to_string(product);
    out->push_back(
        {"train_batch_size", t.dump,
         "must equal train_micro_batch_size_per_gpu × "
         "gradient_accumulation_steps × world_size = " +
             arithmetic,
         "write " + std::to_string(product) + " (= micro " +
             std::to_string(*m.value) + " × gas " + std::to_string(*g.value) +
             " × world " + std::to_string(w) +
             "), or remove one of the three keys and let zerostep derive it"});
    return std::nullopt;
  }
  if (t.value && m.value) {
    if (__builtin_mul_overflow(*m.value, w, &product)) {
      return overflow("train_micro_batch_size_per_gpu", m.dump);
    }
    if (*t.value % product == 0) {
      return BatchTriple{*t.value, *m.value, *t.value / product};
    }
    out->push_back(
        {"train_batch_size", t.dump,
         "must be divisible by train_micro_batch_size_per_gpu × world_size = " +
             std::to_string(*m.value) + " × " + std::to_string(w) + " = " +
             std::to_string(product) +
             " (gradient_accumulation_steps = train_batch_size / " +
             std::to_string(product) + ")",
         "write a multiple of " + std::to_string(product) + ", " +
             multiples_near(*t.value, product)});
    return std::nullopt;
  }
  if (t.value && g.value) {
    if (__builtin_mul_overflow(*g.value, w, &product)) {
      return overflow("gradient_accumulation_steps", g.dump);
    }
    if (*t.value % product == 0) {
      return BatchTriple{*t.value, *t.value / product, *g.value};
    }
    out->push_back(
        {"train_batch_size", t.dump,
         "must be divisible by gradient_accumulation_steps × world_size = " +
             std::to_string(*g.value) + " × " + std::to_string(w) + " = " +
             std::to_string(product) +
             " (train_micro_batch_size_per_gpu = train_batch_size / " +
             std::to_string(product) + ")",
         "write a multiple of " + std::to_string(product) + ", " +
             multiples_near(*t.value, product)});
    return std::nullopt;
  }
  if (m.value && g.value) {
    if (__builtin_mul_overflow(*m.value, *g.value, &product) ||
        __builtin_mul_overflow(product, w, &product)) {
      return overflow("gradient_accumulation_steps", g.dump);
    }
    return BatchTriple{product, *m.value, *g.value};
  }
  if (m.value) {
    if (__builtin_mul_overflow(*m.value, w, &product)) {
      return overflow("train_micro_batch_size_per_gpu", m.dump);
    }
    return BatchTriple{product, *m.value, 1};
  }
  if (g.value) {
    out->push_back(
        {"train_micro_batch_size_per_gpu", "",
         "is required: gradient_accumulation_steps alone does not determine "
         "the batch size (" +
             std::string(kBatchRelation) + ")",
         "add train_micro_batch_size_per_gpu (samples per rank per "
         "backward) or train_batch_size"});
    return std::nullopt;
  }
  if (t.value) {
    if (*t.value % w == 0) return BatchTriple{*t.value, *t.value / w, 1};
    out->push_back(
        {"train_batch_size", t.dump,
         "must be divisible by world_size " + std::to_string(w) +
             " (without gradient_accumulation_steps it is 1, so "
             "train_micro_batch_size_per_gpu = train_batch_size / world_size)",
         "write a multiple of " + std::to_string(w) + ", " +
             multiples_near(*t.value, w) +
             ", or also give train_micro_batch_size_per_gpu"});
    return std::nullopt;
  }
  out->push_back(
      {"train_batch_size", "",
       "no batch size given: train_batch_size or "
       "train_micro_batch_size_per_gpu is required (" +
           std::string(kBatchRelation) +
           "; any two of the three determine the third)",
       "add \"train_micro_batch_size_per_gpu\": <samples per rank per "
       "backward>, and optionally gradient_accumulation_steps"});
  return std::nullopt;
}

class Parser {
 public:
  explicit Parser(int world_size) { cfg_.world_size = world_size; }

  Config run(const std::string& text) {
    if (cfg_.world_size < 1) {
      add("world_size", std::to_string(cfg_.world_size),
          "must be >= 1 (the number of ranks; an argument of parse_config, "
          "not a ds_config key)",
          "pass the number of ranks in the run, e.g. 1 for one process");
    }
    Json doc;
    try {
      doc = Json::parse(text);
    } catch (const Json::parse_error& e) {
      // e.what() is "[json.exception.parse_error.101] parse error at line L,
      // column C: ..."; the bracketed id means nothing to a user.
      std::string what = e.what();
      size_t bracket = what.find("] ");
      if (what.rfind("[json.exception", 0) == 0 &&
          bracket != std::string::npos) {
        what = what.substr(bracket + 2);
      }
      add("<document>", "", what,
          "fix the JSON at that position (ds_config is plain JSON: no "
          "comments, no trailing commas, keys in double quotes)");
      throw ConfigError(std::move(problems_));
    }
    if (!doc.is_object()) {
      add("<document>", doc.dump(), "must be a JSON object",
          "write the settings as { \"key\": value, ... }");
      throw ConfigError(std::move(problems_));
    }
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      parse_top(it.key(), it.value());
    }
    check_batch();
    check_cross_keys();
    check_precision();
    check_offload();
    if (!problems_.empty()) throw ConfigError(std::move(problems_));
    return cfg_;
  }

 private:
  enum class Slot { kTbs, kMicro, kGas };

  // A batch key as read: `value` is set only when present and valid.
  struct BatchKey {
    const Json* raw = nullptr;
    std::optional<int64_t> value;
    bool bad = false;                // present but rejected
    size_t auto_problem = SIZE_MAX;  // index of its "auto" problem, if any
  };

  void add(std::string key, std::string value, std::string rule,
           std::string fix) {
    problems_.push_back(
        {std::move(key), std::move(value), std::move(rule), std::move(fix)});
  }

  void ignore(const std::string& key) {
    if (!contains(cfg_.ignored_keys, key)) cfg_.ignored_keys.push_back(key);
  }

  void unknown_key(const std::string& key, const Json& v,
                   const std::string& where, const std::string& suggestion) {
    add(key, v.dump(),
        where == "ds_config" ? "is not a ds_config key zerostep knows"
                             : "is not a key zerostep knows in " + where,
        suggestion.empty()
            ? "remove it; docs/config.md lists every supported key"
            : "did you mean \"" + suggestion + "\"?");
  }

  // --- typed readers: return the value, or record why not ---

  std::optional<bool> read_bool(const std::string& key, const Json& v) {
    if (v.is_boolean()) return v.get<bool>();
    if (is_auto(v)) {
      add(key, v.dump(), kAutoRule,
          "write true or false (a JSON boolean, no quotes)");
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

  // `want` completes "write ..." in a fix, e.g. "a number >= 0".
  std::optional<double> read_number(const std::string& key, const Json& v,
                                    const std::string& want) {
    if (v.is_number()) return v.get<double>();
    type_error(key, v, "a JSON number", want);
    return std::nullopt;
  }

  // A whole number; integral floats (5e8, as DeepSpeed files often write
  // bucket sizes) are accepted.
  std::optional<int64_t> read_whole(const std::string& key, const Json& v,
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
      if (std::isfinite(d) && std::trunc(d) == d &&
          d >= -9.2233720368547758e18 && d < 9.2233720368547758e18) {
        return static_cast<int64_t>(d);
      }
      add(key, v.dump(), "must be a whole number", "write " + want);
      return std::nullopt;
    }
    type_error(key, v, "a whole JSON number", want);
    return std::nullopt;
  }

  void type_error(const std::string& key, const Json& v,
                  const std::string& type, const std::string& want) {
    if (is_auto(v)) {
      add(key, v.dump(), kAutoRule, "write " + want);
      return;
    }
    std::string fix = "write " + want;
    if (v.is_string() && looks_numeric(v.get<std::string>())) {
      fix = "write " + v.get<std::string>() + " (a JSON number, no quotes)";
    }
    add(key, v.dump(), "must be " + type, fix);
  }

  // --- top level ---

  void parse_top(const std::string& key, const Json& v) {
    if (key == "train_batch_size") {
      read_batch(Slot::kTbs, key, v);
    } else if (key == "train_micro_batch_size_per_gpu") {
      read_batch(Slot::kMicro, key, v);
    } else if (key == "gradient_accumulation_steps") {
      read_batch(Slot::kGas, key, v);
    } else if (key == "managed_gradient_accumulation") {
      if (auto b = read_bool(key, v)) {
        cfg_.managed_gradient_accumulation = *b;
        managed_valid_ = true;
      } else {
        managed_valid_ = false;
      }
    } else if (key == "gradient_accumulation_scaling") {
      parse_scaling(key, v);
    } else if (key == "optimizer") {
      parse_optimizer(v);
    } else if (key == "gradient_clipping") {
      if (auto d =
              read_number(key, v, "a number >= 0 (0 turns clipping off)")) {
        if (*d < 0) {
          add(key, v.dump(), "must be >= 0 (the max global grad norm)",
              "write 0 to turn clipping off, or a positive norm such as 1.0");
        } else {
          cfg_.gradient_clipping = *d;
        }
      }
    } else if (key == "steps_per_print") {
      if (auto n = read_whole(key, v, "an integer >= 1, e.g. 10")) {
        if (*n < 1) {
          add(key, v.dump(), "must be an integer >= 1",
              "write an integer >= 1, e.g. 10");
        } else {
          cfg_.steps_per_print = *n;
        }
      }
    } else if (key == "zero_optimization") {
      parse_zero(v);
    } else if (key == "scheduler") {
      parse_lr_schedule(v, &cfg_.scheduler, &problems_);
    } else if (key == "pipeline" || key == "pipeline_parallel_size") {
      if (key == "pipeline_parallel_size" && v.is_number() &&
          v.get<double>() == 1.0) {
        ignore(key);  // one stage is no pipeline.
      } else if (pipeline_key_.empty()) {
        pipeline_key_ = key;
        pipeline_dump_ = v.dump();
      }
    } else if (key == "fp16") {
      parse_fp16(v);
    } else if (key == "bf16" || key == "bfloat16") {
      parse_bf16(key, v);
    } else if (key == "amp") {
      parse_amp(v);
    } else if (key == "data_types") {
      parse_data_types(v);
    } else if (contains(kTopIgnored, key)) {
      ignore(key);
    } else {
      unknown_key(key, v, "ds_config",
                  closest(key, {&kTopSupported, &kTopIgnored, &kTopRejected}));
    }
  }

  void read_batch(Slot slot, const std::string& key, const Json& v) {
    BatchKey& b = batch_[static_cast<int>(slot)];
    b.raw = &v;
    if (is_auto(v)) {
      // The fix needs the other batch keys; check_batch() fills it in.
      b.auto_problem = problems_.size();
      add(key, v.dump(), kAutoRule, "");
      return;
    }
    auto n = read_whole(key, v, "a positive integer, e.g. 4");
    if (!n) {
      b.bad = true;
    } else if (*n < 1) {
      add(key, v.dump(), "must be a positive integer",
          "write a positive integer, e.g. 4");
      b.bad = true;
    } else {
      b.value = *n;
    }
  }

  void parse_scaling(const std::string& key, const Json& v) {
    static const std::vector<std::string> kModes = {"configured",
                                                    "per_step_count", "none"};
    const std::string want =
        "one of \"configured\", \"per_step_count\", \"none\" (a JSON string)";
    if (!v.is_string() || is_auto(v)) {
      if (is_auto(v)) {
        add(key, v.dump(), kAutoRule, "write " + want);
      } else {
        add(key, v.dump(), "must be a JSON string", "write " + want);
      }
      return;
    }
    const std::string s = lower(v.get<std::string>());
    if (auto mode = grad_accum_scaling_from_string(s)) {
      cfg_.gradient_accumulation_scaling = *mode;
    } else {
      std::string guess = closest(s, {&kModes});
      add(key, v.dump(),
          "must be \"configured\", \"per_step_count\" or \"none\"",
          guess.empty() ? "write " + want : "did you mean \"" + guess + "\"?");
    }
  }

  // --- mixed precision ---

  // The section's "enabled", or nullopt when absent or invalid (recorded).
  std::optional<bool> section_enabled(const std::string& key, const Json& v) {
    if (!v.is_object()) {
      add(key, v.dump(), "must be a JSON object",
          "write { \"enabled\": true } or remove the section");
      return std::nullopt;
    }
    auto it = v.find("enabled");
    if (it == v.end()) return false;
    return read_bool(key + ".enabled", *it);
  }

  void enable_precision(const std::string& key, Precision p) {
    if (!precision_key_.empty()) {
      add(key + ".enabled", "true",
          "cannot be combined with " + precision_key_ +
              ".enabled = true: one training dtype at a time",
          "enable one of fp16 and bf16");
      return;
    }
    precision_key_ = key;
    cfg_.precision.dtype = p;
  }

  void parse_fp16(const Json& v) {
    static const std::vector<std::string> kKeys = {
        "enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
        "hysteresis", "consecutive_hysteresis", "min_loss_scale", "auto_cast",
        "fp16_master_weights_and_grads"};
    auto enabled = section_enabled("fp16", v);
    if (!enabled) return;
    PrecisionConfig& pc = cfg_.precision;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& name = it.key();
      const std::string key = "fp16." + name;
      const Json& p = it.value();
      if (name == "enabled") continue;
      if (name == "loss_scale") {
        if (auto d = read_number(key, p, "0 (dynamic) or a scale > 0")) {
          if (!(*d >= 0) || !std::isfinite(*d))
            add(key, p.dump(), "must be 0 (dynamic) or a finite scale > 0",
                "write 0 for dynamic loss scaling, or e.g. 1024");
          else
            pc.loss_scale = *d;
        }
      } else if (name == "initial_scale_power") {
        if (auto n = read_whole(key, p, "an integer in [0, 63], e.g. 16")) {
          if (*n < 0 || *n > 63)
            add(key, p.dump(), "must be in [0, 63] (the scale is 2^power)",
                "write e.g. 16");
          else
            pc.initial_scale_power = static_cast<int>(*n);
        }
      } else if (name == "loss_scale_window" || name == "hysteresis") {
        if (auto n = read_whole(key, p, "an integer >= 1")) {
          if (*n < 1)
            add(key, p.dump(), "must be >= 1",
                name == "hysteresis" ? "write e.g. 2" : "write e.g. 1000");
          else if (name == "hysteresis")
            pc.hysteresis = *n;
          else
            pc.loss_scale_window = *n;
        }
      } else if (name == "consecutive_hysteresis") {
        if (auto b = read_bool(key, p)) pc.consecutive_hysteresis = *b;
      } else if (name == "min_loss_scale") {
        if (auto d = read_number(key, p, "a number > 0, e.g. 1")) {
          if (!(*d > 0) || !std::isfinite(*d))
            add(key, p.dump(), "must be a finite number > 0", "write e.g. 1");
          else
            pc.min_loss_scale = *d;
        }
      } else if (name == "auto_cast") {
        // Casting the caller's inputs is the caller's business here.
        ignore(key);
      } else if (name == "fp16_master_weights_and_grads") {
        if (auto b = read_bool(key, p)) {
          if (*b)
            add(key, p.dump(),
                "fp16 master weights are not supported: zerostep keeps fp32 "
                "master weights and optimizer state",
                "set it to false or remove it");
        }
      } else {
        unknown_key(key, p, "fp16", closest(name, {&kKeys}));
      }
    }
    if (*enabled)
      enable_precision("fp16", Precision::kFp16);
    else
      ignore("fp16");
  }

  void parse_bf16(const std::string& section, const Json& v) {
    static const std::vector<std::string> kKeys = {
        "enabled", "immediate_grad_update", "check_grad_overflow"};
    auto enabled = section_enabled(section, v);
    if (!enabled) return;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.key() == "enabled") continue;
      if (contains(kKeys, it.key())) {
        ignore(section + "." + it.key());
      } else {
        unknown_key(section + "." + it.key(), it.value(), section,
                    closest(it.key(), {&kKeys}));
      }
    }
    if (*enabled)
      enable_precision(section, Precision::kBf16);
    else
      ignore(section);
  }

  void parse_amp(const Json& v) {
    auto enabled = section_enabled("amp", v);
    if (!enabled) return;
    if (*enabled) {
      add("amp.enabled", "true",
          "NVIDIA Apex AMP is not supported",
          "use \"bf16\": { \"enabled\": true } or \"fp16\": { "
          "\"enabled\": true } instead");
    } else {
      ignore("amp");
    }
  }

  void parse_data_types(const Json& v) {
    if (!v.is_object()) {
      add("data_types", v.dump(), "must be a JSON object",
          "write { \"grad_accum_dtype\": \"fp32\" }");
      return;
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string key = "data_types." + it.key();
      if (it.key() != "grad_accum_dtype") {
        unknown_key(key, it.value(), "data_types",
                    closest(it.key(), {&kDataTypesKeys}));
        continue;
      }
      const std::string want = "\"fp32\", \"bf16\" or \"fp16\"";
      std::optional<Precision> p;
      if (it.value().is_string())
        p = precision_from_string(lower(it.value().get<std::string>()));
      if (!p) {
        add(key, it.value().dump(), "must be " + want, "write " + want);
        continue;
      }
      cfg_.precision.grad_accum_dtype = *p;
    }
  }

  void check_offload() {
    const ZeroConfig& z = cfg_.zero;
    if (!stage_valid_) return;
    if (z.offload_optimizer.device != OffloadDevice::kNone && z.stage == 0)
      add(optimizer_offload_key_,
          optimizer_offload_key_ == "zero_optimization.cpu_offload"
              ? std::string("true")
              : std::string("\"") + to_string(z.offload_optimizer.device) +
                    "\"",
          "optimizer offload partitions the optimizer state: it needs "
          "zero_optimization.stage 1, 2 or 3",
          "set zero_optimization.stage to 1, 2 or 3, or remove the offload");
    if (z.offload_param.device != OffloadDevice::kNone && z.stage != 3)
      add("zero_optimization.offload_param.device",
          std::string("\"") + to_string(z.offload_param.device) + "\"",
          "parameter offload needs zero_optimization.stage 3 (only stage 3 "
          "partitions parameters)",
          "set zero_optimization.stage to 3, or remove offload_param");
  }

  void check_precision() {
    const PrecisionConfig& pc = cfg_.precision;
    if (pc.grad_accum_dtype != Precision::kFp32 &&
        pc.grad_accum_dtype != pc.dtype) {
      add("data_types.grad_accum_dtype",
          std::string("\"") + to_string(pc.grad_accum_dtype) + "\"",
          std::string("must be \"fp32\" or the training dtype (\"") +
              to_string(pc.dtype) + "\")",
          pc.dtype == Precision::kFp32
              ? std::string("write \"fp32\", or enable ") +
                    to_string(pc.grad_accum_dtype)
              : std::string("write \"fp32\" or \"") + to_string(pc.dtype) +
                    "\"");
    }
  }

  // --- optimizer ---

  void parse_optimizer(const Json& v) {
    if (!v.is_object()) {
      add("optimizer", v.dump(), "must be a JSON object",
          "write { \"type\": \"AdamW\", \"params\": { \"lr\": 0.001 } }");
      return;
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!contains(kOptimizerKeys, it.key())) {
        unknown_key("optimizer." + it.key(), it.value(), "optimizer",
                    closest(it.key(), {&kOptimizerKeys}));
      }
    }
    bool type_known = false;
    bool type_is_adam = false;
    auto type = v.find("type");
    if (type == v.end()) {
      add("optimizer.type", "",
          "is required when the optimizer section is present",
          "add \"type\": \"AdamW\" (or \"Adam\", \"SGD\")");
    } else if (!type->is_string()) {
      add("optimizer.type", type->dump(), "must be a JSON string",
          "write \"AdamW\", \"Adam\" or \"SGD\"");
    } else {
      const std::string t = lower(type->get<std::string>());
      if (t == "adam") {
        // DeepSpeed's "Adam" decouples weight decay (adam_w_mode defaults
        // to true); params.adam_w_mode = false selects L2 Adam below.
        cfg_.optimizer.type = OptimizerType::kAdamW;
        type_is_adam = true;
        type_known = true;
      } else if (t == "adamw") {
        cfg_.optimizer.type = OptimizerType::kAdamW;
        type_known = true;
      } else if (t == "sgd") {
        cfg_.optimizer.type = OptimizerType::kSGD;
        type_known = true;
      } else {
        static const std::vector<std::string> kTypes = {"Adam", "AdamW", "SGD"};
        std::string guess = closest(t, {&kTypes});
        add("optimizer.type", type->dump(),
            "is not an optimizer zerostep implements; supported: Adam, "
            "AdamW, SGD (any letter case)",
            guess.empty() ? "write \"AdamW\", \"Adam\" or \"SGD\""
                          : "did you mean \"" + guess + "\"?");
      }
    }
    auto params = v.find("params");
    if (params == v.end()) return;
    if (!params->is_object()) {
      add("optimizer.params", params->dump(), "must be a JSON object",
          "write { \"lr\": 0.001, ... }");
      return;
    }
    const bool sgd = type_known && cfg_.optimizer.type == OptimizerType::kSGD;
    const bool adam = type_known && !sgd;
    OptimizerConfig& o = cfg_.optimizer;
    for (auto it = params->begin(); it != params->end(); ++it) {
      const std::string& name = it.key();
      const std::string key = "optimizer.params." + name;
      const Json& p = it.value();
      if (name == "lr") {
        if (auto d = read_number(key, p, "a number >= 0, e.g. 0.001")) {
          if (*d < 0) {
            add(key, p.dump(), "must be >= 0",
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
        } else if (auto d = read_number(key, p, "a number > 0, e.g. 1e-8")) {
          if (!(*d > 0)) {
            add(key, p.dump(), "must be > 0 (it keeps the update finite)",
                "write a small positive number, e.g. 1e-8");
          } else {
            o.eps = *d;
          }
        }
      } else if (name == "weight_decay") {
        if (auto d = read_number(key, p, "a number >= 0, e.g. 0.01")) {
          if (*d < 0) {
            add(key, p.dump(), "must be >= 0",
                "write 0 for none, or a positive number such as 0.01");
          } else {
            o.weight_decay = *d;
          }
        }
      } else if (name == "momentum") {
        if (adam) {
          not_for_type(key, p, "SGD");
        } else if (auto d = read_number(key, p, "a number >= 0, e.g. 0.9")) {
          if (*d < 0) {
            add(key, p.dump(), "must be >= 0", "write a number >= 0, e.g. 0.9");
          } else {
            o.momentum = *d;
          }
        }
      } else if (name == "adam_w_mode") {
        if (!p.is_boolean()) {
          add(key, p.dump(), "must be a JSON boolean",
              "write true (decoupled weight decay, AdamW) or false (L2, "
              "Adam)");
        } else if (!type_is_adam) {
          ignore(key);  // DeepSpeed reads it for "Adam" only
        } else if (!p.get<bool>()) {
          o.type = OptimizerType::kAdam;
        }
      } else if (contains(kOptimizerParamsIgnored, name)) {
        ignore(key);
      } else {
        unknown_key(
            key, p, "optimizer.params",
            closest(name, {&kOptimizerParams, &kOptimizerParamsIgnored}));
      }
    }
  }

  void not_for_type(const std::string& key, const Json& v,
                    const std::string& types) {
    add(key, v.dump(),
        "applies to " + types + " only, not to optimizer.type \"" +
            to_string(cfg_.optimizer.type) + "\"",
        "remove it, or change optimizer.type");
  }

  void parse_betas(const std::string& key, const Json& v) {
    const std::string want =
        "[b1, b2], two numbers in [0, 1), e.g. [0.9, 0.999]";
    if (is_auto(v)) {
      add(key, v.dump(), kAutoRule, "write " + want);
      return;
    }
    if (!v.is_array() || v.size() != 2) {
      add(key, v.dump(), "must be a JSON array of two numbers",
          "write " + want);
      return;
    }
    double b[2] = {cfg_.optimizer.beta1, cfg_.optimizer.beta2};
    bool ok = true;
    for (size_t i = 0; i < 2; ++i) {
      const std::string k = key + "[" + std::to_string(i) + "]";
      auto d = read_number(k, v[i], "a number in [0, 1)");
      if (!d) {
        ok = false;
      } else if (!(*d >= 0 && *d < 1)) {
        add(k, v[i].dump(), "must be in [0, 1)",
            i == 0 ? "write a number in [0, 1), e.g. 0.9"
                   : "write a number in [0, 1), e.g. 0.999");
        ok = false;
      } else {
        b[i] = *d;
      }
    }
    if (ok) {
      cfg_.optimizer.beta1 = b[0];
      cfg_.optimizer.beta2 = b[1];
    }
  }

  // --- zero_optimization ---

  void parse_zero(const Json& v) {
    if (!v.is_object()) {
      add("zero_optimization", v.dump(), "must be a JSON object",
          "write { \"stage\": 2, ... }");
      return;
    }
    ZeroConfig& z = cfg_.zero;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& name = it.key();
      const std::string key = "zero_optimization." + name;
      const Json& p = it.value();
      if (name == "stage") {
        if (auto n = read_whole(key, p, "one of 0, 1, 2, 3")) {
          if (*n < 0 || *n > 3) {
            add(key, p.dump(), "must be 0, 1, 2 or 3",
                "write one of 0, 1, 2, 3");
            stage_valid_ = false;
          } else {
            z.stage = static_cast<int>(*n);
          }
        } else {
          stage_valid_ = false;
        }
      } else if (name == "overlap_comm") {
        if (auto b = read_bool(key, p)) z.overlap_comm = *b;
      } else if (name == "contiguous_gradients") {
        if (auto b = read_bool(key, p)) z.contiguous_gradients = *b;
      } else if (name == "reduce_bucket_size" ||
                 name == "allgather_bucket_size") {
        const std::string want = "a positive number of elements, e.g. 5e8";
        if (auto n = read_whole(key, p, want)) {
          if (*n < 1) {
            add(key, p.dump(), "must be a positive number of elements",
                "write " + want);
          } else if (name == "reduce_bucket_size") {
            z.reduce_bucket_size = *n;
          } else {
            z.allgather_bucket_size = *n;
          }
        }
      } else if (name == "stage3_param_persistence_threshold") {
        const std::string want = "a number of elements >= 0, e.g. 1e5";
        if (auto n = read_whole(key, p, want)) {
          if (*n < 0) {
            add(key, p.dump(), "must be >= 0", "write " + want);
          } else {
            z.stage3_param_persistence_threshold = *n;
          }
        }
      } else if (name == "offload_optimizer" || name == "offload_param") {
        parse_offload(key, p);
      } else if (name == "cpu_offload") {
        // DeepSpeed's old spelling of offload_optimizer.device = "cpu".
        if (auto b = read_bool(key, p)) {
          if (*b && z.offload_optimizer.device == OffloadDevice::kNone)
            z.offload_optimizer.device = OffloadDevice::kCpu;
          if (*b && optimizer_offload_key_.empty())
            optimizer_offload_key_ = key;
        }
      } else if (name == "sub_group_size") {
        const std::string want = "a positive number of elements, e.g. 1e9";
        if (auto n = read_whole(key, p, want)) {
          if (*n < 1)
            add(key, p.dump(), "must be a positive number of elements",
                "write " + want);
          else
            z.sub_group_size = *n;
        }
      } else if (contains(kZeroIgnored, name)) {
        ignore(key);
      } else {
        unknown_key(key, p, "zero_optimization",
                    closest(name, {&kZeroSupported, &kZeroIgnored}));
      }
    }
  }

  void parse_offload(const std::string& key, const Json& v) {
    static const std::vector<std::string> kKeys = {
        "device", "nvme_path", "pin_memory", "buffer_count", "buffer_size",
        "max_in_cpu", "fast_init", "ratio", "pipeline_read", "pipeline_write",
        "pipeline"};
    if (v.is_null()) {
      ignore(key);
      return;
    }
    if (!v.is_object()) {
      add(key, v.dump(), "must be a JSON object",
          "write { \"device\": \"cpu\" } or remove the section");
      return;
    }
    const bool param = key == "zero_optimization.offload_param";
    OffloadConfig& o = param ? cfg_.zero.offload_param
                             : cfg_.zero.offload_optimizer;
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
          add(k, p.dump(), "must be \"none\", \"cpu\" or \"nvme\"",
              "write one of \"none\", \"cpu\", \"nvme\"");
        }
      } else if (name == "nvme_path") {
        if (p.is_string() && !p.get<std::string>().empty())
          o.nvme_path = p.get<std::string>();
        else
          add(k, p.dump(), "must be a non-empty JSON string (a directory)",
              "write the directory on the NVMe drive, e.g. \"/local_nvme\"");
      } else if (name == "pin_memory") {
        if (auto b = read_bool(k, p)) o.pin_memory = *b;
      } else if (name == "buffer_count") {
        if (auto n = read_whole(k, p, "an integer >= 2, e.g. 4")) {
          if (*n < 2)
            add(k, p.dump(), "must be >= 2 (one buffer in use, one in flight)",
                "write e.g. 4");
          else
            o.buffer_count = *n;
        }
      } else if (contains(kKeys, name)) {
        ignore(k);
      } else {
        unknown_key(k, p, key.substr(key.find('.') + 1), closest(name, {&kKeys}));
      }
    }
    if (o.device == OffloadDevice::kNone) {
      ignore(key);
      return;
    }
    if (!param) optimizer_offload_key_ = key + ".device";
    if (o.device == OffloadDevice::kNvme && o.nvme_path.empty())
      add(key + ".nvme_path", "(missing)",
          "is required with \"device\": \"nvme\"",
          "add \"nvme_path\": \"<a directory on the NVMe drive>\"");
  }

  // --- checks that need several keys ---

  void check_batch() {
    BatchKey& t = batch_[0];
    BatchKey& m = batch_[1];
    BatchKey& g = batch_[2];
    if (cfg_.world_size < 1) return;
    const int64_t w = cfg_.world_size;
    auto input = [](const BatchKey& k) {
      return BatchInput{k.value, k.raw ? k.raw->dump() : ""};
    };
    const bool any_bad = t.bad || m.bad || g.bad;
    const bool any_auto = t.auto_problem != SIZE_MAX ||
                          m.auto_problem != SIZE_MAX ||
                          g.auto_problem != SIZE_MAX;
    if (any_auto) {
      // Derive as if each "auto" key were absent; if that determines it,
      // the fix names the exact number.
      std::optional<BatchTriple> d;
      if (!any_bad) {
        std::vector<ConfigProblem> scratch;
        d = resolve_batch(input(t), input(m), input(g), w, &scratch);
      }
      const std::string generic = "write a positive integer (" +
                                  std::string(kBatchRelation) +
                                  ", with world_size = " + std::to_string(w) +
                                  "; any two determine the third)";
      if (t.auto_problem != SIZE_MAX) {
        problems_[t.auto_problem].fix =
            d ? "write " + std::to_string(d->tbs) + " (= micro " +
                    std::to_string(d->micro) + " × gas " +
                    std::to_string(d->gas) + " × world " + std::to_string(w) +
                    ")"
              : generic;
      }
      if (m.auto_problem != SIZE_MAX) {
        problems_[m.auto_problem].fix =
            d ? "write " + std::to_string(d->micro) + " (= train_batch_size " +
                    std::to_string(d->tbs) + " / (gas " +
                    std::to_string(d->gas) + " × world " + std::to_string(w) +
                    "))"
              : generic;
      }
      if (g.auto_problem != SIZE_MAX) {
        problems_[g.auto_problem].fix =
            d ? "write " + std::to_string(d->gas) + " (= train_batch_size " +
                    std::to_string(d->tbs) + " / (micro " +
                    std::to_string(d->micro) + " × world " + std::to_string(w) +
                    "))"
              : generic;
      }
      return;
    }
    // A rejected batch key would only cascade into misleading arithmetic.
    if (any_bad) return;
    if (auto r = resolve_batch(input(t), input(m), input(g), w, &problems_)) {
      cfg_.train_batch_size = r->tbs;
      cfg_.train_micro_batch_size_per_gpu = r->micro;
      cfg_.gradient_accumulation_steps = r->gas;
    }
  }

  // Cross-key rules read a rejected key as its default.
  void check_cross_keys() {
    const bool managed =
        managed_valid_ ? cfg_.managed_gradient_accumulation : true;
    if (!pipeline_key_.empty()) {
      if (!managed) {
        add(pipeline_key_, pipeline_dump_,
            "pipeline parallelism owns the micro-batch schedule and cannot be "
            "combined with a caller-owned accumulation boundary "
            "(managed_gradient_accumulation = false)",
            "remove the " + pipeline_key_ +
                " key or set managed_gradient_accumulation to true");
      } else {
        add(pipeline_key_, pipeline_dump_,
            "pipeline parallelism is not supported by zerostep",
            "remove the " + pipeline_key_ + " key");
      }
    }
    if (!managed && stage_valid_ && cfg_.zero.overlap_comm &&
        cfg_.zero.stage <= 1) {
      add("zero_optimization.overlap_comm", "true",
          "with managed_gradient_accumulation = false, stage " +
              std::to_string(cfg_.zero.stage) +
              " reduces gradients only inside step(), so there is no "
              "backward work to overlap communication with",
          "set overlap_comm to false, or use zero_optimization.stage 2 or 3");
    }
  }

  Config cfg_;
  std::vector<ConfigProblem> problems_;
  BatchKey batch_[3];  // indexed by Slot
  bool managed_valid_ = true;
  bool stage_valid_ = true;
  std::string pipeline_key_;
  std::string pipeline_dump_;
  std::string precision_key_;  // the section that enabled mixed precision
  // The key that enabled optimizer offload (for messages).
  std::string optimizer_offload_key_;
};

}  // namespace

Config parse_config(const std::string& json_text, int world_size) {
  return Parser(world_size).run(json_text);
}

Config load_config_file(const std::string& path, int world_size) {
  std::string text;
  {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(
        std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) {
      throw IoError("cannot read ds_config file '" + path +
                    "': " + std::strerror(errno));
    }
    char buf[1 << 16];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) {
      text.append(buf, n);
    }
    // fopen succeeds on a directory on Linux; the read fails with EISDIR.
    if (std::ferror(f.get())) {
      throw IoError("cannot read ds_config file '" + path +
                    "': " + std::strerror(errno));
    }
  }
  try {
    return parse_config(text, world_size);
  } catch (const ConfigError& e) {
    throw ConfigError(e.problems(), path);
  }
}

std::optional<GradAccumScaling> grad_accum_scaling_from_string(
    const std::string& name) {
  const std::string s = lower(name);
  if (s == "configured") return GradAccumScaling::kConfigured;
  if (s == "per_step_count") return GradAccumScaling::kPerStepCount;
  if (s == "none") return GradAccumScaling::kNone;
  return std::nullopt;
}

const char* to_string(GradAccumScaling s) {
  switch (s) {
    case GradAccumScaling::kConfigured:
      return "configured";
    case GradAccumScaling::kPerStepCount:
      return "per_step_count";
    case GradAccumScaling::kNone:
      return "none";
  }
  return "unknown";
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
