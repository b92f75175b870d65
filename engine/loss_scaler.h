// LossScaler: fp16 loss scaling with DeepSpeed's rules (no LibTorch).
//
// backward() multiplies the loss by scale(); step() divides the window's
// gradient by it and asks whether any element overflowed (inf or NaN) over
// the whole window and every rank. On overflow the update is skipped and
// update(true) runs; otherwise the update is applied and update(false) runs.
//
// Note [Loss scale schedule]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Dynamic scaling (fp16.loss_scale = 0), as DeepSpeed's DynamicLossScaler:
//   scale starts at 2^initial_scale_power; hysteresis counts down from
//   `hysteresis`. Each step() that reaches the boundary is one iteration:
//   overflow:  if hysteresis is 1 (or the configured hysteresis is 1), the
//              scale halves, never below min_loss_scale; otherwise only the
//              hysteresis counter drops by one. The iteration is remembered
//              as the last overflow.
//   no overflow: with consecutive_hysteresis the counter refills. When the
//              iterations since the last overflow, not counting this one,
//              are a positive multiple of loss_scale_window, the scale
//              doubles (and, without consecutive_hysteresis, the counter
//              refills).
//   An overflow at min_loss_scale with the counter at 1 cannot lower the
//   scale: DeepSpeed raises there, and so does update() (UsageError), after
//   recording the iteration.
// Static scaling (loss_scale > 0): the scale never changes; overflowing
// windows are still skipped (as DeepSpeed's fp16 optimizers do).
//
// Thread safety: none; one per engine.
#ifndef ZEROSTEP_ENGINE_LOSS_SCALER_H_
#define ZEROSTEP_ENGINE_LOSS_SCALER_H_

#include <cstdint>

#include "common/zero_defaults.h"

namespace zerostep {

struct LossScalerOptions {
  bool dynamic = true;              // fp16.loss_scale == 0
  double static_scale = 1.0;        // fp16.loss_scale when > 0
  // fp16.initial_scale_power
  int initial_scale_power = zero_defaults::kInitialScalePower;
  int64_t scale_window = zero_defaults::kLossScaleWindow;  // fp16.loss_scale_window
  int64_t hysteresis = zero_defaults::kHysteresis;         // fp16.hysteresis
  bool consecutive_hysteresis = false;  // fp16.consecutive_hysteresis
  double min_scale = zero_defaults::kMinLossScale;  // fp16.min_loss_scale
};

class LossScaler {
 public:
  // What a checkpoint carries.
  struct State {
    double scale = 1.0;
    int64_t iteration = 0;
    int64_t last_overflow_iteration = -1;
    int64_t hysteresis_left = 1;
  };

  explicit LossScaler(const LossScalerOptions& options);

  double scale() const { return state_.scale; }
  const State& state() const { return state_; }
  void restore(const State& s) { state_ = s; }
  bool dynamic() const { return options_.dynamic; }

  // One boundary iteration (Note [Loss scale schedule]). Throws UsageError
  // when an overflow happens at min_loss_scale with no hysteresis left; the
  // state has advanced by the iteration then.
  void update(bool overflow);

 private:
  LossScalerOptions options_;
  State state_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_LOSS_SCALER_H_
