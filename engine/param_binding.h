// ParamBinding: how a model's trainable parameters are bound to one ZeRO
// stage's storage. The Engine drives every stage through this interface
// and never branches on the stage number (Note [Stage factory] in
// engine/stage_factory.h: choose_stage() reads it, once);
// make_param_binding() picks the binding by the stage options' type:
//
//   FlatBinding (engine/flat_binding.h)      stages 0-2: the parameters and
//       their .grad view two flat buffers the stage reduces and updates;
//       mixed precision folds each backward's bf16/fp16 gradient into the
//       float32 accumulation (Note [Precision model] in precision/precision.h).
//   Stage3Binding (engine/stage3_binding.h)  stage 3: one storage per group
//       (Note [Stage 3 grouping rule] in zero/grouping.h), materialized and
//       released around each Zero3Block's forward and backward.
//
// A binding owns the Stage it builds, installs the autograd hooks that tell
// the stage when a parameter's gradient is complete, and keeps the model's
// weights in step with the stage's float32 parameters.
//
// The engine calls, per backward():
//   stage().begin_backward(k, s); begin_backward(); <autograd>;
//   end_backward(); stage().end_backward()
// and will_write_params() before, params_written() after, every applied
// update and checkpoint load.
//
// Ownership: the binding shares the model; `comm` and the devices in the
// StageOptions must outlive it.
// Thread safety: none; one binding per Engine, used from its thread.
#ifndef ZEROSTEP_ENGINE_PARAM_BINDING_H_
#define ZEROSTEP_ENGINE_PARAM_BINDING_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "common/zero_defaults.h"
#include "engine/failure_latch.h"
#include "engine/parameter_source.h"
#include "precision/precision.h"
#include "zero/flat_layout.h"
#include "zero/stage.h"

namespace zerostep {

class ParamBinding {
 public:
  virtual ~ParamBinding() = default;

  virtual Stage& stage() = 0;
  virtual const Stage& stage() const = 0;

  // Before the autograd pass of a backward.
  virtual void begin_backward() = 0;
  // After it (every gradient of this backward is in the stage's float32
  // gradient storage when this returns).
  virtual void end_backward() = 0;
  // The stage's float32 parameters were rewritten (update, load): the
  // model's weights follow.
  virtual void params_written() = 0;
  // The stage is about to rewrite its float32 parameters (before an
  // update or a load): whatever still reads them asynchronously is
  // waited for (Note [Offload copies] in engine/flat_binding.h).
  virtual void will_write_params() {}

  // A copy of every trainable parameter, concatenated in registration
  // order (a collective at stage 3).
  virtual torch::Tensor full_parameters() = 0;
  // Views of the flat buffers (numel elements); UsageError at stage 3.
  virtual torch::Tensor flat_parameters() const = 0;
  virtual torch::Tensor flat_gradients() const = 0;
  // The stage's memory plus the model's own mixed-precision copies.
  virtual MemoryStats memory() const = 0;
  virtual void reset_peak_memory() = 0;

 protected:
  // Autograd finished parameter i's gradient of this backward (the hook
  // installed by install_grad_ready_hooks).
  virtual void on_grad_ready(size_t param_index) = 0;
  // When the stage wants on_grad_ready (overlap_comm, stage 3), or the
  // binding itself does (`binding_wants`), hooks every parameter's
  // AccumulateGrad node to call it.
  void install_grad_ready_hooks(const std::vector<torch::Tensor>& params,
                                bool binding_wants = false);

 private:
  // The AccumulateGrad nodes carrying the hooks: a parameter holds its
  // accumulator weakly, so the binding keeps them (and the hooks) alive.
  // grad_accumulator() returns std::shared_ptr up to LibTorch 2.11 and
  // c10::intrusive_ptr from 2.15: the type is taken from the call.
  using GradAccumulator = decltype(torch::autograd::impl::grad_accumulator(
      std::declval<const torch::Tensor&>()));
  std::vector<GradAccumulator> grad_accumulators_;
};

// What a binding is built from.
struct BindingOptions {
  // The stage and its options (layout, optimizer, the stage's own options:
  // StageOptions::per_stage).
  StageOptions stage;
  Precision dtype = Precision::kFp32;
  // The format each backward's gradient is folded into the binding's
  // gradient storage with (StageChoice::fold_accum in
  // engine/stage_factory.h; Note [Precision model]).
  Precision fold_accum = Precision::kFp32;
  // Stage 3: zero_optimization.stage3_param_persistence_threshold.
  int64_t persistence_threshold = zero_defaults::kPersistenceThreshold;
  // Stages 1-2: zero_optimization.offload_optimizer.device is "cpu" or
  // "nvme": the model's weights and gradients stay on the model's device,
  // the float32 master and the optimizer on the host (Note [ZeRO-Offload]
  // in engine/flat_binding.h).
  bool offload = false;
  // offload_optimizer.pin_memory: the host buffers that take the model's
  // gradients are page-locked when the model is on a CUDA device.
  bool pin_memory = false;
  // Tests: a CPU model's offload goes through host staging buffers as a
  // device model's does (Note [Offload copies] in engine/flat_binding.h).
  bool offload_staging_on_cpu = false;
  // Where parameters built on the meta device get their values
  // (EngineOptions::parameter_source); nullptr: none may be on meta.
  const ParameterSource* source = nullptr;
  // The trainable parameters' names (named_parameters()), in order.
  std::vector<std::string> names;
};

namespace internal {
// The device a model's state lives on: its parameters' (all on one), the
// host for a model with none or built on the meta device.
torch::Device model_device(const std::vector<torch::Tensor>& params);
// Makes parameter p view `view`, which becomes its data: set_data(), or
// for a parameter built on the meta device (which set_data() refuses) the
// same metadata copy without set_data()'s device check. Before any
// autograd hook is installed on p.
void bind_parameter(torch::Tensor& p, const torch::Tensor& view);
// Parameter `name`'s values (numel elements) from `source`, into host
// float32 `out`, rounded to bf16 under bf16 training (the values a model
// converted to bf16 would hold). UsageError when `source` is nullptr,
// naming the parameter and the fix.
void read_from_source(const ParameterSource* source, const std::string& name,
                      int64_t offset, int64_t numel, Precision dtype,
                      float* out);
}  // namespace internal

// `params` are the model's trainable parameters (trainable_parameters() in
// blocks/zero3_block.h) and options.stage.layout their flat layout over
// comm's world. Moves the parameters into the binding's storage, broadcasts
// rank 0's values to every rank (a collective), builds the stage (a
// Stage3Binding when options.stage.per_stage holds Stage3Options, otherwise
// a FlatBinding over make_stage()). `latch` (outlives
// the binding) guards the collectives stage 3 runs in a block's forward.
std::unique_ptr<ParamBinding> make_param_binding(
    std::shared_ptr<torch::nn::Module> model, std::vector<torch::Tensor> params,
    const BindingOptions& options, Communicator* comm, FailureLatch* latch);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_PARAM_BINDING_H_
