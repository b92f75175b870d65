// LrSchedule: DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR
// learning-rate schedules as a small value type (no tensors, no optimizer).
//
// Parameter names, defaults and formulas are DeepSpeed's
// (deepspeed/runtime/lr_schedules.py); the ds_config "scheduler" section
//   { "type": "WarmupLR", "params": { "warmup_num_steps": 1000, ... } }
// is read by parse_lr_schedule().
//
// Note [DeepSpeed's step index]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A DeepSpeed scheduler keeps last_batch_iteration, which starts at -1. Its
// constructor writes lr(-1) into the optimizer, and the engine calls
// scheduler.step() (last_batch_iteration += 1, then writes lr(new value)) only
// after an optimizer step that was applied; a step skipped for fp16 overflow
// does not advance the schedule. So the k-th applied update (k = 0, 1, ...)
// runs with lr(k - 1):
//   - lr(-1), "not started": WarmupLR / WarmupDecayLR give warmup_min_lr;
//     WarmupCosineLR gives 0 (ratio 0, not warmup_min_ratio).
//   - lr(i), i >= 0, with W = max(2, warmup_num_steps), T = total_num_steps:
//       warmup gamma g(i) for i < W: log: ln(i + 1) / ln(W);
//                                    linear: i / W.
//     WarmupLR:       min + (max - min) * (i < W ? g(i) : 1).
//     WarmupDecayLR:  min + (max - min) * (i < W ? g(i)
//                                          : max(0, (T - i) / max(1, T - W))),
//                     i.e. decays linearly to warmup_min_lr (not to 0),
//                     reaching it at i = T, and stays there.
//     WarmupCosineLR: base_lr * ratio, ratio =
//                       i < W: warmup_min_ratio + (1 - warmup_min_ratio) * g(i)
//                       else:  p = min(1, (i - W + 1) / max(1, T - W)),
//                              max(0, cos_min_ratio + (1 - cos_min_ratio) *
//                                        (1 + cos(pi * p)) / 2),
//                     reaching cos_min_ratio at i = T - 1 and staying there.
//   g(0) = 0 in both warmup types, so the first two updates both run at the
//   warmup start (warmup_min_lr; for cosine: 0, then warmup_min_ratio).
//   Log warmup reaches the peak at i = W - 1; linear only at i = W.
// LrSchedule follows this exactly: lr() is lr(last_batch_iteration()), the
// rate for the next update, and advance() is DeepSpeed's scheduler.step(),
// to be called only after an update that was applied.
//
// Defaults (DeepSpeed's constructors): warmup_min_lr 0, warmup_num_steps 1000,
// warmup_type "log", warmup_min_ratio 0, cos_min_ratio 0.0001. warmup_max_lr:
// WarmupLR takes the optimizer's lr (base_lr) when it is absent, WarmupDecayLR
// takes 0.001. total_num_steps has no default (required by WarmupDecayLR and
// WarmupCosineLR). WarmupLR and WarmupDecayLR ignore the optimizer's lr when
// warmup_max_lr is given; WarmupCosineLR always scales it.
//
// Thread safety: LrSchedule and LrScheduleSpec are values; parse_lr_schedule
// is reentrant.
#ifndef ZEROSTEP_ENGINE_LR_SCHEDULE_H_
#define ZEROSTEP_ENGINE_LR_SCHEDULE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/errors.h"

namespace zerostep {

// How the warmup rises ("scheduler.params.warmup_type").
enum class WarmupType {
  kLog,     // "log":    ln(i + 1) / ln(W)
  kLinear,  // "linear": i / W
};

struct LrScheduleSpec {
  enum class Type {
    kNone,  // no scheduler: the optimizer's lr, constant.
    kWarmupLR,
    kWarmupDecayLR,
    kWarmupCosineLR,
  };
  Type type = Type::kNone;  // "scheduler.type"
  // WarmupLR, WarmupDecayLR.
  double warmup_min_lr = 0.0;
  // nullopt: DeepSpeed's default for the type (WarmupLR: base_lr;
  // WarmupDecayLR: 0.001).
  std::optional<double> warmup_max_lr;
  // All three. Values below 2 act as 2 (DeepSpeed: max(2, warmup_num_steps)).
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR, WarmupCosineLR: required (>= 1); may be below
  // warmup_num_steps (DeepSpeed only warns).
  int64_t total_num_steps = 0;
  // WarmupCosineLR.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
};

class LrSchedule {
 public:
  // `base_lr` is the optimizer's lr (optimizer.params.lr). Throws UsageError
  // if the spec is unusable (warmup_num_steps < 1, total_num_steps < 1 for a
  // type that needs it, a negative or non-finite lr or ratio).
  LrSchedule(const LrScheduleSpec& spec, double base_lr);

  // The lr for the next update: lr_at(last_batch_iteration()).
  double lr() const { return lr_at(last_batch_iteration_); }
  // The lr DeepSpeed's scheduler gives at `last_batch_iteration` (any value
  // < 0 is "not started"). kNone: base_lr at every index.
  double lr_at(int64_t last_batch_iteration) const;

  // DeepSpeed's scheduler.step(): call once after each applied update (not
  // after a step skipped for overflow, nor off the accumulation boundary).
  void advance() { ++last_batch_iteration_; }

  // -1 before the first advance(); DeepSpeed's state_dict() holds only this.
  int64_t last_batch_iteration() const { return last_batch_iteration_; }
  // DeepSpeed's load_state_dict(): resume at a saved iteration.
  void set_last_batch_iteration(int64_t i) { last_batch_iteration_ = i; }

  const LrScheduleSpec& spec() const { return spec_; }
  double base_lr() const { return base_lr_; }

 private:
  // Warmup progress in [0, 1) for 0 <= i < W.
  double warmup_gamma(int64_t i) const;

  LrScheduleSpec spec_;
  double base_lr_;
  double max_lr_;          // resolved warmup_max_lr
  int64_t warmup_steps_;   // max(2, warmup_num_steps)
  double inv_log_warmup_;  // 1 / ln(warmup_steps_)
  int64_t last_batch_iteration_ = -1;
};

// Reads DeepSpeed's "scheduler" section ({"type": ..., "params": {...}}) into
// *out (which starts from LrScheduleSpec's defaults). Every problem is
// appended to *problems (keys dotted, e.g. "scheduler.params.warmup_num_steps";
// values as JSON text) and *out is then unspecified. Rejected, each with its
// own message: a missing or unknown type (did you mean, for DeepSpeed's other
// schedules "not implemented"), a missing params object (DeepSpeed calls the
// constructor with **params), unknown param names (did you mean) and names
// that belong to another of the three types, "auto", wrong JSON types,
// out-of-range values, an unknown warmup_type (DeepSpeed would silently use
// "log"), a missing total_num_steps, last_batch_iteration other than -1.
// With ordered_json, problems come in document order.
void parse_lr_schedule(const nlohmann::json& section, LrScheduleSpec* out,
                       std::vector<ConfigProblem>* problems);
void parse_lr_schedule(const nlohmann::ordered_json& section,
                       LrScheduleSpec* out,
                       std::vector<ConfigProblem>* problems);

// DeepSpeed's names: "WarmupLR", ...; "none" for kNone. "log", "linear".
const char* to_string(LrScheduleSpec::Type t);
const char* to_string(WarmupType t);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_LR_SCHEDULE_H_
