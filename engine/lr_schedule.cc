#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace {

constexpr double kPi = 3.14159265358979323846;  // Python's math.pi

using Type = LrScheduleSpec::Type;

}  // namespace

LrSchedule::LrSchedule(const LrScheduleSpec& spec, double base_lr)
    : spec_(spec), base_lr_(base_lr) {
  auto fail = [&](const std::string& what) {
    std::ostringstream os;
    os << "LrSchedule(" << to_string(spec.type) << "): " << what;
    throw UsageError(os.str());
  };
  auto check_nonneg = [&](const char* name, double v) {
    if (!std::isfinite(v) || v < 0) {
      std::ostringstream os;
      os << name << " = " << v << " must be a finite number >= 0";
      fail(os.str());
    }
  };
  check_nonneg("base_lr", base_lr);
  const bool typed = spec.type != Type::kNone;
  if (typed && spec.warmup_num_steps < 1) {
    fail("warmup_num_steps = " + std::to_string(spec.warmup_num_steps) +
         " must be >= 1");
  }
  if ((spec.type == Type::kWarmupDecayLR ||
       spec.type == Type::kWarmupCosineLR) &&
      spec.total_num_steps < 1) {
    fail("total_num_steps = " + std::to_string(spec.total_num_steps) +
         " must be >= 1 (it has no default)");
  }
  check_nonneg("warmup_min_lr", spec.warmup_min_lr);
  if (spec.warmup_max_lr) check_nonneg("warmup_max_lr", *spec.warmup_max_lr);
  check_nonneg("warmup_min_ratio", spec.warmup_min_ratio);
  check_nonneg("cos_min_ratio", spec.cos_min_ratio);

  if (spec.warmup_max_lr) {
    max_lr_ = *spec.warmup_max_lr;
  } else {
    max_lr_ = spec.type == Type::kWarmupDecayLR ? 0.001 : base_lr;
  }
  warmup_steps_ = std::max<int64_t>(2, spec.warmup_num_steps);
  inv_log_warmup_ = 1.0 / std::log(static_cast<double>(warmup_steps_));
}

double LrSchedule::warmup_gamma(int64_t i) const {
  if (spec_.warmup_type == WarmupType::kLog) {
    return inv_log_warmup_ * std::log(static_cast<double>(i) + 1.0);
  }
  return static_cast<double>(i) / static_cast<double>(warmup_steps_);
}

double LrSchedule::lr_at(int64_t i) const {
  const int64_t w = warmup_steps_;
  const int64_t total = spec_.total_num_steps;
  switch (spec_.type) {
    case Type::kNone:
      return base_lr_;
    case Type::kWarmupLR:
    case Type::kWarmupDecayLR: {
      if (i < 0) return spec_.warmup_min_lr;
      double gamma = 1.0;
      if (i < w) {
        gamma = warmup_gamma(i);
      } else if (spec_.type == Type::kWarmupDecayLR) {
        gamma = std::max(
            0.0, static_cast<double>(total - i) /
                     static_cast<double>(std::max<int64_t>(1, total - w)));
      }
      return spec_.warmup_min_lr + (max_lr_ - spec_.warmup_min_lr) * gamma;
    }
    case Type::kWarmupCosineLR: {
      if (i < 0) return 0.0;
      double ratio;
      if (i < w) {
        ratio = spec_.warmup_min_ratio +
                warmup_gamma(i) * (1.0 - spec_.warmup_min_ratio);
      } else {
        const double done = static_cast<double>(i - w + 1);
        const double span =
            static_cast<double>(std::max<int64_t>(1, total - w));
        const double progress = std::min(1.0, done / span);
        const double cosine = (1.0 + std::cos(kPi * progress)) / 2.0;
        ratio = std::max(
            0.0, spec_.cos_min_ratio + (1.0 - spec_.cos_min_ratio) * cosine);
      }
      return base_lr_ * ratio;
    }
  }
  return base_lr_;
}

}  // namespace zerostep
