// The main job: the managed/unmanaged parity matrix on the simulator.
//
//   ./bazelw run //tools:harness                      # embedded default
//   ./bazelw run //tools:harness -- --json --stages=0,1 --world=1,2,4
//
// For every (stage, world, scaling) it runs an unmanaged engine (N backward
// calls, one step), its managed twin and a single-rank full-batch reference
// (parity/scenario.h, Note [Parity claims]); prints a table (or one JSON
// object per scenario with --json) on stdout and progress on stderr. Exit
// status 0 only if every scenario is ok.
//
// --faults / --swarm: fault scenarios instead (parity/fault_run.h, Note
// [Fault contract]); a failing one prints its seed, its options and the
// command line that replays it. --simulate-scale: the shape-only scale
// mode (scale/scale_sim.h) for model presets at large worlds.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/cli.h"
#include "common/errors.h"
#include "common/log.h"
#include "config/config.h"
#include "parity/fault_run.h"
#include "parity/scenario.h"
#include "runtime/runtime_info.h"
#include "scale/scale_sim.h"
#include "sim/cost_model.h"
#include "sim/faults.h"
#include "tools/harness_flags.h"
#include "zero/flat_layout.h"

namespace zerostep {
namespace {

// mkdtemp under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string t =
        std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr)
      throw IoError("cannot create a temporary directory '" + t +
                    "': " + std::strerror(errno));
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i)
    s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// --simulate-scale: one line (or JSON object) per (stage, world).
int run_scale_mode(const HarnessFlags& f) {
  const std::string model_name = f.model_given ? f.model : "7B";
  const ScaleOptions& base = f.scale;
  const bool managed = f.managed_modes.front();
  const bool as_json = f.json;
  const ModelShape model = model_preset(model_name);
  std::cerr << "zerostep harness --simulate-scale: model=" << model_name
            << " params=" << model.numel()
            << " backwards=" << base.schedule.backwards
            << " tokens_per_micro_batch=" << base.tokens_per_micro_batch
            << " managed=" << (managed ? "true" : "false")
            << " overlap_comm=" << (base.schedule.overlap_comm ? "on" : "off")
            << " max_reuse_distance=" << base.schedule.max_reuse_distance
            << " gather_once_per_step="
            << (base.schedule.gather_once_per_step ? "on" : "off")
            << "\n  cost: " << base.cost.to_string() << "\n";
  if (!as_json)
    std::printf(
        "%-5s %-5s %-6s %-12s %-12s %-12s %-12s %-10s %-14s %-11s %-12s "
        "%-12s %s\n",
        "dtype", "stage", "world", "step_s", "compute_s", "comm_s",
        "exposed_s", "exposed%", "bytes/rank", "states_GB", "mem_rest_GB",
        "mem_peak_GB", "wall_ms");
  for (Precision dtype : f.dtypes)
  for (int stage : f.stages) {
    for (int w : f.worlds) {
      ScaleOptions o = base;
      o.schedule.stage = stage;
      o.schedule.world_size = w;
      o.schedule.managed = managed;
      o.schedule.dtype = dtype;
      // Note [Memory plan]: the paper's model states and the named buffers.
      const MemoryPlan plan = memory_plan(model, o.schedule);
      const auto t0 = std::chrono::steady_clock::now();
      const ScaleReport r = simulate_scale(model, o);
      const double wall_ms = std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - t0)
                                 .count();
      const MemoryStats& m = r.memory;
      const double rest =
          static_cast<double>(m.param_bytes + m.grad_bytes +
                              m.optimizer_state_bytes + m.rollback_bytes) /
          1e9;
      if (as_json) {
        nlohmann::json j;
        j["model"] = model_name;
        j["params"] = r.params;
        j["dtype"] = to_string(dtype);
        j["stage"] = stage;
        j["world"] = w;
        j["backwards"] = o.schedule.backwards;
        j["max_reuse_distance"] = o.schedule.max_reuse_distance;
        j["gather_once_per_step"] = o.schedule.gather_once_per_step;
        j["step_s"] = r.step_s;
        j["compute_s"] = r.compute_s;
        j["comm_s"] = r.comm_s;
        j["exposed_comm_s"] = r.exposed_comm_s;
        j["bytes_per_rank"] = r.bytes_per_rank;
        j["wire_bytes_per_rank"] = r.wire_bytes_per_rank;
        j["bytes_by_collective"] = r.bytes_by_collective;
        j["memory"] = {{"param_bytes", m.param_bytes},
                       {"grad_bytes", m.grad_bytes},
                       {"optimizer_state_bytes", m.optimizer_state_bytes},
                       {"rollback_bytes", m.rollback_bytes},
                       {"peak_bytes", m.peak_bytes},
                       {"model_state_bytes", plan.model_state_bytes()}};
        for (const MemoryTerm& t : plan.terms)
          j["memory_terms"].push_back(
              {{"name", t.name}, {"bytes", t.bytes},
               {"model_state", t.model_state}});
        j["wall_ms"] = wall_ms;
        std::cout << j.dump() << "\n";
      } else {
        std::printf(
            "%-5s %-5d %-6d %-12.6g %-12.6g %-12.6g %-12.6g %-10.1f "
            "%-14llu %-11.3f %-12.3f %-12.3f %.1f\n",
            to_string(dtype), stage, w, r.step_s, r.compute_s, r.comm_s,
            r.exposed_comm_s, 100.0 * r.exposed_comm_s / r.step_s,
            static_cast<unsigned long long>(r.bytes_per_rank),
            plan.model_state_bytes() / 1e9, rest, m.peak_bytes / 1e9,
            wall_ms);
      }
      std::cout.flush();
    }
  }
  return 0;
}

// --faults / --swarm: every scenario with faults, the `fixed` ones or
// `swarm` mixes drawn from seeds; exit 1 if any breaks the fault contract.
int run_fault_runs(const std::vector<Scenario>& scenarios,
                   const std::vector<bool>& modes, const FaultOptions* fixed,
                   int swarm, bool as_json) {
  int failed = 0, runs = 0;
  for (const Scenario& base : scenarios) {
    for (bool managed : modes) {
      const int n = fixed ? 1 : swarm;
      for (int i = 0; i < n; ++i) {
        FaultScenario f;
        f.scenario = base;
        f.managed = managed;
        if (fixed) {
          f.faults = *fixed;
        } else {
          f.scenario.seed = base.seed + static_cast<uint64_t>(i);
          const int64_t collectives =
              static_cast<int64_t>(baseline_schedule(f).size());
          f.faults =
              draw_fault_options(f.scenario.seed, base.world_size, collectives);
        }
        const FaultRunResult r = run_fault_scenario(f);
        ++runs;
        std::string first_error;
        for (const FaultRankOutcome& o : r.ranks)
          if (!o.error.empty()) {
            first_error = o.error;
            break;
          }
        if (as_json) {
          nlohmann::json j;
          j["stage"] = base.stage;
          j["world"] = base.world_size;
          j["managed"] = managed;
          j["seed"] = f.scenario.seed;
          j["faults"] = f.faults.to_string();
          j["any_failed"] = r.any_failed;
          j["ok"] = r.ok;
          j["failures"] = r.failures;
          j["replay"] = r.replay;
          std::vector<std::string> errors;
          std::vector<double> times;
          for (const FaultRankOutcome& o : r.ranks) {
            errors.push_back(o.error);
            times.push_back(o.virtual_time_s);
          }
          j["errors"] = errors;
          j["virtual_time_s"] = times;
          std::cout << j.dump() << "\n";
        } else {
          std::printf("%-5d %-5d %-9s %-8llu %-6s %-4s %s\n", base.stage,
                      base.world_size, managed ? "managed" : "unmanaged",
                      static_cast<unsigned long long>(f.scenario.seed),
                      r.any_failed ? "error" : "clean", r.ok ? "ok" : "FAIL",
                      f.faults.to_string().c_str());
          if (!first_error.empty())
            std::printf("      rank error: %s\n", first_error.c_str());
        }
        std::cout.flush();
        if (!r.ok) {
          ++failed;
          std::cerr << "FAILED seed=" << f.scenario.seed
                    << " options=" << f.faults.to_string() << "\n";
          for (const std::string& why : r.failures)
            std::cerr << "    failure: " << why << "\n";
          std::cerr << "  replay: " << r.replay << "\n";
        }
      }
    }
  }
  std::cerr << (runs - failed) << " of " << runs
            << " fault runs keep the fault contract\n";
  return failed == 0 ? 0 : 1;
}

// Checks that fault runs can run and says which on stderr.
void start_fault_runs(const HarnessFlags& f) {
  if (f.backend != "sim")
    throw FlagError("fault scenarios run on --backend=sim");
  std::cerr << "  fault runs: "
            << (f.mode == HarnessMode::kFaults
                    ? "faults=" + f.faults
                    : "swarm=" + std::to_string(f.swarm))
            << " managed=" << f.managed << "\n";
}

// --faults: the given faults in every scenario.
int run_faults_mode(const HarnessFlags& f,
                    const std::vector<Scenario>& scenarios) {
  start_fault_runs(f);
  const FaultOptions fixed = parse_fault_options(f.faults);
  return run_fault_runs(scenarios, f.managed_modes, &fixed, 0, f.json);
}

// --swarm: f.swarm fault mixes per scenario, drawn from seeds.
int run_swarm_mode(const HarnessFlags& f,
                   const std::vector<Scenario>& scenarios) {
  start_fault_runs(f);
  return run_fault_runs(scenarios, f.managed_modes, nullptr, f.swarm, f.json);
}

// The built-in model's hidden size, for a --config file's "auto" bucket
// sizes (Note [Trainer values]): make_task's widths (models/task.cc), the
// mlp's hidden layers and the gpt's d_model.
int64_t model_hidden_size(const std::string& model, int scale) {
  return (model == "gpt" ? 32 : 64) * static_cast<int64_t>(scale);
}

// What the harness, as the trainer, fills a --config file's "auto" with
// (Note [Trainer values] in config/trainer_values.h): its flags (the
// micro-batch, the first window's backward count as the configured GAS,
// --clip or no clipping, the first --dtype or fp32, the steps as the run's
// length), its built-in optimizer's lr and weight decay with DeepSpeed's
// betas and eps, a warmup of one step, and the model's hidden size. Only
// "auto" is filled (must_match false): the scenarios replace the file's
// batch keys, stage and dtype anyway.
TrainerValues harness_trainer_values(const HarnessFlags& f) {
  TrainerValues t;
  t.micro_batch_size = f.micro_batch;
  t.gradient_accumulation_steps = f.per_step.front();
  t.learning_rate = kScenarioLr;
  t.adam_beta1 = 0.9;
  t.adam_beta2 = 0.999;
  t.adam_epsilon = 1e-8;
  t.weight_decay = kScenarioWeightDecay;
  t.max_grad_norm = f.clip_given ? f.clip : 0.0;
  t.warmup_steps = 1;
  t.total_steps = static_cast<int64_t>(f.per_step.size());
  t.dtype = f.dtypes_given ? f.dtypes.front() : Precision::kFp32;
  t.hidden_size = model_hidden_size(f.model, f.model_scale);
  t.must_match = false;
  return t;
}

// The --config file: its text and what it says, checked exactly as the
// engine would check it for every world size (ConfigError, IoError), its
// "auto" filled with the harness's trainer values.
struct BaseConfig {
  std::string text;  // "" without --config
  Config config;     // parsed for the first world size
  TrainerValues trainer;
};

BaseConfig load_base_config(const HarnessFlags& f) {
  BaseConfig b;
  if (f.config_path.empty()) return b;
  b.trainer = harness_trainer_values(f);
  for (size_t i = 0; i < f.worlds.size(); ++i) {
    Config c = load_config_file(f.config_path, f.worlds[i], b.trainer);
    if (i == 0) b.config = std::move(c);
  }
  std::ifstream in(f.config_path);
  std::stringstream ss;
  ss << in.rdbuf();
  b.text = ss.str();
  return b;
}

// What the --config file says, for every matrix flag the command line left
// out: the file's stage, dtype, clipping and optimizer offload.
HarnessFlags with_file_defaults(HarnessFlags f, const BaseConfig& base) {
  if (f.config_path.empty()) return f;
  const Config& c = base.config;
  if (!f.stages_given) f.stages = {c.zero.stage};
  if (!f.dtypes_given) f.dtypes = {c.precision.dtype};
  if (!f.clip_given) f.clip = c.gradient_clipping;
  if (!f.offloads_given) f.offloads = {c.zero.offload_optimizer.device};
  if (!f.overflow.empty() && std::find(f.dtypes.begin(), f.dtypes.end(),
                                       Precision::kFp16) == f.dtypes.end())
    throw FlagError("--overflow needs fp16, and " + f.config_path +
                    " trains in " + to_string(c.precision.dtype) +
                    ": add --dtype=fp16");
  return f;
}

// One scenario; a config the harness's changes made invalid names the file
// and what the harness changed.
ScenarioResult run_named(const Scenario& s, const std::string& config_path) {
  try {
    return run_scenario(s);
  } catch (const ConfigError& e) {
    if (config_path.empty()) throw;
    // The file was checked for every world before the first scenario, so
    // what fails here is a flag's change to it.
    throw UsageError(
        "'" + config_path +
        "' is valid, but not with the harness's changes for "
        "this scenario (stage " +
        std::to_string(s.stage) + ", world " + std::to_string(s.world_size) +
        ", dtype " + to_string(s.dtype) + ", offload " + to_string(s.offload) +
        "): " + e.what() + "\n  replay: harness" + harness_flags(s));
  }
}

// The table's last column: what sets the scenario apart beyond the columns
// before it (clipping, the zero_optimization switches and bucket sizes,
// the injected overflow, parameter offload, the base config as compact
// JSON, cut at 160 bytes); "-" when nothing does.
std::string scenario_options(const Scenario& s) {
  std::vector<std::string> out;
  if (s.gradient_clipping > 0) {
    std::ostringstream clip;
    clip << "clip=" << s.gradient_clipping;
    out.push_back(clip.str());
  }
  if (s.overlap_comm) out.push_back("overlap_comm");
  if (s.reduce_bucket_size > 0)
    out.push_back("reduce_bucket=" + std::to_string(s.reduce_bucket_size));
  if (s.allgather_bucket_size > 0)
    out.push_back("allgather_bucket=" +
                  std::to_string(s.allgather_bucket_size));
  if (s.reduce_once_per_step) out.push_back("reduce_once");
  if (s.gather_once_per_step) out.push_back("gather_once");
  if (s.overflow_window >= 0)
    out.push_back("overflow=" + std::to_string(s.overflow_window) + ":" +
                  std::to_string(s.overflow_rank) + ":" +
                  std::to_string(s.overflow_backward) + ":" +
                  to_string(s.overflow_kind));
  if (s.offload_param != OffloadDevice::kNone)
    out.push_back(std::string("offload_param=") + to_string(s.offload_param));
  // A --config file can be long: its first bytes (the header names it).
  if (!s.base_config_json.empty())
    out.push_back(
        elide(nlohmann::json::parse(s.base_config_json).dump(), 160));
  if (out.empty()) return "-";
  std::string joined;
  for (const std::string& o : out) joined += (joined.empty() ? "" : " ") + o;
  return joined;
}

// The parity matrix: every scenario's unmanaged run, its managed twin and
// the single-rank reference; a table (or JSON lines) on stdout, progress
// on stderr; exit 1 if any scenario fails.
int run_parity_mode(const HarnessFlags& f,
                    const std::vector<Scenario>& scenarios) {
  const bool as_json = f.json;
  if (!as_json) {
    std::printf(
        "%-7s %-5s %-5s %-5s %-15s %-7s %-12s %-12s %-14s %-14s %-11s %-11s "
        "%-11s %-16s %-6s %s\n",
        "offload", "dtype", "stage", "world", "scaling", "bitwise",
        "max_abs_diff", "ref_rel_l2", "bytes_managed", "bytes_unmgd",
        "mem_rest", "mem_peak", "mem_plan", "digest", "ok", "options");
  }
  int failed = 0;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    auto t0 = std::chrono::steady_clock::now();
    ScenarioResult r;
    try {
      r = run_named(s, f.config_path);
    } catch (const CommError& e) {
      // A collective that failed without injected faults is a broken
      // engine (ranks that disagree, e.g. on skipping a window): this
      // scenario fails, the others still run.
      r.scenario = s;
      r.failures.push_back(std::string("a collective failed: ") + e.what());
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    std::cerr << "[" << (i + 1) << "/" << scenarios.size()
              << "] offload=" << to_string(s.offload) << " "
              << to_string(s.dtype) << " stage=" << s.stage
              << " world=" << s.world_size
              << " scaling=" << to_string(s.scaling) << " "
              << (r.ok ? "ok" : "FAILED") << " (" << secs << " s)\n";
    if (as_json) {
      std::cout << to_json_line(r) << "\n";
    } else {
      std::printf(
          "%-7s %-5s %-5d %-5d %-15s %-7s %-12.3g %-12.3g %-14llu %-14llu "
          "%-11zu %-11zu %-11s %-16s %-6s %s\n",
          to_string(s.offload), to_string(s.dtype), s.stage, s.world_size,
          to_string(s.scaling), r.bitwise_equal ? "yes" : "NO", r.max_abs_diff,
          r.ref_rel_l2_diff,
          static_cast<unsigned long long>(r.managed.comm_bytes),
          static_cast<unsigned long long>(r.unmanaged.comm_bytes),
          r.unmanaged.memory_rest_bytes, r.unmanaged.memory_peak_bytes,
          r.memory_planned ? std::to_string(r.memory_plan_bytes).c_str() : "-",
          r.unmanaged.digest.c_str(), r.ok ? "ok" : "FAILED",
          scenario_options(s).c_str());
    }
    std::cout.flush();
    if (!r.ok) {
      ++failed;
      for (const std::string& why : r.failures)
        std::cerr << "    failure: " << why << "\n";
      std::cerr << "    replay: harness" << harness_flags(s) << "\n";
    }
  }
  std::cerr << (scenarios.size() - failed) << " of " << scenarios.size()
            << " scenarios ok (seed=" << f.seed << ")\n";
  return failed == 0 ? 0 : 1;
}

// seed= and every option, and what the process computes with, on stderr.
void print_run_header(const HarnessFlags& f, bool plan) {
  std::cerr << "zerostep harness: seed=" << f.seed << " backend=" << f.backend
            << " model=" << f.model << " model_scale=" << f.model_scale
            << " micro_batch=" << f.micro_batch;
  if (plan) {
    std::cerr << " matrix=default plan (accumulation, clipping, fp16, "
                 "offload: Note [Default plan] in tools/harness.cc; any "
                 "matrix flag runs that matrix instead)";
  } else {
    std::cerr << " stages=" << join(f.stages) << " world=" << join(f.worlds)
              << " backwards=" << join(f.per_step) << " clip=" << f.clip
              << " dtype=";
    for (size_t i = 0; i < f.dtypes.size(); ++i)
      std::cerr << (i ? "," : "") << to_string(f.dtypes[i]);
    if (!f.overflow.empty())
      std::cerr << " overflow=" << f.overflow[0] << ":" << f.overflow[1] << ":"
                << f.overflow[2] << (f.overflow_element ? ":element" : ":loss");
    std::cerr << " overlap_comm=" << (f.overlap_comm ? "stage>=2" : "off")
              << " reduce_once_per_step="
              << (f.reduce_once_per_step ? "stage>=2" : "off")
              << " gather_once_per_step="
              << (f.gather_once_per_step ? "stage3" : "off")
              << " reduce_bucket_size=" << f.reduce_bucket_size
              << " allgather_bucket_size=" << f.allgather_bucket_size
              << " config="
              << (f.config_path.empty() ? "(built-in)" : f.config_path);
  }
  std::cerr << "\n  " << runtime_info() << "\n";
}

// The fields every scenario takes from the flags, whatever the matrix.
Scenario flag_scenario(const HarnessFlags& f) {
  Scenario s;
  s.model = f.model;
  s.backend = f.backend;
  s.model_scale = f.model_scale;
  s.seed = f.seed;
  s.micro_batch = f.micro_batch;
  s.device = f.device;
  s.kernels = f.kernels;
  return s;
}

// Every (offload, dtype, stage, world, scaling) scenario the flags ask for;
// stage 0 has no optimizer offload, so it runs only with none.
std::vector<Scenario> build_scenarios(const HarnessFlags& f,
                                      const BaseConfig& base,
                                      const std::string& nvme_path) {
  std::vector<Scenario> scenarios;
  // Without --offload the file's own offload_param device applies (stage 3).
  const OffloadDevice file_param = f.config_path.empty() || f.offloads_given
                                       ? OffloadDevice::kNone
                                       : base.config.zero.offload_param.device;
  for (OffloadDevice offload : f.offloads)
    for (Precision dtype : f.dtypes)
      for (int stage : f.stages)
        for (int w : f.worlds)
          for (GradAccumScaling sc : f.scalings) {
            // Optimizer offload partitions the optimizer state: stages 1-3.
            // --offload skips stage 0; a file's offload section does not
            // apply there (as in DeepSpeed, where stage 0 has no
            // partitioned optimizer state to offload).
            if (stage == 0 && offload != OffloadDevice::kNone &&
                f.offloads_given)
              continue;
            Scenario s = flag_scenario(f);
            s.dtype = dtype;
            s.offload = stage == 0 ? OffloadDevice::kNone : offload;
            if (stage == 3 && f.offload_param) s.offload_param = offload;
            if (stage == 3 && file_param != OffloadDevice::kNone)
              s.offload_param = file_param;
            s.nvme_path = nvme_path;
            s.sub_group_size = f.sub_group_size;
            if (dtype == Precision::kFp16 && !f.overflow.empty()) {
              s.overflow_window = f.overflow[0];
              s.overflow_rank = f.overflow[1];
              s.overflow_backward = f.overflow[2];
              if (f.overflow_element) s.overflow_kind = OverflowKind::kElement;
            }
            s.stage = stage;
            s.world_size = w;
            s.backwards = f.per_step;
            s.scaling = sc;
            s.gradient_clipping = f.clip;
            s.overlap_comm = f.overlap_comm && stage >= 2;
            s.reduce_once_per_step = f.reduce_once_per_step && stage >= 2;
            s.gather_once_per_step = f.gather_once_per_step && stage == 3;
            s.reduce_bucket_size = f.reduce_bucket_size;
            s.allgather_bucket_size = f.allgather_bucket_size;
            s.persistence_threshold = f.persistence_threshold >= 0
                                          ? f.persistence_threshold
                                          : (f.config_path.empty() ? 0 : -1);
            s.base_config_json = base.text;
            s.trainer = base.trainer;
            s.trainer.dtype = dtype;
            // The file's own loss scale may start high enough to overflow.
            s.natural_overflow_ok = !f.config_path.empty();
            scenarios.push_back(s);
          }
  return scenarios;
}

// Note [Default plan]
// ~~~~~~~~~~~~~~~~~~~
// `harness` with no matrix flag runs four groups, chosen so that each knob
// a bug could hide behind is exercised where the check would see it:
//   accumulation  stages 0-3 x worlds 1-4 (3 is odd) x every scaling, with
//                 N = 3,5,2 per window against a configured GAS of 3 (a
//                 wrong-N scale moves the result off the reference); stage
//                 2 with 256-element buckets (several buckets per backward,
//                 so a missed flush loses gradient), stage 3 partitioning
//                 every block;
//   clipping      SGD (which, unlike Adam, shows a wrong gradient scale in
//                 the parameters) with gradient_clipping 0.45, which
//                 clips some windows and not others, at worlds 2 and 3 (a
//                 rank clipping by its own partition's norm differs from
//                 the reference),
//                 stage 2 with overlap_comm and small buckets;
//   fp16          dynamic loss scaling with a WarmupLR schedule, an inf in
//                 one gradient element of one rank in window 1 (every rank
//                 must skip it; the lr must not move across it), and bf16;
//   offload       optimizer offload to cpu at stages 1-3 (stage 3 with its
//                 parameters too) and to nvme at stages 2 and 3: bitwise
//                 equal to the same run in memory;
//   reduce once   zero_optimization.reduce_once_per_step at stages 2 and 3
//                 (Note [Reduce once per step] in zero/stage.h), managed
//                 and unmanaged both with it: worlds 1-3 with every
//                 scaling, SGD with clipping and overlap_comm (which it
//                 turns off), fp16 with the one-element overflow, bf16,
//                 and cpu offload (stage 3 with its parameters);
//   gather once   zero_optimization.gather_once_per_step at stage 3 (Note
//                 [Stage 3 gather once per step] in zero/stage3.h),
//                 trained again without it for the same bits: worlds 1-3,
//                 with reduce_once_per_step, stage3_max_reuse_distance 0,
//                 bf16, and cpu offload of the parameters.
// About 120 scenarios; a few seconds on the built-in mlp.
std::vector<Scenario> default_plan(const HarnessFlags& f,
                                   const std::string& nvme_path) {
  const std::vector<int> n = {3, 5, 2};
  std::vector<Scenario> out;
  auto add = [&](Scenario s) {
    s.backwards = n;
    s.nvme_path = nvme_path;
    if (s.persistence_threshold < 0) s.persistence_threshold = 0;
    if (s.stage == 2 && s.reduce_bucket_size == 0) {
      s.reduce_bucket_size = 256;
      s.allgather_bucket_size = 256;
    }
    out.push_back(s);
  };
  // A scenario of the plan: the flags' model and backend at (stage, world).
  auto at = [&f](int stage, int world) {
    Scenario s = flag_scenario(f);
    s.stage = stage;
    s.world_size = world;
    return s;
  };
  // fp16 with one +inf gradient element on rank 1 in window 1's third
  // backward (Note [Overflow in one element]).
  auto fp16_element_overflow = [](Scenario& s) {
    s.dtype = Precision::kFp16;
    s.overflow_window = 1;
    s.overflow_rank = 1;
    s.overflow_backward = 2;
    s.overflow_kind = OverflowKind::kElement;
  };
  for (int stage : {0, 1, 2, 3})
    for (int w : {1, 2, 3, 4})
      for (GradAccumScaling sc :
           {GradAccumScaling::kConfigured, GradAccumScaling::kPerStepCount,
            GradAccumScaling::kNone}) {
        Scenario s = at(stage, w);
        s.scaling = sc;
        add(s);
      }
  for (int stage : {0, 1, 2, 3})
    for (int w : {2, 3})
      for (GradAccumScaling sc :
           {GradAccumScaling::kConfigured, GradAccumScaling::kNone}) {
        Scenario s = at(stage, w);
        s.scaling = sc;
        s.gradient_clipping = 0.45;
        s.overlap_comm = stage >= 2;
        s.base_config_json =
            R"({"optimizer": {"type": "SGD", "params": {"lr": 0.05}}})";
        add(s);
      }
  for (int stage : {0, 1, 2, 3})
    for (int w : {2, 3}) {
      Scenario s = at(stage, w);
      fp16_element_overflow(s);
      s.base_config_json = R"({"scheduler": {"type": "WarmupLR", "params": )"
                           R"({"warmup_min_lr": 0, "warmup_max_lr": 0.001, )"
                           R"("warmup_num_steps": 3}}})";
      add(s);
    }
  for (int stage : {0, 1, 2, 3}) {
    Scenario s = at(stage, 3);
    s.dtype = Precision::kBf16;
    add(s);
  }
  for (int stage : {1, 2, 3})
    for (int w : {2, 3}) {
      Scenario s = at(stage, w);
      s.offload = OffloadDevice::kCpu;
      if (stage == 3) s.offload_param = OffloadDevice::kCpu;
      add(s);
    }
  for (int stage : {2, 3}) {
    Scenario s = at(stage, 3);
    s.offload = OffloadDevice::kNvme;
    if (stage == 3) s.offload_param = OffloadDevice::kNvme;
    add(s);
  }
  for (int stage : {2, 3}) {
    for (int w : {1, 2, 3})
      for (GradAccumScaling sc :
           {GradAccumScaling::kConfigured, GradAccumScaling::kPerStepCount,
            GradAccumScaling::kNone}) {
        Scenario s = at(stage, w);
        s.scaling = sc;
        s.reduce_once_per_step = true;
        add(s);
      }
    Scenario clip = at(stage, 3);
    clip.reduce_once_per_step = true;
    clip.gradient_clipping = 0.45;
    clip.overlap_comm = true;
    clip.base_config_json =
        R"({"optimizer": {"type": "SGD", "params": {"lr": 0.05}}})";
    add(clip);
    Scenario fp16 = at(stage, 3);
    fp16.reduce_once_per_step = true;
    fp16_element_overflow(fp16);
    add(fp16);
    Scenario bf16 = at(stage, 3);
    bf16.reduce_once_per_step = true;
    bf16.dtype = Precision::kBf16;
    add(bf16);
    Scenario off = at(stage, 2);
    off.reduce_once_per_step = true;
    off.offload = OffloadDevice::kCpu;
    if (stage == 3) off.offload_param = OffloadDevice::kCpu;
    add(off);
  }
  for (int w : {1, 2, 3}) {
    Scenario s = at(3, w);
    s.gather_once_per_step = true;
    add(s);
  }
  {
    Scenario once = at(3, 3);
    once.gather_once_per_step = once.reduce_once_per_step = true;
    add(once);
    Scenario release = at(3, 2);
    release.gather_once_per_step = true;
    release.base_config_json =
        R"({"zero_optimization": {"stage3_max_reuse_distance": 0}})";
    add(release);
    Scenario bf16 = at(3, 3);
    bf16.gather_once_per_step = true;
    bf16.dtype = Precision::kBf16;
    add(bf16);
    Scenario off = at(3, 2);
    off.gather_once_per_step = true;
    off.offload = off.offload_param = OffloadDevice::kCpu;
    add(off);
  }
  return out;
}

// Note [Refusing a world that cannot fit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A simulated world keeps all its ranks in this process: each is a thread
// with its own engine and its own replica of the model, so --world=100000
// ran until the kernel killed the process. Before any scenario runs, each
// one's least memory is checked against what the process may still take
// (common/cli.h, available_memory()): world x (kRankFloorBytes + 8 bytes
// per element of the replica's flat buffer: its parameters and gradients,
// in host memory unless --device=cuda). That buffer is padded to at least
// 16 elements per rank (Note [Padding rule] in zero/flat_layout.h), so a
// small model's replica grows with the world: the MLP's is 64,000 elements
// at 4000 ranks. The floor is below every measurement (the MLP at stage 0,
// one window, by /usr/bin/time's maximum RSS, AMD EPYC, 2026-12-02: 0.621
// MiB per rank at 1000 ranks against a floor of 0.497, 0.813 at 2000
// against 0.619, 1.30 at 4000 against 0.863; the use grows by about 16
// bytes per padded element, the replica, its gradients and Adam's two
// moments), so only a world that cannot fit is refused; one that passes
// can still run out.
constexpr uint64_t kRankFloorBytes = uint64_t{384} << 10;

void check_worlds_fit_in_memory(const std::vector<Scenario>& scenarios) {
  const std::optional<AvailableMemory> available = available_memory();
  if (!available) return;  // not Linux: nothing to compare with
  std::map<std::pair<std::string, int>, uint64_t> params;  // per model
  for (const Scenario& s : scenarios) {
    auto [it, fresh] = params.try_emplace({s.model, s.model_scale}, 0);
    if (fresh)
      for (const auto& p :
           make_task(s.model, s.model_scale)->make_model(s.seed)->parameters())
        it->second += static_cast<uint64_t>(p.numel());
    const uint64_t n = it->second;
    const bool host = s.device != "cuda";
    // The floor per rank in a world of w ranks (it grows with w).
    const auto per_rank_at = [&](int w) {
      return kRankFloorBytes + (host ? 8 * padded_numel(n, w) : 0);
    };
    const auto fits = [&](int w) {
      return static_cast<uint64_t>(w) <= available->bytes / per_rank_at(w);
    };
    if (fits(s.world_size)) continue;
    // The largest world that fits at the floor (fits is monotone).
    int most = 0;
    for (int lo = 1, hi = s.world_size - 1; lo <= hi;) {
      const int mid = lo + (hi - lo) / 2;
      if (fits(mid)) {
        most = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    const uint64_t flat = padded_numel(n, s.world_size);
    const uint64_t per_rank = per_rank_at(s.world_size);
    const uint64_t world = static_cast<uint64_t>(s.world_size);
    std::ostringstream m;
    m.precision(3);
    const double mib = 1024.0 * 1024.0, gib = mib * 1024.0;
    m << "--world=" << s.world_size << ": the scenario stage=" << s.stage
      << " world=" << s.world_size << " model=" << s.model << " needs at least "
      << static_cast<double>(world) * per_rank / gib << " GiB (" << world
      << " simulated ranks x " << static_cast<double>(per_rank) / mib
      << " MiB: each rank's thread and engine, and its replica of the "
         "model's "
      << it->second << " parameters with their gradients, padded to " << flat
      << " elements for " << s.world_size << " ranks), and this process "
      << "may take " << static_cast<double>(available->bytes) / gib << " GiB ("
      << available->source << "). Fix: simulate fewer ranks: "
      << "even at this floor no more than " << most
      << " fit, and measured use is higher (for the MLP, 0.62 MiB per "
         "rank at 1000 ranks, 1.3 at 4000); for thousands of ranks use "
         "--simulate-scale (shape only: no rank holds a model)";
    throw FlagError(m.str());
  }
}

int main_impl(int argc, char** argv) {
  const HarnessFlags parsed = parse_harness_flags(argc, argv);
  if (parsed.help) {
    std::cout << kHarnessUsage;
    return 0;
  }
  if (parsed.mode == HarnessMode::kScale) return run_scale_mode(parsed);
  check_engine_device(parsed.device);
  if (parsed.device == "cuda") use_deterministic_cuda();

  const BaseConfig base = load_base_config(parsed);
  const HarnessFlags f = with_file_defaults(parsed, base);
  const bool plan = f.default_matrix && f.mode == HarnessMode::kParity;
  set_compute_threads(f.threads);
  print_run_header(f, plan);
  // Once per run: what the file's "auto" became (Note [Trainer values]).
  if (!f.config_path.empty()) {
    std::cerr << "  trainer values: " << to_string(base.trainer) << "\n";
    const std::string filled = filled_auto_note(base.config);
    if (!filled.empty()) std::cerr << "  " << filled << "\n";
  }
  // Each distinct library message once (every run's Engine would repeat
  // the ignored-keys note); --json also records them per scenario.
  std::set<std::string> logged;
  const ScopedLogSink sink([&logged](LogLevel level, const std::string& m) {
    if (logged.insert(m).second)
      std::cerr << "  zerostep " << to_string(level) << ": " << m << "\n";
  });

  // A temporary nvme directory, removed at exit.
  std::string nvme_path = f.nvme_path;
  std::unique_ptr<TempDir> temp_nvme;
  const bool any_nvme =
      plan || std::find(f.offloads.begin(), f.offloads.end(),
                        OffloadDevice::kNvme) != f.offloads.end();
  if (any_nvme && nvme_path.empty()) {
    temp_nvme = std::make_unique<TempDir>("zerostep-nvme");
    nvme_path = temp_nvme->path();
  }
  if (any_nvme) std::cerr << "  nvme_path=" << nvme_path << "\n";

  const std::vector<Scenario> scenarios =
      plan ? default_plan(f, nvme_path) : build_scenarios(f, base, nvme_path);
  if (scenarios.empty())
    throw FlagError(
        "the flags leave no scenario to run: --offload skips stage 0, "
        "which has no optimizer state to offload; add stages 1-3 to "
        "--stages or none to --offload");
  for (const Scenario& s : scenarios)
    if (const std::string why = device_problem(s); !why.empty())
      throw FlagError("--device=" + f.device + ": " + why);
  check_worlds_fit_in_memory(scenarios);
  if (f.device == "cuda")
    std::cerr << "  device=cuda: models, data and ZeRO state on cuda:0 (with "
                 "--offload: the state on the host); reference runs on the "
                 "CPU; the no-offload twin is not run (offload_compared "
                 "false)\n";
  switch (f.mode) {
    case HarnessMode::kFaults:
      return run_faults_mode(f, scenarios);
    case HarnessMode::kSwarm:
      return run_swarm_mode(f, scenarios);
    case HarnessMode::kParity:
    case HarnessMode::kScale:
      break;
  }
  return run_parity_mode(f, scenarios);
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::main_impl(argc, argv);
  } catch (const zerostep::FlagError& e) {
    std::cerr << "harness: " << e.what() << "\n\n" << zerostep::kHarnessUsage;
    return 2;
  } catch (const zerostep::Error& e) {
    std::cerr << "harness: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    // LibTorch's c10::Error (a failed allocation: --world or --model-scale
    // beyond this machine's memory), std::bad_alloc.
    std::cerr << "harness: failed: " << zerostep::message_without_backtrace(e)
              << "\n";
    return 1;
  }
}
