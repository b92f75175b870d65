#include "tools/harness_flags.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <sstream>

#include "common/cli.h"

namespace zerostep {

const char* const kHarnessUsage = R"(usage: harness [flags]
  --stages=0,1,2,3      ZeRO stages to run
  --world=1,2,4         simulated world sizes (each rank a thread holding a
                        model replica; a world that cannot fit in memory
                        is refused before it starts)
  --backwards=4         N backward() calls per step; a list (2,5,3) gives one
                        N per step and sets --steps to its length
  --steps=K             steps per scenario (default 3; repeats a single N)
  --scaling=LIST        configured,per_step_count,none (default: all three)
  --model=mlp|gpt       built-in model (default mlp)
  --backend=sim|gloo    simulator (default) or real Gloo over loopback TCP
  --device=cpu|cuda     where the ranks' models and data live (default
                        cpu). cuda needs a device and a CUDA LibTorch
                        (else it fails at once, naming why); the engine
                        on the device (or --offload=cpu at stages 1-2);
                        no --overlap-comm at stage 2 with several ranks
                        (they share one autograd thread on the device)
  --kernels=host|torch  the kernels of a CPU model's stage: the host's
                        (default) or LibTorch's ops posing as a device's,
                        which runs the engine's device path (device
                        buffers, staged collectives) on the CPU
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
  --overflow=W:R:B[:KIND]  fp16 scenarios: inject an overflow into backward
                        B (0-based) of rank R in window W; that update must
                        be skipped on every rank. KIND loss (the default):
                        that micro-batch's loss overflows, so every gradient
                        does; element: one gradient element on rank R only
                        (Note [Overflow in one element], parity/scenario.h)
  --overlap-comm        zero_optimization.overlap_comm for stage >= 2
                        scenarios (stages 0/1 run without it)
  --reduce-once-per-step   zero_optimization.reduce_once_per_step for stage
                        >= 2 scenarios: reduce each window once, in step()
  --gather-once-per-step   zero_optimization.gather_once_per_step for stage
                        3 scenarios (and --simulate-scale): each block
                        all-gathered once per step
  --reduce-bucket-size=E   elements per reduce-scatter bucket (stage 2)
  --allgather-bucket-size=E  elements per all-gather (stage 2)
  --persistence-threshold=E  stage3_param_persistence_threshold (default 0
                        with the built-in config, so every block of the
                        small built-in models is partitioned; the
                        --config file's value otherwise)
  --max-reuse-distance=E   stage3_max_reuse_distance for --simulate-scale
                        (default DeepSpeed's 1e9; 0: every block gathered
                        again for its backward). Parity runs take it from
                        the --config file
  --seed=S              run seed (default 1)
  --config=FILE         a ds_config JSON as the base of every scenario;
                        its "auto" filled with the harness's trainer values
                        (printed: the flags, the model's hidden size), as
                        the Hugging Face Trainer fills them
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

namespace {

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
    int64_t x = 0;
    const NumberText r = read_int(s, &x);
    if (r == NumberText::kNotANumber)
      throw FlagError("--" + flag + "=" + v + ": '" + s +
                      "' is not an integer");
    if (r == NumberText::kOutOfRange || x < INT_MIN || x > INT_MAX)
      throw FlagError("--" + flag + "=" + v + ": '" + s +
                      "' is out of range (at most " + std::to_string(INT_MAX) +
                      ")");
    out.push_back(static_cast<int>(x));
  }
  if (out.empty()) throw FlagError("--" + flag + " needs at least one value");
  return out;
}

// A flag that takes one integer, not a list ("--micro-batch=2,3" was read
// as 2).
int single_int(const std::string& flag, const std::string& v) {
  const std::vector<int> x = int_list(flag, v);
  if (x.size() != 1)
    throw FlagError("--" + flag + "=" + v + ": takes one integer, not a list");
  return x.front();
}

// A finite number ("nan", "inf" and trailing text are refused).
double parse_double(const std::string& flag, const std::string& v) {
  double x = 0;
  if (read_double(v, &x) != NumberText::kOk)
    throw FlagError("--" + flag + "=" + v + ": not a number");
  return x;
}

// A non-negative integer that fits the int64_t fields it sets (at most
// 2^63 - 1; strtoull read "-1" as 2^64 - 1, which then wrapped to -1).
int64_t parse_count(const std::string& flag, const std::string& v) {
  uint64_t x = 0;
  const NumberText r = read_uint64(v, &x);
  if (r == NumberText::kNotANumber)
    throw FlagError("--" + flag + "=" + v + ": not a non-negative integer");
  if (r == NumberText::kOutOfRange || x > static_cast<uint64_t>(INT64_MAX))
    throw FlagError("--" + flag + "=" + v + ": out of range (at most " +
                    std::to_string(INT64_MAX) + ")");
  return static_cast<int64_t>(x);
}

double parse_positive(const std::string& flag, const std::string& v) {
  const double x = parse_double(flag, v);
  if (!(x > 0)) throw FlagError("--" + flag + "=" + v + ": must be > 0");
  return x;
}

GradAccumScaling parse_scaling(const std::string& s) {
  if (auto mode = grad_accum_scaling_from_string(s)) return *mode;
  throw FlagError("--scaling: '" + s +
                  "' is not one of configured, per_step_count, none");
}

}  // namespace

HarnessFlags parse_harness_flags(int argc, const char* const* argv) {
  HarnessFlags f;
  bool faults_given = false, simulate = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      f.help = true;
      return f;
    }
    if (a == "--json") {
      f.json = true;
      continue;
    }
    if (a == "--overlap-comm") {
      f.overlap_comm = true;
      f.default_matrix = false;
      continue;
    }
    if (a == "--reduce-once-per-step") {
      f.reduce_once_per_step = true;
      f.default_matrix = false;
      continue;
    }
    if (a == "--gather-once-per-step") {
      f.gather_once_per_step = true;
      f.default_matrix = false;
      continue;
    }
    if (a == "--offload-param") {
      f.offload_param = true;
      f.default_matrix = false;
      continue;
    }
    if (a == "--simulate-scale") {
      simulate = true;
      continue;
    }
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos)
      throw FlagError("unrecognised argument '" + a + "'");
    const std::string key = a.substr(2, eq - 2), v = a.substr(eq + 1);
    static const char* const kMatrixFree[] = {
        "json",    "seed",        "threads",   "model",   "backend",
        "device",  "model-scale", "nvme-path", "managed", "kernels"};
    if (std::find_if(std::begin(kMatrixFree), std::end(kMatrixFree),
                     [&](const char* k) { return key == k; }) ==
        std::end(kMatrixFree))
      f.default_matrix = false;
    if (key == "stages") {
      f.stages = int_list(key, v);
      f.stages_given = true;
    } else if (key == "world") {
      f.worlds = int_list(key, v);
    } else if (key == "backwards") {
      f.backwards = int_list(key, v);
    } else if (key == "steps") {
      f.steps = single_int(key, v);
      f.steps_given = true;
    } else if (key == "scaling") {
      f.scalings.clear();
      for (const std::string& s : split(v))
        f.scalings.push_back(parse_scaling(s));
    } else if (key == "model") {
      f.model = v;
      f.model_given = true;
    } else if (key == "faults") {
      f.faults = v;
      faults_given = true;
    } else if (key == "swarm") {
      f.swarm = single_int(key, v);
    } else if (key == "managed") {
      if (v != "both" && v != "true" && v != "false")
        throw FlagError("--managed=" + v + ": not one of both, true, false");
      f.managed = v;
    } else if (key == "seq-len") {
      f.seq_len = parse_positive(key, v);
    } else if (key == "alpha") {
      f.scale.cost.alpha_s = parse_positive(key, v);
    } else if (key == "gamma") {
      f.scale.cost.gamma_s_per_byte = parse_positive(key, v);
    } else if (key == "ranks-per-node") {
      f.scale.cost.ranks_per_node = single_int(key, v);
      if (f.scale.cost.ranks_per_node < 1)
        throw FlagError("--ranks-per-node=" + v + ": must be >= 1");
    } else if (key == "intra-node-bw") {
      f.scale.cost.intra_node_bytes_per_s = parse_positive(key, v);
    } else if (key == "inter-node-bw") {
      f.scale.cost.inter_node_bytes_per_s = parse_positive(key, v);
    } else if (key == "flops") {
      f.scale.cost.flops_per_s = parse_positive(key, v);
    } else if (key == "memory-bw") {
      f.scale.cost.memory_bytes_per_s = parse_positive(key, v);
    } else if (key == "device") {
      if (v != "cpu" && v != "cuda")
        throw FlagError("--device=" + v + ": not one of cpu, cuda");
      f.device = v;
    } else if (key == "kernels") {
      if (v != "host" && v != "torch")
        throw FlagError("--kernels=" + v + ": not one of host, torch");
      f.kernels = v;
    } else if (key == "backend") {
      if (v != "sim" && v != "gloo")
        throw FlagError("--backend=" + v + ": not one of sim, gloo");
      f.backend = v;
    } else if (key == "model-scale") {
      f.model_scale = single_int(key, v);
    } else if (key == "micro-batch") {
      f.micro_batch = single_int(key, v);
      f.micro_batch_given = true;
    } else if (key == "clip") {
      f.clip = parse_double(key, v);
      f.clip_given = true;
    } else if (key == "dtype") {
      f.dtypes_given = true;
      f.dtypes.clear();
      for (const std::string& d : split(v)) {
        auto p = precision_from_string(d);
        if (!p)
          throw FlagError("--dtype: '" + d +
                          "' is not one of fp32, bf16, fp16");
        f.dtypes.push_back(*p);
      }
    } else if (key == "offload") {
      f.offloads_given = true;
      f.offloads.clear();
      for (const std::string& d : split(v)) {
        if (d == "none")
          f.offloads.push_back(OffloadDevice::kNone);
        else if (d == "cpu")
          f.offloads.push_back(OffloadDevice::kCpu);
        else if (d == "nvme")
          f.offloads.push_back(OffloadDevice::kNvme);
        else
          throw FlagError("--offload: '" + d +
                          "' is not one of none, cpu, nvme");
      }
    } else if (key == "nvme-path") {
      f.nvme_path = v;
    } else if (key == "sub-group-size") {
      f.sub_group_size = parse_count(key, v);
      if (f.sub_group_size < 1)
        throw FlagError("--sub-group-size must be >= 1");
    } else if (key == "overflow") {
      std::vector<std::string> parts;
      for (size_t from = 0;;) {
        const size_t at = v.find(':', from);
        parts.push_back(v.substr(from, at - from));
        if (at == std::string::npos) break;
        from = at + 1;
      }
      f.overflow_element = false;
      if (parts.size() == 4) {
        if (parts[3] != "loss" && parts[3] != "element")
          throw FlagError("--overflow=" + v + ": '" + parts[3] +
                          "' is not one of loss, element");
        f.overflow_element = parts[3] == "element";
        parts.pop_back();
      }
      if (parts.size() != 3)
        throw FlagError("--overflow=" + v +
                        ": write WINDOW:RANK:BACKWARD[:KIND], e.g. 1:0:2 or "
                        "1:0:2:element");
      f.overflow.clear();
      for (const std::string& part : parts) {
        int64_t x = 0;
        if (read_int(part, &x) != NumberText::kOk || x < INT_MIN || x > INT_MAX)
          throw FlagError("--overflow=" + v + ": '" + part +
                          "' is not an integer");
        f.overflow.push_back(static_cast<int>(x));
      }
    } else if (key == "seed") {
      uint64_t seed = 0;
      if (read_uint64(v, &seed) != NumberText::kOk)
        throw FlagError("--seed=" + v +
                        ": not a non-negative integer of at most 64 bits");
      f.seed = seed;
    } else if (key == "config") {
      f.config_path = v;
    } else if (key == "threads") {
      f.threads = single_int(key, v);
    } else if (key == "reduce-bucket-size") {
      f.reduce_bucket_size = parse_count(key, v);
    } else if (key == "persistence-threshold") {
      f.persistence_threshold = parse_count(key, v);
    } else if (key == "max-reuse-distance") {
      f.max_reuse_distance = parse_count(key, v);
    } else if (key == "allgather-bucket-size") {
      f.allgather_bucket_size = parse_count(key, v);
    } else {
      throw FlagError("unknown flag --" + key);
    }
  }
  for (int s : f.stages)
    if (s < 0 || s > 3)
      throw FlagError("--stages: stage " + std::to_string(s) +
                      " is not a ZeRO stage (0, 1, 2, 3)");
  for (int w : f.worlds)
    if (w < 1)
      throw FlagError("--world: " + std::to_string(w) + " must be >= 1");
  if (f.steps < 1) throw FlagError("--steps must be >= 1");
  if (f.micro_batch < 1) throw FlagError("--micro-batch must be >= 1");
  if (f.threads < 1) throw FlagError("--threads must be >= 1");
  if (f.clip < 0) throw FlagError("--clip must be >= 0 (0 = off)");
  // With --config and no --dtype the file's dtype decides (checked again by
  // the harness once the file is read).
  if (!f.overflow.empty() && (f.dtypes_given || f.config_path.empty()) &&
      std::find(f.dtypes.begin(), f.dtypes.end(), Precision::kFp16) ==
          f.dtypes.end())
    throw FlagError(
        "--overflow needs fp16 among --dtype (only fp16 skips "
        "overflowing windows)");
  if (f.swarm < 0) throw FlagError("--swarm must be >= 0");
  if (faults_given && f.swarm > 0)
    throw FlagError(
        "--faults and --swarm exclude each other (--swarm draws "
        "the faults from the seed)");
  if (f.managed != "true") f.managed_modes.push_back(false);
  if (f.managed != "false") f.managed_modes.push_back(true);
  if (simulate) {
    if (faults_given || f.swarm > 0)
      throw FlagError("--simulate-scale runs without faults (symmetric ranks)");
    f.mode = HarnessMode::kScale;
    if (f.managed_modes.size() != 1) f.managed_modes = {false};
    ScheduleOptions& s = f.scale.schedule;
    s.backwards = f.backwards.front();
    s.overlap_comm = f.overlap_comm;
    if (f.reduce_bucket_size > 0) s.reduce_bucket_size = f.reduce_bucket_size;
    if (f.allgather_bucket_size > 0)
      s.allgather_bucket_size = f.allgather_bucket_size;
    if (f.persistence_threshold >= 0)
      s.persistence_threshold = f.persistence_threshold;
    if (f.max_reuse_distance >= 0) s.max_reuse_distance = f.max_reuse_distance;
    s.gather_once_per_step = f.gather_once_per_step;
    f.scale.tokens_per_micro_batch =
        f.seq_len *
        static_cast<double>(f.micro_batch_given ? f.micro_batch : 1);
    return f;
  }
  if (f.max_reuse_distance >= 0)
    throw FlagError(
        "--max-reuse-distance is for --simulate-scale; a parity run takes "
        "zero_optimization.stage3_max_reuse_distance from its --config "
        "file");
  if (faults_given) f.mode = HarnessMode::kFaults;
  if (f.swarm > 0) f.mode = HarnessMode::kSwarm;

  if (f.backwards.size() > 1) {
    if (f.steps_given && f.steps != static_cast<int>(f.backwards.size()))
      throw FlagError(
          "--steps=" + std::to_string(f.steps) + " disagrees with the " +
          std::to_string(f.backwards.size()) + " entries of --backwards");
    f.per_step = f.backwards;
  } else {
    f.per_step.assign(f.steps, f.backwards.front());
  }
  if (!f.overflow.empty()) {
    const std::vector<int>& o = f.overflow;
    const int min_world = *std::min_element(f.worlds.begin(), f.worlds.end());
    if (o[0] < 0 || o[0] >= static_cast<int>(f.per_step.size()))
      throw FlagError("--overflow: window " + std::to_string(o[0]) +
                      " is not one of the run's " +
                      std::to_string(f.per_step.size()) + " windows (0-based)");
    if (o[1] < 0 || o[1] >= min_world)
      throw FlagError(
          "--overflow: rank " + std::to_string(o[1]) +
          " does not exist in --world=" + std::to_string(min_world));
    if (o[2] < 0 || o[2] >= f.per_step[o[0]])
      throw FlagError("--overflow: window " + std::to_string(o[0]) + " has " +
                      std::to_string(f.per_step[o[0]]) +
                      " backward() calls; backward " + std::to_string(o[2]) +
                      " is not one of them (0-based)");
  }
  return f;
}

}  // namespace zerostep
