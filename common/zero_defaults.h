// DeepSpeed's defaults that more than one layer carries: the
// zero_optimization sizes, in the parsed config (config/zero.h: what a
// ds_config without the key means), the stages' options (zero/stage.h),
// the planner's (zero/schedule.h) and the engine's binding
// (engine/param_binding.h); and fp16's dynamic loss scaling, in the parsed
// config (config/precision.h) and the scaler's options
// (engine/loss_scaler.h).
// Written once, here, so that a struct built without a config means what a
// ds_config without the key means.
//
// Thread safety: constants.
#ifndef ZEROSTEP_COMMON_ZERO_DEFAULTS_H_
#define ZEROSTEP_COMMON_ZERO_DEFAULTS_H_

#include <cstdint>

namespace zerostep::zero_defaults {

// reduce_bucket_size and allgather_bucket_size, elements (DeepSpeed's 5e8).
inline constexpr int64_t kBucketElements = 500000000;
// stage3_param_persistence_threshold, elements (DeepSpeed's 1e5).
inline constexpr int64_t kPersistenceThreshold = 100000;
// stage3_max_reuse_distance, elements (DeepSpeed's 1e9).
inline constexpr int64_t kMaxReuseDistance = 1000000000;

// fp16's dynamic loss scaling (DeepSpeed's DynamicLossScaler):
// initial_scale_power, loss_scale_window, hysteresis, min_loss_scale.
inline constexpr int kInitialScalePower = 16;
inline constexpr int64_t kLossScaleWindow = 1000;
inline constexpr int64_t kHysteresis = 2;
inline constexpr double kMinLossScale = 1.0;

}  // namespace zerostep::zero_defaults

#endif  // ZEROSTEP_COMMON_ZERO_DEFAULTS_H_
