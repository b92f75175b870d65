#include "engine/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/errors.h"

namespace zerostep {

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options) {
  ZS_CHECK(options_.scale_window >= 1);
  ZS_CHECK(options_.hysteresis >= 1);
  ZS_CHECK(options_.min_scale > 0);
  state_.scale = options_.dynamic
                     ? std::ldexp(1.0, options_.initial_scale_power)
                     : options_.static_scale;
  state_.hysteresis_left = options_.hysteresis;
}

void LossScaler::update(bool overflow) {
  State& s = state_;
  if (!options_.dynamic) {
    ++s.iteration;
    return;
  }
  bool stuck = false;
  if (overflow) {
    if (options_.hysteresis == 1 || s.hysteresis_left == 1) {
      if (s.scale == options_.min_scale) {
        stuck = true;
      } else {
        s.scale = std::max(s.scale / 2.0, options_.min_scale);
      }
    } else {
      --s.hysteresis_left;
    }
    s.last_overflow_iteration = s.iteration;
  } else {
    if (options_.consecutive_hysteresis) s.hysteresis_left = options_.hysteresis;
    const int64_t stable = s.iteration - s.last_overflow_iteration - 1;
    if (stable > 0 && stable % options_.scale_window == 0) {
      if (!options_.consecutive_hysteresis)
        s.hysteresis_left = options_.hysteresis;
      s.scale *= 2.0;
    }
  }
  ++s.iteration;
  if (stuck) {
    throw UsageError(
        "fp16: the gradients overflowed again at the minimum loss scale "
        "(fp16.min_loss_scale = " + std::to_string(options_.min_scale) +
        ") with no hysteresis left, so the scale cannot go lower. This "
        "step was skipped and its gradients were cleared, as for every "
        "overflow; training is diverging. Fix: lower the learning rate, "
        "clip gradients, or lower fp16.min_loss_scale");
  }
}

}  // namespace zerostep
