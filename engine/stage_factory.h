// The stage factory: the one place that chooses by zero_optimization.stage.
//
// Note [Stage factory]
// ~~~~~~~~~~~~~~~~~~~~
// Every choice that depends on the ZeRO stage number is made here, from
// the Config, and nowhere else in the engine: which stage and its own
// options (StageOptions::per_stage: a stage is handed only the options it
// takes), how the model's gradients fold into the stage's accumulation,
// which memory a device's kernels work on, and whether offload_param
// applies. The rest of the engine sees the choice as data: the Engine
// builds no stage option itself and never branches on the stage number;
// make_param_binding() picks the binding by the alternative per_stage
// holds, and the stages themselves (zero/stage*.h) act on their own
// options. Checkpoints record the stage number as metadata and compare it
// on load (engine/checkpoint.cc); that is no choice of behaviour.
//
// Thread safety: pure functions.
#ifndef ZEROSTEP_ENGINE_STAGE_FACTORY_H_
#define ZEROSTEP_ENGINE_STAGE_FACTORY_H_

#include "config/config.h"
#include "precision/precision.h"
#include "zero/flat_layout.h"
#include "zero/kernels.h"
#include "zero/optimizer.h"
#include "zero/stage.h"

namespace zerostep {

// What the engine has built, besides the Config, that a stage takes.
struct StageResources {
  FlatLayout layout;
  OptimizerHyper optimizer;
  // Where the optimizer state and (stage 3) the parameter partitions live
  // (engine/offload_devices.h).
  OptimizerSwap optimizer_swap;
  ParamSwap param_swap;
  // Note [Device kernels]: the stage buffers' kernels, and stage 3's
  // gathered groups' when they are elsewhere (KernelPlacement::kGroups);
  // nullptr: the host's.
  Kernels* kernels = nullptr;
  Kernels* group_kernels = nullptr;
  // EngineOptions::stage3_collectives_outside_backward (stages 2-3).
  bool collectives_outside_backward = false;
};

// The stage chosen for a Config.
struct StageChoice {
  StageOptions options;
  // The format each backward's gradient is folded into the binding's
  // gradient storage with (Note [Precision model]): grad_accum_dtype at
  // stages 0-1, whose flat gradient buffer is the window's accumulator;
  // float32 at stages 2-3, which accumulate their partition themselves.
  Precision fold_accum = Precision::kFp32;
  // Note [Transactional update]: whether a failed update may leave the
  // replica's chunks that other ranks own torn (stage 2 without a full
  // buffer to stage its all-gather in).
  bool replica_may_tear = false;
};

// Builds the stage's options from `config` and `resources`. UsageError
// when config.zero.stage is not 0-3 (parse_config never gives one).
StageChoice choose_stage(const Config& config, const StageResources& resources);

// Which memory a device's kernels (Note [Device kernels] in
// zero/kernels.h) work on under `zero`'s stage and offload.
enum class KernelPlacement {
  // No offload: the stage's own buffers are on the device.
  kStage,
  // Stage 3 with offload_optimizer or offload_param: the partitions and
  // the optimizer on the host, the gathered groups on the model's device
  // (Note [Stage 3 offload from a device] in zero/stage3.h).
  kGroups,
  // Stages 0-2 with offload_optimizer: the state on the host, the model's
  // gradients and weights moved by LibTorch copies; no kernels (Note
  // [ZeRO-Offload] in engine/flat_binding.h).
  kNone,
};
KernelPlacement kernel_placement(const ZeroConfig& zero);

// Whether zero_optimization.offload_param applies: stage 3 only (below it
// the section is ignored, as in DeepSpeed).
bool offload_param_applies(const ZeroConfig& zero);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_STAGE_FACTORY_H_
