#include "config/config.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "config/keys.h"
#include "config/problems.h"
#include "config/text.h"

namespace zerostep {
namespace {

using config_keys::names_under;
using config_text::closest;

using Json = ConfigJson;

// Walks the document's top-level keys in order, hands each section to its
// reader, then runs the checks that need the whole document.
class Parser {
 public:
  Parser(int world_size, const TrainerValues& trainer) : trainer_(trainer) {
    cfg_.world_size = world_size;
  }
  // The section readers point into cfg_ and problems_.
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  Config run(const std::string& text) {
    if (cfg_.world_size < 1) {
      report_.add("world_size", std::to_string(cfg_.world_size),
                  "must be >= 1 (the number of ranks; an argument of "
                  "parse_config, not a ds_config key)",
                  "pass the number of ranks in the run, e.g. 1 for one "
                  "process");
    }
    // The JSON library parses iteratively, but copying, printing and
    // walking a value recurse: refuse what could overflow the stack.
    const size_t depth = config_text::nesting_depth(text);
    if (depth > kMaxNestingDepth) {
      report_.add("<document>", "",
                  "arrays and objects nest " + std::to_string(depth) +
                      " levels deep; at most " +
                      std::to_string(kMaxNestingDepth) +
                      " are accepted (a ds_config needs fewer than 10)",
                  "remove the deeply nested value");
      throw ConfigError(std::move(problems_));
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
      report_.add("<document>", "", what,
                  "fix the JSON at that position (ds_config is plain JSON: no "
                  "comments, no trailing commas, keys in double quotes)");
      throw ConfigError(std::move(problems_));
    }
    if (!doc.is_object()) {
      report_.add("<document>", doc.dump(), "must be a JSON object",
                  "write the settings as { \"key\": value, ... }");
      throw ConfigError(std::move(problems_));
    }
    // Note [Trainer values]: the Hugging Face Trainer fills "auto" before
    // DeepSpeed reads the document; so does this, before the sections do.
    config_auto::FillResult fill =
        config_auto::fill_auto(&doc, trainer_, cfg_.world_size);
    cfg_.filled_auto = std::move(fill.filled);
    filled_how_ = std::move(fill.how);
    report_.set_filled(&filled_how_);
    auto zero = doc.find("zero_optimization");
    zero_is_flag_ = zero != doc.end() && zero->is_boolean();
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      parse_top(it.key(), it.value());
    }
    cfg_.managed_gradient_accumulation = batch_.managed_gradient_accumulation();
    cfg_.gradient_accumulation_scaling = batch_.scaling();
    if (std::optional<BatchSizes> sizes = batch_.resolve(cfg_.world_size)) {
      cfg_.train_batch_size = sizes->train_batch_size;
      cfg_.train_micro_batch_size_per_gpu =
          sizes->train_micro_batch_size_per_gpu;
      cfg_.gradient_accumulation_steps = sizes->gradient_accumulation_steps;
    }
    check_cross_keys();
    precision_.check();
    zero_.check_offload();
    for (ConfigProblem& p : fill.mismatches) problems_.push_back(std::move(p));
    if (!problems_.empty()) throw ConfigError(std::move(problems_));
    return cfg_;
  }

 private:
  void parse_top(const std::string& key, const Json& v) {
    if (key == "train_batch_size" || key == "train_micro_batch_size_per_gpu" ||
        key == "gradient_accumulation_steps") {
      batch_.parse_size(key, v);
    } else if (key == "managed_gradient_accumulation") {
      batch_.parse_managed(v);
    } else if (key == "gradient_accumulation_scaling") {
      batch_.parse_scaling(v);
    } else if (key == "optimizer") {
      optimizer_.parse(v);
    } else if (key == "gradient_clipping") {
      // null: DeepSpeed compares None with 0.0 and fails, so it is no
      // default here either (the type error below).
      if (auto d = report_.read_number(
              key, v, "a number >= 0 (0 turns clipping off)")) {
        if (*d < 0) {
          report_.add(
              key, v.dump(), "must be >= 0 (the max global grad norm)",
              "write 0 to turn clipping off, or a positive norm such as 1.0");
        } else {
          cfg_.gradient_clipping = *d;
        }
      }
    } else if (key == "steps_per_print") {
      if (v.is_null()) return;  // DeepSpeed's default (None).
      if (auto n = report_.read_whole(key, v, "an integer >= 1, e.g. 10")) {
        if (*n < 1) {
          report_.add(key, v.dump(), "must be an integer >= 1",
                      "write an integer >= 1, e.g. 10");
        } else {
          cfg_.steps_per_print = *n;
        }
      }
    } else if (key == "zero_optimization") {
      zero_.parse(v);
    } else if (key == "allgather_size") {
      // DeepSpeed reads it only with the deprecated boolean
      // zero_optimization.
      if (zero_is_flag_) {
        zero_.parse_allgather_size(v);
      } else {
        report_.ignore(key);
      }
    } else if (key == "scheduler") {
      parse_lr_schedule(v, &cfg_.scheduler, &problems_, &filled_how_);
    } else if (key == "prescale_gradients") {
      // null: DeepSpeed's default (None, which it reads as false).
      if (v.is_null()) return;
      if (auto b = report_.read_bool(key, v)) cfg_.prescale_gradients = *b;
    } else if (key == "gradient_predivide_factor") {
      parse_predivide_factor(v);
    } else if (key == "pipeline" || key == "pipeline_parallel_size") {
      if (key == "pipeline_parallel_size" && v.is_number() &&
          v.get<double>() == 1.0) {
        report_.ignore(key);  // one stage is no pipeline.
      } else if (pipeline_key_.empty()) {
        pipeline_key_ = key;
        pipeline_dump_ = v.dump();
      }
    } else if (key == "fp16") {
      precision_.parse_fp16(v);
    } else if (key == "bf16" || key == "bfloat16") {
      precision_.parse_bf16(key, v);
    } else if (key == "data_types") {
      precision_.parse_data_types(v);
    } else if (!report_.unimplemented(key, v)) {
      static const std::vector<std::string> kNames = names_under("");
      report_.unknown_key(key, v, "ds_config", closest(key, {&kNames}));
    }
  }

  // DeepSpeed multiplies by 1 / factor and by factor / world_size: null
  // fails there, 0 divides by zero, and a negative factor flips the
  // gradient's sign twice (each rank's, then the sum's): any finite
  // positive factor is the same average up to rounding.
  void parse_predivide_factor(const Json& v) {
    const std::string key = "gradient_predivide_factor";
    if (v.is_null()) {
      report_.add(key, "null",
                  "is not a default: DeepSpeed divides by it (1.0 / None "
                  "raises TypeError)",
                  "write 1.0 (no pre-division), or remove the key");
      return;
    }
    if (auto d = report_.read_number(key, v, "a number > 0, e.g. 1.0")) {
      if (!(*d > 0) || !std::isfinite(*d)) {
        report_.add(key, v.dump(),
                    "must be a finite number > 0 (each rank's gradient is "
                    "multiplied by 1 / factor before the sum)",
                    "write a number > 0, e.g. 1.0 for no pre-division");
      } else {
        cfg_.gradient_predivide_factor = *d;
        predivide_dump_ = v.dump();
      }
    }
  }

  // Cross-key rules read a rejected key as its default.
  void check_cross_keys() {
    // DeepSpeed's prescale branch never reads the factor.
    if (cfg_.prescale_gradients && !predivide_dump_.empty() &&
        cfg_.gradient_predivide_factor != 1.0) {
      report_.ignore("gradient_predivide_factor");
    }
    const bool managed = cfg_.managed_gradient_accumulation;
    if (!pipeline_key_.empty()) {
      if (!managed) {
        report_.add(
            pipeline_key_, pipeline_dump_,
            "pipeline parallelism owns the micro-batch schedule and cannot be "
            "combined with a caller-owned accumulation boundary "
            "(managed_gradient_accumulation = false)",
            "remove the " + pipeline_key_ +
                " key or set managed_gradient_accumulation to true");
      } else {
        report_.add(pipeline_key_, pipeline_dump_,
                    "pipeline parallelism is not supported by zerostep",
                    "remove the " + pipeline_key_ + " key");
      }
    }
    if (!managed && zero_.stage_valid() && cfg_.zero.overlap_comm &&
        cfg_.zero.stage <= 1) {
      report_.add(
          "zero_optimization.overlap_comm", "true",
          "with managed_gradient_accumulation = false, stage " +
              std::to_string(cfg_.zero.stage) +
              " reduces gradients only inside step(), so there is no "
              "backward work to overlap communication with",
          "set overlap_comm to false, or use zero_optimization.stage 2 or 3");
    }
    // Note [Reduce once per step] (zero/stage.h): stage 2 then reduces in
    // the boundary backward (managed mode, where overlap_comm launches its
    // buckets there) or inside step() (unmanaged mode), and stage 3 every
    // group at once in the step or the boundary backward (Note [Stage 3
    // reduce-scatter in flight] is for the per-backward reduce-scatters):
    // nothing to overlap, so the key is listed as not acted on.
    if (zero_.stage_valid() && cfg_.zero.overlap_comm &&
        cfg_.zero.reduce_once_per_step &&
        ((!managed && cfg_.zero.stage == 2) || cfg_.zero.stage == 3)) {
      report_.ignore("zero_optimization.overlap_comm");
    }
  }

  const TrainerValues& trainer_;
  Config cfg_;
  // Note [Trainer values]: the keys filled in for "auto", and how.
  std::map<std::string, std::string> filled_how_;
  std::string predivide_dump_;  // gradient_predivide_factor as given
  std::vector<ConfigProblem> problems_;
  ProblemReporter report_{&problems_, &cfg_.ignored_keys};
  BatchSection batch_{&report_};
  OptimizerSection optimizer_{&cfg_.optimizer, &report_};
  ZeroSection zero_{&cfg_.zero, &report_};
  PrecisionSection precision_{&cfg_.precision, &report_};
  std::string pipeline_key_;
  std::string pipeline_dump_;
  // "zero_optimization" is DeepSpeed's deprecated boolean.
  bool zero_is_flag_ = false;
};

}  // namespace

Config parse_config(const std::string& json_text, int world_size,
                    const TrainerValues& trainer) {
  return Parser(world_size, trainer).run(json_text);
}

Config parse_config(const std::string& json_text, int world_size) {
  return parse_config(json_text, world_size, TrainerValues{});
}

Config load_config_file(const std::string& path, int world_size) {
  return load_config_file(path, world_size, TrainerValues{});
}

Config load_config_file(const std::string& path, int world_size,
                        const TrainerValues& trainer) {
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
    return parse_config(text, world_size, trainer);
  } catch (const ConfigError& e) {
    throw ConfigError(e.problems(), path);
  }
}

namespace {

// "<what>: a, b, c", or "" for no items.
std::string note(const std::string& what,
                 const std::vector<std::string>& items) {
  if (items.empty()) return "";
  std::string s = what + ": ";
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s;
}

}  // namespace

std::string ignored_keys_note(const Config& config) {
  return note(
      "ds_config keys accepted without effect (DeepSpeed keys zerostep does "
      "not act on; see docs/config.md)",
      config.ignored_keys);
}

std::string filled_auto_note(const Config& config) {
  return note(
      "ds_config \"auto\" filled with the trainer's values (Hugging Face's "
      "rules; see docs/config.md)",
      config.filled_auto);
}

}  // namespace zerostep
