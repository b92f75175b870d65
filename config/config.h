// Config: a DeepSpeed ds_config JSON document, validated into a plain struct.
//
// Key names are DeepSpeed's. parse_config() checks the whole document and
// throws one ConfigError that lists every problem (key, value, rule, fix):
//   - unknown keys get "did you mean" (a misspelt managed_gradient_accumulation
//     must never silently keep managed mode);
//   - keys DeepSpeed knows but zerostep does not implement are decided by
//     one table (config/keys.h Note [Key decisions]): harmless ones
//     (flops_profiler, tensorboard, ...) are accepted and listed once in
//     Config::ignored_keys; ones that change training (elasticity,
//     prescale_gradients, ...) only at their no-op value, else rejected;
//   - DeepSpeed's other names of a setting (stage3_ aliases, deprecated
//     spellings) mean what they mean there; two names with different values
//     are an error; null is the default where DeepSpeed takes it so;
//   - "auto" (left for the Hugging Face Trainer) is filled with the
//     caller's TrainerValues by the Trainer's rules (Note [Trainer values]
//     in config/trainer_values.h); an "auto" nobody filled is a problem
//     naming the TrainerValues field to set;
//   - train_batch_size = train_micro_batch_size_per_gpu *
//     gradient_accumulation_steps * world_size: any two of the three batch
//     keys determine the third; a mismatch is an error.
//   - fp16 and bf16 turn mixed precision on (one of them at most);
//     data_types.grad_accum_dtype picks the accumulation format.
//   - other frameworks' names (max_grad_norm, ...) get "did you mean" with
//     the ds_config key;
//   - unmanaged mode (managed_gradient_accumulation = false) rejects
//     pipeline sections and overlap_comm with stage 0/1, each with its own
//     message.
// See docs/config.md for every key, its default and its effect.
//
// Layout: each section has its own header with its struct and its reader
// (config/batch.h, optimizer.h, zero.h, precision.h, scheduler.h); they share
// config/problems.h (the problem reporter), config/keys.h (the key tables)
// and config/text.h (did you mean). parse_config walks the document in order
// and hands each top-level key to its section, so problems come out in
// document order, followed by the checks that need the whole document.
//
// Thread safety: Config is a value; parse_config is reentrant.
#ifndef ZEROSTEP_CONFIG_CONFIG_H_
#define ZEROSTEP_CONFIG_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/batch.h"
#include "config/optimizer.h"
#include "config/precision.h"
#include "config/scheduler.h"
#include "config/trainer_values.h"
#include "config/zero.h"

namespace zerostep {

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
  // How a window's gradients are averaged over the ranks (DeepSpeed's
  // prescale_gradients and gradient_predivide_factor; Note [Gradient
  // averaging] in zero/averaging.h). false and 1: zerostep's sum, then one
  // division by world_size. prescale_gradients: each rank's gradient
  // divided by world_size before the sum (the factor is then unused).
  // Otherwise each rank's gradient is multiplied by 1/factor before the
  // sum and the sum by factor/world_size after it.
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // "scheduler": DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR
  // (config/scheduler.h, engine/lr_schedule.h); kNone = constant optimizer
  // lr.
  LrScheduleSpec scheduler;
  ZeroConfig zero;
  PrecisionConfig precision;
  int64_t steps_per_print = 10;

  // DeepSpeed keys present in the document that zerostep accepts but does
  // not act on, once each, in document order: top-level names
  // ("tensorboard"), nested ones dotted
  // ("zero_optimization.stage3_model_persistence_threshold",
  // "optimizer.params.torch_adam"); offload_param below stage 3 as
  // "zero_optimization.offload_param".
  std::vector<std::string> ignored_keys;

  // Every "auto" parse_config filled with the caller's TrainerValues, as
  // "key = value" ("optimizer.params.lr = 0.001"), in the order of the
  // Hugging Face integration's rules (Note [Trainer values]); empty when
  // the document has no "auto" that was filled.
  std::vector<std::string> filled_auto;
};

// Arrays and objects may nest at most this deep: deeper documents are
// refused before they are parsed (copying or printing them would recurse
// that deep), whatever section they sit in.
inline constexpr size_t kMaxNestingDepth = 100;

// Parses and validates `json_text` for a run of `world_size` ranks, each
// "auto" filled from `trainer` (Note [Trainer values] in
// config/trainer_values.h). Throws ConfigError listing every problem found
// (an "auto" whose TrainerValues field is unset among them); keys and
// values are cut to kConfigProblemFieldBytes in its message
// (common/errors.h), so the message stays short whatever the input.
Config parse_config(const std::string& json_text, int world_size,
                    const TrainerValues& trainer);
// The same with no trainer values: every "auto" the Hugging Face
// integration would fill is a problem.
Config parse_config(const std::string& json_text, int world_size);

// Reads `path` and parses it. Throws IoError naming the path if it cannot be
// read, ConfigError (same problems; message "invalid ds_config '<path>': ...")
// if it is invalid.
Config load_config_file(const std::string& path, int world_size,
                        const TrainerValues& trainer);
Config load_config_file(const std::string& path, int world_size);

// One line naming the keys in `config.ignored_keys` ("ds_config keys
// accepted without effect (DeepSpeed keys zerostep does not act on; see
// docs/config.md): tensorboard, zero_optimization.round_robin_gradients"),
// or "" when there are none. The Engine logs it at construction (rank 0,
// common/log.h); the harness prints it.
std::string ignored_keys_note(const Config& config);

// One line naming the values filled in for "auto" ("ds_config \"auto\"
// filled with the trainer's values (Hugging Face's rules; see
// docs/config.md): train_batch_size = 16, optimizer.params.lr = 0.001"), or
// "" when none was. Front ends print it once (tools/harness,
// tools/trainer_server).
std::string filled_auto_note(const Config& config);

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_CONFIG_H_
