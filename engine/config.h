// Config: a DeepSpeed ds_config JSON document, validated into a plain struct.
//
// Key names are DeepSpeed's. parse_config() checks the whole document and
// throws one ConfigError that lists every problem (key, value, rule, fix):
//   - unknown keys get "did you mean" (a misspelt managed_gradient_accumulation
//     must never silently keep managed mode);
//   - keys DeepSpeed knows but zerostep does not implement (flops_profiler,
//     tensorboard, ...) are accepted and listed once in Config::ignored_keys;
//   - "auto" (left by Hugging Face integrations) is rejected with the number
//     to write instead where it can be derived;
//   - train_batch_size = train_micro_batch_size_per_gpu *
//     gradient_accumulation_steps * world_size: any two of the three batch
//     keys determine the third; a mismatch is an error.
//   - fp16 and bf16 turn mixed precision on (one of them at most);
//     data_types.grad_accum_dtype picks the accumulation format.
//   - unmanaged mode (managed_gradient_accumulation = false) rejects
//     pipeline sections and overlap_comm with stage 0/1, each with its own
//     message.
// See docs/config.md for every key, its default and its effect.
//
// Thread safety: Config is a value; parse_config is reentrant.
#ifndef ZEROSTEP_ENGINE_CONFIG_H_
#define ZEROSTEP_ENGINE_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/lr_schedule.h"
#include "zero/precision.h"

namespace zerostep {

// How gradients accumulated over a window are scaled (see DESIGN.md §1).
enum class GradAccumScaling {
  kConfigured,    // backward(loss, scale_wrt_gas=true) divides by the
                  // configured gradient_accumulation_steps (DeepSpeed).
  kPerStepCount,  // step() divides the accumulated gradient by the number of
                  // backward() calls in the window.
  kNone,          // gradients are summed over the window.
};

enum class OptimizerType { kAdam, kAdamW, kSGD };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;  // "optimizer.type"
  double lr = 1e-3;                            // params.lr
  double beta1 = 0.9;                          // params.betas[0]
  double beta2 = 0.999;                        // params.betas[1]
  double eps = 1e-8;                           // params.eps
  double weight_decay = 0.0;                   // params.weight_decay
  double momentum = 0.0;                       // params.momentum (SGD)
};

enum class OffloadDevice { kNone, kCpu, kNvme };

// zero_optimization.offload_optimizer / offload_param (docs/config.md).
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;  // "none", "cpu", "nvme"
  std::string nvme_path;                        // required for "nvme"
  bool pin_memory = false;                      // accepted; see docs
  // In-memory sub-group buffers of the NVMe swapper (DeepSpeed: 4 for the
  // optimizer, 5 for parameters).
  int64_t buffer_count = 4;
};

struct ZeroConfig {
  int stage = 0;                           // zero_optimization.stage
  bool overlap_comm = false;               // zero_optimization.overlap_comm
  int64_t reduce_bucket_size = 500000000;  // elements
  int64_t allgather_bucket_size = 500000000;  // elements
  bool contiguous_gradients = true;
  // Stage 3: parameters with fewer elements stay whole on every rank.
  int64_t stage3_param_persistence_threshold = 100000;
  // Optimizer state offload (stages 1-3) and parameter offload (stage 3).
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
  // Elements per NVMe swap sub-group (DeepSpeed's default 1e9: one
  // sub-group per partition unless the partition is larger).
  int64_t sub_group_size = 1000000000;
};

// "fp16" / "bf16" (alias "bfloat16") and "data_types": zero/precision.h
// Note [Precision model], engine/loss_scaler.h Note [Loss scale schedule].
struct PrecisionConfig {
  // kBf16: bf16.enabled; kFp16: fp16.enabled; both at once is an error.
  Precision dtype = Precision::kFp32;
  // data_types.grad_accum_dtype: the window's accumulation format; fp32 or
  // the training dtype.
  Precision grad_accum_dtype = Precision::kFp32;
  // fp16 only.
  double loss_scale = 0.0;            // 0 = dynamic
  int initial_scale_power = 16;       // dynamic start: 2^power
  int64_t loss_scale_window = 1000;   // clean iterations before doubling
  int64_t hysteresis = 2;             // overflows absorbed before halving
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
};

struct Config {
  int world_size = 1;  // not a ds_config key: given to parse_config.

  int64_t train_batch_size = 0;                // derived if absent
  int64_t train_micro_batch_size_per_gpu = 0;  // derived if absent
  int64_t gradient_accumulation_steps = 0;     // derived if absent (default 1)

  bool managed_gradient_accumulation = true;
  GradAccumScaling gradient_accumulation_scaling =
      GradAccumScaling::kConfigured;

  OptimizerConfig optimizer;
  double gradient_clipping = 0.0;  // 0 = off
  // "scheduler": DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR
  // (engine/lr_schedule.h); kNone = constant optimizer lr.
  LrScheduleSpec scheduler;
  ZeroConfig zero;
  PrecisionConfig precision;
  int64_t steps_per_print = 10;

  // DeepSpeed keys present in the document that zerostep accepts but does
  // not act on, once each, in document order: top-level names
  // ("tensorboard"), nested ones dotted ("zero_optimization.sub_group_size",
  // "optimizer.params.torch_adam").
  std::vector<std::string> ignored_keys;
};

// Parses and validates `json_text` for a run of `world_size` ranks.
// Throws ConfigError listing every problem found.
Config parse_config(const std::string& json_text, int world_size);

// Reads `path` and parses it. Throws IoError naming the path if it cannot be
// read, ConfigError (same problems; message "invalid ds_config '<path>': ...")
// if it is invalid.
Config load_config_file(const std::string& path, int world_size);

const char* to_string(GradAccumScaling s);
// The mode named `name` ("configured", "per_step_count", "none"; any letter
// case), or nullopt.
std::optional<GradAccumScaling> grad_accum_scaling_from_string(
    const std::string& name);
const char* to_string(OptimizerType t);
const char* to_string(OffloadDevice d);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_CONFIG_H_
