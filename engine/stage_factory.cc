#include "engine/stage_factory.h"

#include <cstddef>
#include <string>

#include "common/errors.h"

namespace zerostep {

StageChoice choose_stage(const Config& config, const StageResources& r) {
  const ZeroConfig& zero = config.zero;
  StageChoice choice;
  StageOptions& o = choice.options;
  o.layout = r.layout;
  o.optimizer = r.optimizer;
  o.averaging = {config.prescale_gradients, config.gradient_predivide_factor};
  o.optimizer_swap = r.optimizer_swap;
  o.kernels = r.kernels;
  const Precision grad_accum = config.precision.grad_accum_dtype;
  // Note [Partitioned master]: the model's bf16 weights stay on its device
  // and hold the one full copy, unless offload keeps the master on the host.
  const bool bf16_weights =
      config.precision.dtype == Precision::kBf16 &&
      zero.offload_optimizer.device == OffloadDevice::kNone;
  ZS_CHECK(zero.stage == 3 || r.group_kernels == nullptr);
  switch (zero.stage) {
    case 0: {
      Stage0Options s;
      s.reduce_bucket_size = zero.reduce_bucket_size;
      s.overlap_comm = zero.overlap_comm;
      o.per_stage = s;
      choice.fold_accum = grad_accum;
      break;
    }
    case 1: {
      Stage1Options s;
      s.reduce_bucket_size = zero.reduce_bucket_size;
      s.bf16_weights = bf16_weights;
      o.per_stage = s;
      choice.fold_accum = grad_accum;
      break;
    }
    case 2: {
      Stage2Options s;
      s.reduce_bucket_size = zero.reduce_bucket_size;
      s.allgather_bucket_size = zero.allgather_bucket_size;
      s.overlap_comm = zero.overlap_comm;
      s.grad_accum = grad_accum;
      s.bf16_weights = bf16_weights;
      s.reduce_once_per_step = zero.reduce_once_per_step;
      s.collectives_outside_backward = r.collectives_outside_backward;
      o.per_stage = s;
      // Note [Transactional update]: no full buffer to stage the
      // all-gather in.
      choice.replica_may_tear = partitions_gradients(o) || partitions_master(o);
      break;
    }
    case 3: {
      Stage3Options s;
      s.reduce_bucket_size = zero.reduce_bucket_size;
      s.overlap_comm = zero.overlap_comm;
      s.grad_accum = grad_accum;
      s.reduce_once_per_step = zero.reduce_once_per_step;
      s.gather_once_per_step = zero.gather_once_per_step;
      s.collectives_outside_backward = r.collectives_outside_backward;
      s.prefetch_numel = static_cast<size_t>(zero.stage3_prefetch_bucket_size);
      s.reuse_distance_numel =
          static_cast<size_t>(zero.stage3_max_reuse_distance);
      s.max_live_numel = static_cast<size_t>(zero.stage3_max_live_parameters);
      s.param_swap = r.param_swap;
      s.group_kernels = r.group_kernels;
      o.per_stage = s;
      break;
    }
    default:
      throw UsageError(
          "zero_optimization.stage = " + std::to_string(zero.stage) +
          ": the ZeRO stage is 0, 1, 2 or 3. Fix: build the "
          "Config with parse_config, or set a stage in 0-3");
  }
  return choice;
}

bool offload_param_applies(const ZeroConfig& zero) { return zero.stage == 3; }

KernelPlacement kernel_placement(const ZeroConfig& zero) {
  const bool offload_optimizer =
      zero.offload_optimizer.device != OffloadDevice::kNone;
  const bool offload_param = offload_param_applies(zero) &&
                             zero.offload_param.device != OffloadDevice::kNone;
  if (!offload_optimizer && !offload_param) return KernelPlacement::kStage;
  return zero.stage == 3 ? KernelPlacement::kGroups : KernelPlacement::kNone;
}

}  // namespace zerostep
