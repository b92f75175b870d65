// LrSchedule: DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR
// learning-rate schedules as a small value type (no tensors, no optimizer).
//
// Formulas are DeepSpeed's (deepspeed/runtime/lr_schedules.py). The ds_config
// "scheduler" section is read into an LrScheduleSpec by parse_lr_schedule()
// (config/scheduler.h, which also lists the parameters' defaults).
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
// Thread safety: LrSchedule is a value.
#ifndef ZEROSTEP_ENGINE_LR_SCHEDULE_H_
#define ZEROSTEP_ENGINE_LR_SCHEDULE_H_

#include <cstdint>

#include "config/scheduler.h"

namespace zerostep {

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

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_LR_SCHEDULE_H_
