// TrainerValues: what a trainer knows that a ds_config's "auto" stands for,
// and the pass of parse_config that fills each "auto" with it.
//
// Note [Trainer values]
// ~~~~~~~~~~~~~~~~~~~~~
// Most ds_config files in public repositories are written for the Hugging
// Face Trainer (or accelerate) and say "auto" wherever the trainer supplies
// a value. The Trainer replaces each "auto" before DeepSpeed reads the file
// (transformers' integrations/deepspeed.py, HfTrainerDeepSpeedConfig:
// trainer_config_process and trainer_config_finalize). In zerostep the
// trainer is the caller, so it passes its values to parse_config in a
// TrainerValues, and each "auto" is filled by the integration's rule
// (config/keys.h kAutoRules, printed in docs/config.md):
//   - the batch keys from micro_batch_size and gradient_accumulation_steps,
//     train_batch_size as world_size × micro × gas (the file's own micro or
//     gas where the caller gives none; gas 1 when neither does);
//   - gradient_clipping, the optimizer's lr, betas, eps and weight_decay,
//     the scheduler's warmup_max_lr, warmup_num_steps (warmup_steps when
//     > 0, else ceil(total_steps × warmup_ratio)) and total_num_steps, from
//     the fields of those names; warmup_min_lr is 0;
//   - fp16.enabled and bf16.enabled from dtype (bfloat16.enabled too: the
//     integration looks under "bf16" only, and DeepSpeed then reads the
//     "auto" it leaves in "bfloat16" as false; zerostep fills both names);
//   - from hidden_size: zero_optimization.reduce_bucket_size (hidden²)
//     and, at stage 3, stage3_prefetch_bucket_size (int(0.9 × hidden²)) and
//     stage3_param_persistence_threshold (10 × hidden). Below stage 3 the
//     integration leaves those two "auto", which DeepSpeed reads as its
//     defaults: so does zerostep (they do nothing below stage 3).
// An "auto" whose field the caller did not give stays, and the section
// that reads the key reports it: the problem names the key and the
// TrainerValues field to set (ProblemReporter::add_auto). An "auto" in a key
// the integration does not fill keeps its old meaning: an error, except
// where DeepSpeed itself reads "auto" as its default (docs/config.md).
//
// As in the integration's fill_match, a key the file writes (not "auto")
// must equal the trainer's value when the caller gives it (must_match,
// the default): a disagreement is a problem naming both. The hidden-size
// keys and warmup_min_lr are fill-only there, and so here. With must_match
// false (a front end whose own settings replace the file's, such as
// tools/harness) only "auto" is filled.
//
// Every value filled is listed in Config::filled_auto ("optimizer.params.lr
// = 0.001"), in the order of kAutoRules, and a problem the parsers find in
// a filled value says it came from "auto".
//
// Thread safety: TrainerValues is a value; fill_auto is reentrant.
#ifndef ZEROSTEP_CONFIG_TRAINER_VALUES_H_
#define ZEROSTEP_CONFIG_TRAINER_VALUES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/problems.h"
#include "precision/precision.h"

namespace zerostep {

// The trainer's values, in Hugging Face TrainingArguments' terms (its name
// in the comment when it differs). Every field is optional: an "auto" that
// needs a field the caller left unset is a ConfigError naming it. The world
// size is parse_config's own argument.
struct TrainerValues {
  // per_device_train_batch_size: samples per rank per backward.
  std::optional<int64_t> micro_batch_size;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> learning_rate;
  std::optional<double> adam_beta1;
  std::optional<double> adam_beta2;
  std::optional<double> adam_epsilon;
  std::optional<double> weight_decay;
  // gradient_clipping's value (0: off).
  std::optional<double> max_grad_norm;
  // Optimizer steps of warmup; used when > 0 (else warmup_ratio).
  std::optional<int64_t> warmup_steps;
  // The share of total_steps warmed up when warmup_steps is 0 or unset.
  std::optional<double> warmup_ratio;
  // num_training_steps: optimizer steps in the run.
  std::optional<int64_t> total_steps;
  // The training dtype: fp16 and bf16 enable those sections, fp32 neither
  // (the Trainer's fp16 / bf16 flags).
  std::optional<Precision> dtype;
  // The model's hidden size (its config's hidden_size; for a model with
  // several, the largest), for the bucket sizes.
  std::optional<int64_t> hidden_size;
  // true (the Trainer's fill_match): a value the file writes must equal
  // the trainer's, where the caller gives one. false: fill "auto" only.
  bool must_match = true;
};

// The fields that are set, as "name=value" separated by spaces, in the
// struct's order, must_match last ("micro_batch_size=2 dtype=bf16
// must_match=false"); front ends print it (tools/harness).
std::string to_string(const TrainerValues& trainer);

namespace config_auto {

// What fill_auto did.
struct FillResult {
  // "key = value", one per key filled, in kAutoRules order.
  std::vector<std::string> filled;
  // Filled key -> how ("learning_rate = 0.001"), for the parsers' problems
  // (ProblemReporter::set_filled).
  std::map<std::string, std::string> how;
  // Keys the file writes that disagree with the trainer's value.
  std::vector<ConfigProblem> mismatches;
};

// Replaces, in `doc` (parse_config's document, any JSON), every "auto" that
// a rule of Note [Trainer values] and `trainer` determine for a run of
// `world_size` ranks; removes the stage-3 sizes' "auto" below stage 3.
// Leaves every other value as it is.
FillResult fill_auto(ConfigJson* doc, const TrainerValues& trainer,
                     int world_size);

}  // namespace config_auto
}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_TRAINER_VALUES_H_
