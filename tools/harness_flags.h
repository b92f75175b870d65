// The harness's command line (tools/harness.cc): every flag, its default,
// and one parse function that checks them all. Torch-free.
//
// Thread safety: free functions over values.
#ifndef ZEROSTEP_TOOLS_HARNESS_FLAGS_H_
#define ZEROSTEP_TOOLS_HARNESS_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "precision/precision.h"
#include "scale/scale_sim.h"

namespace zerostep {

// The usage text `--help` prints (and every FlagError after its message).
extern const char* const kHarnessUsage;

// A command line the harness cannot run: the message names the flag, the
// value and the rule. The harness prints "harness: <what>", a blank line
// and kHarnessUsage, and exits with status 2.
class FlagError : public UsageError {
 public:
  using UsageError::UsageError;
};

// What the harness runs.
enum class HarnessMode {
  kParity,  // the managed/unmanaged parity matrix (the default)
  kFaults,  // --faults: those faults injected into every scenario
  kSwarm,   // --swarm=N: N fault mixes per scenario, drawn from seeds
  kScale,   // --simulate-scale: the shape-only scale mode
};

struct HarnessFlags {
  // --help / -h: print kHarnessUsage and exit 0. Parsing stops there: the
  // flags after it are not read, the other fields are not checked.
  bool help = false;
  // Set by --faults, --swarm (> 0) or --simulate-scale. Default kParity.
  HarnessMode mode = HarnessMode::kParity;

  // True when no flag that shapes the parity matrix was given (only
  // --json, --seed, --threads, --model, --model-scale, --backend, --device,
  // --nvme-path, --managed): the parity mode then runs the built-in default
  // plan (tools/harness.cc, default_plan) instead of the cross product of
  // the fields below.
  bool default_matrix = true;

  // --stages: ZeRO stages to run, each in 0..3. Default 0,1,2,3 (with
  // --config: the file's stage).
  std::vector<int> stages = {0, 1, 2, 3};
  bool stages_given = false;
  // --world: simulated world sizes, each >= 1. Default 1,2,4.
  std::vector<int> worlds = {1, 2, 4};
  // --backwards: backward() calls per step as given. Default 4.
  std::vector<int> backwards = {4};
  // --steps: steps per scenario, >= 1. Default 3 (unset: steps_given false).
  int steps = 3;
  bool steps_given = false;
  // Derived (not in scale mode): N per step, one entry per step: --backwards
  // when it lists several (then --steps, if given, must be its length),
  // else its one value repeated --steps times.
  std::vector<int> per_step;
  // --scaling: gradient_accumulation_scaling modes. Default configured,
  // per_step_count, none.
  std::vector<GradAccumScaling> scalings = {GradAccumScaling::kConfigured,
                                            GradAccumScaling::kPerStepCount,
                                            GradAccumScaling::kNone};
  // --model: "mlp" or "gpt" (a scale preset in scale mode). Default "mlp";
  // model_given says whether it was set (scale mode defaults to "7B").
  std::string model = "mlp";
  bool model_given = false;
  // --backend: "sim" or "gloo". Default "sim".
  std::string backend = "sim";
  // --device: "cpu" or "cuda" (checked by runtime's check_engine_device
  // before anything runs). Default "cpu".
  std::string device = "cpu";
  std::string kernels = "host";  // --kernels
  // --model-scale: width multiplier. Default 1.
  int model_scale = 1;
  // --micro-batch: samples per backward per rank, >= 1. Default 2 (1 in
  // scale mode when not given: micro_batch_given).
  int64_t micro_batch = 2;
  bool micro_batch_given = false;
  // --clip: gradient_clipping, >= 0. Default 0 (off; with --config: the
  // file's).
  double clip = 0.0;
  bool clip_given = false;
  // --dtype: training dtypes. Default fp32 (with --config: the file's).
  std::vector<Precision> dtypes = {Precision::kFp32};
  bool dtypes_given = false;
  // --overflow=W:R:B[:KIND]: empty, or {window, rank, backward} of an
  // injected fp16 overflow (needs fp16 among dtypes; checked against
  // per_step and the smallest world). Default empty.
  std::vector<int> overflow;
  // KIND: "loss" (false, the default: that micro-batch's loss is scaled
  // until every gradient overflows) or "element" (true: one gradient
  // element on that rank only; Note [Overflow in one element] in
  // parity/scenario.h).
  bool overflow_element = false;
  // --offload: optimizer offload devices. Default none (with --config: the
  // file's offload_optimizer.device).
  std::vector<OffloadDevice> offloads = {OffloadDevice::kNone};
  bool offloads_given = false;
  // --offload-param: stage 3 offloads parameters to the same device too.
  // Default false (with --config and without --offload: the file's
  // offload_param.device at stage 3).
  bool offload_param = false;
  // --nvme-path: where nvme scenarios keep their swap files. Default ""
  // (a temporary directory, removed at exit).
  std::string nvme_path;
  // --sub-group-size: elements per swap sub-group, >= 1. Default 0
  // (DeepSpeed's 1e9).
  int64_t sub_group_size = 0;
  // --seed: run seed. Default 1.
  uint64_t seed = 1;
  // --config: a ds_config JSON file as every scenario's base. Default ""
  // (the built-in config).
  std::string config_path;
  // --threads: compute threads per rank, >= 1. Default 1.
  int threads = 1;
  // --json: one JSON object per scenario per line. Default false (a table).
  bool json = false;
  // --overlap-comm: overlap_comm for stage >= 2 scenarios. Default false.
  bool overlap_comm = false;
  // --reduce-once-per-step: zero_optimization.reduce_once_per_step for
  // stage >= 2 scenarios. Default false.
  bool reduce_once_per_step = false;
  // --gather-once-per-step: zero_optimization.gather_once_per_step for
  // stage 3 scenarios, and the schedule's with --simulate-scale. Default
  // false.
  bool gather_once_per_step = false;
  // --reduce-bucket-size / --allgather-bucket-size: elements. Default 0
  // (the config's value).
  int64_t reduce_bucket_size = 0;
  int64_t allgather_bucket_size = 0;
  // --persistence-threshold: stage3_param_persistence_threshold. Default -1
  // (0 with the built-in config, the --config file's value otherwise).
  int64_t persistence_threshold = -1;
  // --max-reuse-distance: stage3_max_reuse_distance of --simulate-scale's
  // schedule. Default -1 (DeepSpeed's 1e9).
  int64_t max_reuse_distance = -1;
  // --faults: the fault list (sim/faults.h), parsed when the run starts.
  // Default "" (mode kFaults says it was given, even empty).
  std::string faults;
  // --swarm: fault mixes per scenario, >= 0. Default 0.
  int swarm = 0;
  // --managed: "both", "true" or "false". Default "both".
  std::string managed = "both";
  // Derived: the accumulation modes to run, unmanaged (false) first. In
  // scale mode exactly one: false unless --managed=true.
  std::vector<bool> managed_modes;
  // --seq-len: tokens per sample (scale mode), > 0. Default 4096.
  double seq_len = kPresetSequenceLength;
  // Scale mode. The cost model flags (--alpha, --gamma, --ranks-per-node,
  // --intra-node-bw, --inter-node-bw, --flops, --memory-bw; each > 0) set
  // scale.cost, default CostModel's. In scale mode the parse also sets the
  // schedule from --backwards (its first value), --overlap-comm and the
  // bucket and persistence flags when given, and tokens_per_micro_batch =
  // seq_len * micro-batch (1 unless given).
  ScaleOptions scale;
};

// Parses argv[1..argc) into HarnessFlags and checks every rule that needs
// only the flags (not the --config file, not the fault list). Throws
// FlagError on the first problem, in command-line order for the flags'
// own syntax, then the cross-flag rules.
HarnessFlags parse_harness_flags(int argc, const char* const* argv);

}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_HARNESS_FLAGS_H_
