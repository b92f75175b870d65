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
#include <filesystem>
#include <cstring>
#include <memory>
#include <chrono>
#include <nlohmann/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/config.h"
#include "parity/fault_run.h"
#include "parity/scenario.h"
#include "runtime/runtime_info.h"
#include "scale/scale_sim.h"
#include "sim/cost_model.h"
#include "sim/faults.h"

namespace zerostep {
namespace {

constexpr const char* kUsage = R"(usage: harness [flags]
  --stages=0,1,2,3      ZeRO stages to run
  --world=1,2,4         simulated world sizes
  --backwards=4         N backward() calls per step; a list (2,5,3) gives one
                        N per step and sets --steps to its length
  --steps=K             steps per scenario (default 3; repeats a single N)
  --scaling=LIST        configured,per_step_count,none (default: all three)
  --model=mlp|gpt       built-in model (default mlp)
  --backend=sim|gloo    simulator (default) or real Gloo over loopback TCP
  --model-scale=S       width multiplier (default 1)
  --micro-batch=B       samples per backward per rank (default 2)
  --clip=C              gradient_clipping (default 0 = off)
  --dtype=LIST          fp32,bf16,fp16 training dtypes (default fp32)
  --offload=LIST        none,cpu,nvme optimizer offload (default none; stage
                        0 has none, so stage-0 scenarios run only with none)
  --offload-param       stage 3: offload parameters to the same device too
  --nvme-path=DIR       where nvme scenarios keep their swap files (default:
                        a new directory under $TMPDIR, removed at exit)
  --sub-group-size=E    zero_optimization.sub_group_size: elements per swap
                        sub-group (default DeepSpeed's 1e9)
  --overflow=W:R:B      fp16 scenarios: inject an overflow into backward B
                        (0-based) of rank R in window W; that update must be
                        skipped on every rank
  --overlap-comm        zero_optimization.overlap_comm for stage >= 2
                        scenarios (stages 0/1 run without it)
  --reduce-bucket-size=E   elements per reduce-scatter bucket (stage 2)
  --allgather-bucket-size=E  elements per all-gather (stage 2)
  --persistence-threshold=E  stage3_param_persistence_threshold (default 0
                        with the built-in config, so every block of the
                        small built-in models is partitioned; the
                        --config file's value otherwise)
  --seed=S              run seed (default 1)
  --config=FILE         a ds_config JSON as the base of every scenario
  --threads=T           compute threads per rank (default 1)
  --json                one JSON object per scenario per line
  --help

fault scenarios (sim only; Note [Fault contract] in parity/fault_run.h):
  --faults=LIST         inject these faults into every scenario, e.g.
                        crash:2@7,straggle:1@3x2:0.5,mismatch:0@4:dtype,
                        lost:3@9,timeout:60 (sim/faults.h); each run is
                        checked: a CommError on every rank naming the fault,
                        no partial update, bounded virtual time
  --swarm=N             N fault mixes per scenario, drawn from seeds
                        --seed .. --seed+N-1 (the seed also seeds the run)
  --managed=both|true|false  accumulation modes to run (default both)

scale mode (shape-only; scale/scale_sim.h):
  --simulate-scale      time one window of each (stage, world) for a model
                        preset (--model=1.3B|7B|13B|70B, default 7B) with
                        data-free collectives and symmetric ranks; prints
                        virtual step time, exposed communication, bytes per
                        rank (per collective with --json) and memory per rank
  --seq-len=T           tokens per sample (default 4096); a micro-batch is
                        --micro-batch samples (default 1 in this mode)
  cost model (Note [Cost model] in sim/cost_model.h; defaults in brackets):
  --alpha=S [5e-06]  --gamma=S_PER_BYTE [2.5e-12]  --ranks-per-node=R [8]
  --intra-node-bw=BYTES_PER_S [1.5e11]  --inter-node-bw=BYTES_PER_S [2.5e10]
  --flops=FLOP_PER_S [4e14]  --memory-bw=BYTES_PER_S [2e12]
)";

// mkdtemp under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string t = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix +
                    "-XXXXXX";
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

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "harness: " << msg << "\n\n" << kUsage;
  std::exit(2);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> int_list(const std::string& flag, const std::string& v) {
  std::vector<int> out;
  for (const std::string& s : split(v)) {
    char* end = nullptr;
    long x = std::strtol(s.c_str(), &end, 10);
    if (end == s.c_str() || *end != '\0')
      usage_error("--" + flag + "=" + v + ": '" + s + "' is not an integer");
    out.push_back(static_cast<int>(x));
  }
  if (out.empty()) usage_error("--" + flag + " needs at least one value");
  return out;
}

double parse_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0')
    usage_error("--" + flag + "=" + v + ": not a number");
  return x;
}

uint64_t parse_u64(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0')
    usage_error("--" + flag + "=" + v + ": not a non-negative integer");
  return x;
}

double parse_positive(const std::string& flag, const std::string& v) {
  const double x = parse_double(flag, v);
  if (!(x > 0)) usage_error("--" + flag + "=" + v + ": must be > 0");
  return x;
}

GradAccumScaling parse_scaling(const std::string& s) {
  if (auto mode = grad_accum_scaling_from_string(s)) return *mode;
  usage_error("--scaling: '" + s +
              "' is not one of configured, per_step_count, none");
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// --simulate-scale: one line (or JSON object) per (stage, world).
int run_scale(const std::string& model_name, const std::vector<int>& stages,
              const std::vector<int>& worlds, const ScaleOptions& base,
              bool managed, bool as_json) {
  const ModelShape model = model_preset(model_name);
  std::cerr << "zerostep harness --simulate-scale: model=" << model_name
            << " params=" << model.numel() << " backwards="
            << base.schedule.backwards
            << " tokens_per_micro_batch=" << base.tokens_per_micro_batch
            << " managed=" << (managed ? "true" : "false")
            << " overlap_comm=" << (base.schedule.overlap_comm ? "on" : "off")
            << "\n  cost: " << base.cost.to_string() << "\n";
  if (!as_json)
    std::printf("%-5s %-6s %-12s %-12s %-12s %-12s %-10s %-14s %-12s %-12s "
                "%s\n",
                "stage", "world", "step_s", "compute_s", "comm_s",
                "exposed_s", "exposed%", "bytes/rank", "mem_rest_GB",
                "mem_peak_GB", "wall_ms");
  for (int stage : stages) {
    for (int w : worlds) {
      ScaleOptions o = base;
      o.schedule.stage = stage;
      o.schedule.world_size = w;
      o.schedule.managed = managed;
      const auto t0 = std::chrono::steady_clock::now();
      const ScaleReport r = simulate_scale(model, o);
      const double wall_ms = std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - t0)
                                 .count();
      const MemoryStats& m = r.memory;
      const double rest = static_cast<double>(m.param_bytes + m.grad_bytes +
                                              m.optimizer_state_bytes +
                                              m.rollback_bytes) / 1e9;
      if (as_json) {
        nlohmann::json j;
        j["model"] = model_name;
        j["params"] = r.params;
        j["stage"] = stage;
        j["world"] = w;
        j["backwards"] = o.schedule.backwards;
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
                       {"peak_bytes", m.peak_bytes}};
        j["wall_ms"] = wall_ms;
        std::cout << j.dump() << "\n";
      } else {
        std::printf("%-5d %-6d %-12.6g %-12.6g %-12.6g %-12.6g %-10.1f "
                    "%-14llu %-12.3f %-12.3f %.1f\n",
                    stage, w, r.step_s, r.compute_s, r.comm_s,
                    r.exposed_comm_s, 100.0 * r.exposed_comm_s / r.step_s,
                    static_cast<unsigned long long>(r.bytes_per_rank), rest,
                    m.peak_bytes / 1e9, wall_ms);
      }
      std::cout.flush();
    }
  }
  return 0;
}

// --faults / --swarm: every scenario with faults; exit 1 if any breaks the
// fault contract.
int run_faults(const std::vector<Scenario>& scenarios,
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
          f.faults = draw_fault_options(f.scenario.seed, base.world_size,
                                        collectives);
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

int main_impl(int argc, char** argv) {
  std::vector<int> stages = {0, 1, 2, 3}, worlds = {1, 2, 4}, backwards = {4};
  int steps = 3;
  bool steps_given = false;
  std::vector<GradAccumScaling> scalings = {GradAccumScaling::kConfigured,
                                            GradAccumScaling::kPerStepCount,
                                            GradAccumScaling::kNone};
  std::string model = "mlp", config_path, backend = "sim";
  int model_scale = 1, threads = 1;
  int64_t micro = 2;
  double clip = 0.0;
  std::vector<Precision> dtypes = {Precision::kFp32};
  std::vector<int> overflow;  // window, rank, backward
  std::vector<OffloadDevice> offloads = {OffloadDevice::kNone};
  bool offload_param = false;
  std::string nvme_path;
  int64_t sub_group_size = 0;
  uint64_t seed = 1;
  bool as_json = false, overlap = false;
  int64_t reduce_bucket = 0, allgather_bucket = 0, persistence = -1;
  bool model_given = false, micro_given = false, simulate = false;
  std::string faults_text, managed_sel = "both";
  bool faults_given = false;
  int swarm = 0;
  ScaleOptions scale;
  double seq_len = kPresetSequenceLength;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--json") {
      as_json = true;
      continue;
    }
    if (a == "--overlap-comm") {
      overlap = true;
      continue;
    }
    if (a == "--offload-param") {
      offload_param = true;
      continue;
    }
    if (a == "--simulate-scale") {
      simulate = true;
      continue;
    }
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos)
      usage_error("unrecognised argument '" + a + "'");
    const std::string key = a.substr(2, eq - 2), v = a.substr(eq + 1);
    if (key == "stages") stages = int_list(key, v);
    else if (key == "world") worlds = int_list(key, v);
    else if (key == "backwards") backwards = int_list(key, v);
    else if (key == "steps") { steps = int_list(key, v).front(); steps_given = true; }
    else if (key == "scaling") {
      scalings.clear();
      for (const std::string& s : split(v)) scalings.push_back(parse_scaling(s));
    } else if (key == "model") { model = v; model_given = true; }
    else if (key == "faults") { faults_text = v; faults_given = true; }
    else if (key == "swarm") swarm = int_list(key, v).front();
    else if (key == "managed") {
      if (v != "both" && v != "true" && v != "false")
        usage_error("--managed=" + v + ": not one of both, true, false");
      managed_sel = v;
    }
    else if (key == "seq-len") seq_len = parse_positive(key, v);
    else if (key == "alpha") scale.cost.alpha_s = parse_positive(key, v);
    else if (key == "gamma") scale.cost.gamma_s_per_byte = parse_positive(key, v);
    else if (key == "ranks-per-node")
      scale.cost.ranks_per_node = static_cast<int>(parse_positive(key, v));
    else if (key == "intra-node-bw")
      scale.cost.intra_node_bytes_per_s = parse_positive(key, v);
    else if (key == "inter-node-bw")
      scale.cost.inter_node_bytes_per_s = parse_positive(key, v);
    else if (key == "flops") scale.cost.flops_per_s = parse_positive(key, v);
    else if (key == "memory-bw")
      scale.cost.memory_bytes_per_s = parse_positive(key, v);
    else if (key == "backend") {
      if (v != "sim" && v != "gloo")
        usage_error("--backend=" + v + ": not one of sim, gloo");
      backend = v;
    }
    else if (key == "model-scale") model_scale = int_list(key, v).front();
    else if (key == "micro-batch") { micro = int_list(key, v).front(); micro_given = true; }
    else if (key == "clip") clip = parse_double(key, v);
    else if (key == "dtype") {
      dtypes.clear();
      for (const std::string& d : split(v)) {
        auto p = precision_from_string(d);
        if (!p) usage_error("--dtype: '" + d + "' is not one of fp32, bf16, fp16");
        dtypes.push_back(*p);
      }
    } else if (key == "offload") {
      offloads.clear();
      for (const std::string& d : split(v)) {
        if (d == "none") offloads.push_back(OffloadDevice::kNone);
        else if (d == "cpu") offloads.push_back(OffloadDevice::kCpu);
        else if (d == "nvme") offloads.push_back(OffloadDevice::kNvme);
        else usage_error("--offload: '" + d + "' is not one of none, cpu, nvme");
      }
    } else if (key == "nvme-path") {
      nvme_path = v;
    } else if (key == "sub-group-size") {
      sub_group_size = static_cast<int64_t>(parse_u64(key, v));
      if (sub_group_size < 1) usage_error("--sub-group-size must be >= 1");
    } else if (key == "overflow") {
      std::string list = v;
      std::replace(list.begin(), list.end(), ':', ',');
      overflow = int_list(key, list);
      if (overflow.size() != 3)
        usage_error("--overflow=" + v + ": write WINDOW:RANK:BACKWARD, e.g. 1:0:2");
    }
    else if (key == "seed") seed = parse_u64(key, v);
    else if (key == "config") config_path = v;
    else if (key == "threads") threads = int_list(key, v).front();
    else if (key == "reduce-bucket-size")
      reduce_bucket = static_cast<int64_t>(parse_u64(key, v));
    else if (key == "persistence-threshold")
      persistence = static_cast<int64_t>(parse_u64(key, v));
    else if (key == "allgather-bucket-size")
      allgather_bucket = static_cast<int64_t>(parse_u64(key, v));
    else usage_error("unknown flag --" + key);
  }
  for (int s : stages)
    if (s < 0 || s > 3)
      usage_error("--stages: stage " + std::to_string(s) +
                  " is not a ZeRO stage (0, 1, 2, 3)");
  for (int w : worlds)
    if (w < 1) usage_error("--world: " + std::to_string(w) + " must be >= 1");
  if (steps < 1) usage_error("--steps must be >= 1");
  if (micro < 1) usage_error("--micro-batch must be >= 1");
  if (threads < 1) usage_error("--threads must be >= 1");
  if (clip < 0) usage_error("--clip must be >= 0 (0 = off)");
  if (!overflow.empty() &&
      std::find(dtypes.begin(), dtypes.end(), Precision::kFp16) == dtypes.end())
    usage_error("--overflow needs fp16 among --dtype (only fp16 skips "
                "overflowing windows)");
  if (swarm < 0) usage_error("--swarm must be >= 0");
  if (faults_given && swarm > 0)
    usage_error("--faults and --swarm exclude each other (--swarm draws the "
                "faults from the seed)");
  std::vector<bool> modes;
  if (managed_sel != "true") modes.push_back(false);
  if (managed_sel != "false") modes.push_back(true);
  if (simulate) {
    if (faults_given || swarm > 0)
      usage_error("--simulate-scale runs without faults (symmetric ranks)");
    if (modes.size() != 1) modes = {false};
    scale.schedule.backwards = backwards.front();
    scale.schedule.overlap_comm = overlap;
    if (reduce_bucket > 0) scale.schedule.reduce_bucket_size = reduce_bucket;
    if (allgather_bucket > 0)
      scale.schedule.allgather_bucket_size = allgather_bucket;
    if (persistence >= 0) scale.schedule.persistence_threshold = persistence;
    scale.tokens_per_micro_batch =
        seq_len * static_cast<double>(micro_given ? micro : 1);
    return run_scale(model_given ? model : "7B", stages, worlds, scale,
                     modes.front(), as_json);
  }
  std::vector<int> per_step;
  if (backwards.size() > 1) {
    if (steps_given && steps != static_cast<int>(backwards.size()))
      usage_error("--steps=" + std::to_string(steps) + " disagrees with the " +
                  std::to_string(backwards.size()) + " entries of --backwards");
    per_step = backwards;
  } else {
    per_step.assign(steps, backwards.front());
  }

  if (!overflow.empty()) {
    const int min_world = *std::min_element(worlds.begin(), worlds.end());
    if (overflow[0] < 0 || overflow[0] >= static_cast<int>(per_step.size()))
      usage_error("--overflow: window " + std::to_string(overflow[0]) +
                  " is not one of the run's " +
                  std::to_string(per_step.size()) + " windows (0-based)");
    if (overflow[1] < 0 || overflow[1] >= min_world)
      usage_error("--overflow: rank " + std::to_string(overflow[1]) +
                  " does not exist in --world=" + std::to_string(min_world));
    if (overflow[2] < 0 || overflow[2] >= per_step[overflow[0]])
      usage_error("--overflow: window " + std::to_string(overflow[0]) +
                  " has " + std::to_string(per_step[overflow[0]]) +
                  " backward() calls; backward " + std::to_string(overflow[2]) +
                  " is not one of them (0-based)");
  }

  std::string base_config;
  if (!config_path.empty()) {
    // Validate the user's file exactly as the engine would, for every world.
    for (int w : worlds) load_config_file(config_path, w);
    std::ifstream in(config_path);
    std::stringstream ss;
    ss << in.rdbuf();
    base_config = ss.str();
  }

  set_compute_threads(threads);
  std::cerr << "zerostep harness: seed=" << seed << " backend=" << backend
            << " stages=" << join(stages)
            << " world=" << join(worlds) << " backwards=" << join(per_step)
            << " model=" << model << " model_scale=" << model_scale
            << " micro_batch=" << micro << " clip=" << clip << " dtype=";
  for (size_t i = 0; i < dtypes.size(); ++i)
    std::cerr << (i ? "," : "") << to_string(dtypes[i]);
  if (!overflow.empty())
    std::cerr << " overflow=" << overflow[0] << ":" << overflow[1] << ":"
              << overflow[2];
  std::cerr
            << " overlap_comm=" << (overlap ? "stage>=2" : "off")
            << " reduce_bucket_size=" << reduce_bucket
            << " allgather_bucket_size=" << allgather_bucket
            << " config=" << (config_path.empty() ? "(built-in)" : config_path)
            << "\n  " << runtime_info() << "\n";

  // A temporary nvme directory, removed at exit.
  std::unique_ptr<TempDir> temp_nvme;
  const bool any_nvme = std::find(offloads.begin(), offloads.end(),
                                  OffloadDevice::kNvme) != offloads.end();
  if (any_nvme && nvme_path.empty()) {
    temp_nvme = std::make_unique<TempDir>("zerostep-nvme");
    nvme_path = temp_nvme->path();
  }
  if (any_nvme) std::cerr << "  nvme_path=" << nvme_path << "\n";

  std::vector<Scenario> scenarios;
  for (OffloadDevice offload : offloads)
  for (Precision dtype : dtypes)
  for (int stage : stages)
    for (int w : worlds)
      for (GradAccumScaling sc : scalings) {
        // Optimizer offload partitions the optimizer state: stages 1-3.
        if (stage == 0 && offload != OffloadDevice::kNone) continue;
        Scenario s;
        s.dtype = dtype;
        s.offload = offload;
        if (stage == 3 && offload_param) s.offload_param = offload;
        s.nvme_path = nvme_path;
        s.sub_group_size = sub_group_size;
        if (dtype == Precision::kFp16 && !overflow.empty()) {
          s.overflow_window = overflow[0];
          s.overflow_rank = overflow[1];
          s.overflow_backward = overflow[2];
        }
        s.stage = stage;
        s.world_size = w;
        s.backwards = per_step;
        s.scaling = sc;
        s.model = model;
        s.backend = backend;
        s.model_scale = model_scale;
        s.seed = seed;
        s.micro_batch = micro;
        s.gradient_clipping = clip;
        s.overlap_comm = overlap && stage >= 2;
        s.reduce_bucket_size = reduce_bucket;
        s.allgather_bucket_size = allgather_bucket;
        s.persistence_threshold =
            persistence >= 0 ? persistence : (config_path.empty() ? 0 : -1);
        s.base_config_json = base_config;
        scenarios.push_back(s);
      }

  if (faults_given || swarm > 0) {
    if (backend != "sim") usage_error("fault scenarios run on --backend=sim");
    std::cerr << "  fault runs: "
              << (faults_given ? "faults=" + faults_text
                               : "swarm=" + std::to_string(swarm))
              << " managed=" << managed_sel << "\n";
    if (faults_given) {
      const FaultOptions fixed = parse_fault_options(faults_text);
      return run_faults(scenarios, modes, &fixed, 0, as_json);
    }
    return run_faults(scenarios, modes, nullptr, swarm, as_json);
  }

  if (!as_json) {
    std::printf(
        "%-7s %-5s %-5s %-5s %-15s %-7s %-12s %-12s %-14s %-14s %-11s %-11s "
        "%-16s %s\n",
        "offload", "dtype", "stage", "world", "scaling", "bitwise", "max_abs_diff", "ref_rel_l2",
        "bytes_managed", "bytes_unmgd", "mem_rest", "mem_peak", "digest", "ok");
  }
  int failed = 0;
  for (size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    auto t0 = std::chrono::steady_clock::now();
    ScenarioResult r = run_scenario(s);
    const double secs = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
    std::cerr << "[" << (i + 1) << "/" << scenarios.size() << "] offload="
              << to_string(s.offload) << " " << to_string(s.dtype) << " stage="
              << s.stage << " world=" << s.world_size
              << " scaling=" << to_string(s.scaling) << " "
              << (r.ok ? "ok" : "FAILED") << " (" << secs << " s)\n";
    if (as_json) {
      std::cout << to_json_line(r) << "\n";
    } else {
      std::printf(
          "%-7s %-5s %-5d %-5d %-15s %-7s %-12.3g %-12.3g %-14llu %-14llu "
          "%-11zu %-11zu %-16s %s\n",
          to_string(s.offload), to_string(s.dtype), s.stage, s.world_size, to_string(s.scaling),
          r.bitwise_equal ? "yes" : "NO", r.max_abs_diff, r.ref_rel_l2_diff,
          static_cast<unsigned long long>(r.managed.comm_bytes),
          static_cast<unsigned long long>(r.unmanaged.comm_bytes),
          r.unmanaged.memory_rest_bytes, r.unmanaged.memory_peak_bytes,
          r.unmanaged.digest.c_str(), r.ok ? "ok" : "FAILED");
    }
    std::cout.flush();
    if (!r.ok) {
      ++failed;
      for (const std::string& f : r.failures)
        std::cerr << "    failure: " << f << "\n";
    }
  }
  std::cerr << (scenarios.size() - failed) << " of " << scenarios.size()
            << " scenarios ok (seed=" << seed << ")\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::main_impl(argc, argv);
  } catch (const zerostep::Error& e) {
    std::cerr << "harness: " << e.what() << "\n";
    return 2;
  }
}
