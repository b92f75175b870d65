// DeepSpeed's defaults for the zero_optimization sizes that more than one
// layer carries: the parsed config (config/zero.h: what a ds_config without
// the key means), the stages' options (zero/stage.h), the planner's
// (zero/schedule.h) and the engine's binding (engine/param_binding.h).
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

}  // namespace zerostep::zero_defaults

#endif  // ZEROSTEP_COMMON_ZERO_DEFAULTS_H_
