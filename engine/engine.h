// Engine: a ZeRO data-parallel training engine for one rank, in which the
// caller may own the gradient-accumulation boundary.
//
//   Engine engine(model, config, &comm);
//   for (...) {                       // managed (default): GAS micro-steps
//     engine.backward(loss_fn(model, batch));
//     engine.step();                  // updates on the boundary only
//   }
//   // unmanaged (managed_gradient_accumulation = false):
//   for (i < n) engine.backward(loss_i);   // n chosen at run time
//   engine.step();                          // exactly one update
//
// The Engine is the same code at every ZeRO stage: it asks
// AccumulationBoundary what each call means and drives the stage through a
// ParamBinding (engine/param_binding.h), which binds the model's trainable
// parameters to the stage's storage: at stages 0-2 one flat float32 buffer
// (each parameter becomes a view of it) and another for their .grad, so
// autograd accumulates straight into the buffer the stage reduces; at
// stage 3 one storage per block group. Do not replace parameters, set
// .grad, or call zero_grad() on the model: the engine owns both.
// Parameters with requires_grad = false stay where they are and are never
// communicated. The Engine issues no collective itself: the stages and
// zero/agreement.h do.
//
// At construction rank 0's parameter values are broadcast to every rank,
// and rank 0 logs the ds_config keys accepted without effect
// (Config::ignored_keys) through the log hook (common/log.h), once.
//
// Memory at construction (stage 3; Note [Stage 3 initial values] in
// zero/stage3.h): the engine partitions the model one block group at a
// time. A model the caller built whole holds its full storage until its
// group is partitioned; then each parameter views the engine's storage and
// its old storage is freed, unless the caller keeps another reference to
// it. The peak is therefore the caller's model, the rank's partitions and
// one group. A model built on the meta device with
// EngineOptions::parameter_source never exists whole: each rank reads its
// partitions and holds them, plus the persistent group, at most.
//
// Errors: UsageError for calls not allowed in the current state (the call
// changes nothing), ConfigError is raised earlier by parse_config, CommError
// when a collective fails. A c10::Error from LibTorch inside backward()
// becomes UsageError with the engine's context.
//
// A CommError from backward(), step() or a ZeRO-3 block's forward names
// the call, the global step and the window position, and wraps the
// communicator's message (which names the rank at fault, the collective's
// number, op and phase). Parameters, optimizer state (moments and step
// count), global_steps, global_samples and the lr schedule are then exactly
// as before the call, on every rank (Note [Transactional update] in
// zero/stage.h, which also gives the memory this costs); the window's
// gradients are lost. The engine then refuses backward() and step() with a
// UsageError: the world must be rebuilt (new communicators and engines,
// load_checkpoint).
//
// Ownership: `*comm` must outlive the Engine; the Engine shares `model`.
// Thread safety: none; one Engine per rank, used from one thread.
#ifndef ZEROSTEP_ENGINE_ENGINE_H_
#define ZEROSTEP_ENGINE_ENGINE_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Zero3Block and zero3_block(), with which a model of your own marks its
// stage 3 blocks, come with the engine (docs/api.md).
#include "blocks/zero3_block.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "engine/boundary.h"
#include "engine/checkpoint_io.h"
#include "engine/failure_latch.h"
#include "engine/loss_scaler.h"
#include "engine/lr_schedule.h"
#include "engine/offload_devices.h"
#include "engine/param_binding.h"
#include "engine/parameter_source.h"
#include "offload/block_device.h"
#include "zero/kernels.h"
#include "zero/staging_comm.h"
#include "zero/stage.h"

namespace zerostep {

// Hyperparameters one step() uses instead of the configured ones (RPC
// clients such as Tinker's optim_step send them with every step). Unset
// fields keep the configured value; nothing carries over to later steps.
struct StepOverrides {
  std::optional<double> lr;
  std::optional<double> beta1;
  std::optional<double> beta2;
  std::optional<double> eps;
  std::optional<double> weight_decay;
  std::optional<double> gradient_clipping;  // 0 = no clipping this step
};

struct LoadOptions {
  // Allow a checkpoint written by another world size or ZeRO stage: state
  // is stored in canonical order, so any layout can be rebuilt from it.
  bool allow_reshard = false;
  // false: restore the parameters, counters and lr schedule but start the
  // optimizer afresh (moments zero, step count 0), as DeepSpeed's
  // load_checkpoint(load_optimizer_states=False).
  bool load_optimizer_states = true;
};

// Throws the UsageError that step(overrides) throws for bad values, and
// otherwise nothing; for callers that must check before they change
// anything else (the trainer server's optim_step).
void check_step_overrides(const StepOverrides& overrides);

// How export_full_model writes the parameters.
struct ExportOptions {
  enum class Dtype {
    kF32,   // safetensors "F32": the float32 master values, bit for bit
    kBF16,  // safetensors "BF16": each master value rounded to the nearest
            // bf16, ties to even (as LibTorch's .to(torch::kBFloat16))
  };
  // Default kF32, whatever the engine trains in.
  Dtype dtype = Dtype::kF32;
};

// Effects an Engine may be given instead of the ones it makes itself.
struct EngineOptions {
  // offload_optimizer.device = "nvme": the device holding this rank's
  // optimizer state (e.g. a offload/faulty_block_device.h in tests). nullptr:
  // the engine opens <nvme_path>/zerostep_rank<r>_optimizer.swap itself
  // (offload/posix_block_device.h). Must outlive the engine.
  BlockDevice* optimizer_device = nullptr;
  // offload_param.device = "nvme" (stage 3): the device holding this rank's
  // parameter partitions (zero/stage3.h Note [NVMe parameter partitions]).
  // nullptr: the engine opens <nvme_path>/zerostep_rank<r>_params.swap
  // itself, truncated. Must outlive the engine.
  BlockDevice* param_device = nullptr;
  // The file operations save_checkpoint makes (engine/checkpoint_io.h;
  // e.g. a decorator that stops a save after its k-th operation in tests).
  // nullptr: posix_checkpoint_files(). Must outlive the engine.
  CheckpointFiles* checkpoint_files = nullptr;
  // The kernels of the model's device memory (Note [Device kernels] in
  // zero/kernels.h), e.g. zero/far_kernels.h or a CPU TorchKernels in
  // tests, which run the device path on the CPU: without offload the
  // stage's buffers live there; at stage 3 with offload only the gathered
  // groups (Note [Stage 3 offload from a device] in zero/stage3.h); at
  // stages 1-2 with offload it is a UsageError. nullptr: the host's for a
  // CPU model, a TorchKernels on the model's device otherwise. Must outlive
  // the engine.
  Kernels* kernels = nullptr;
  // Stages 2-3: no collective inside backward (Note [Stage 3 collectives
  // outside backward] in zero/stage3.h), for several ranks of one process
  // on one CUDA device, whose backward passes share one autograd thread.
  // Same bits; stage 3 holds every group's parameters and gradient from
  // its forward to the end of the backward, stage 2 a full gradient (Note
  // [Stage 2 buckets] in zero/stage2.h).
  bool stage3_collectives_outside_backward = false;
  // The values of parameters built on the meta device (no memory; e.g.
  // make_hf_decoder with device torch::kMeta), read range by range (Note
  // [Stage 3 initial values] in zero/stage3.h): at stage 3 each rank reads
  // only its partitions, so no rank ever holds the whole model; at stages
  // 0-2 every rank reads every trainable parameter. Frozen parameters on
  // the meta device are read whole. nullptr: no parameter may be on the
  // meta device. Must outlive the constructor only.
  const ParameterSource* parameter_source = nullptr;
  // Tests: with offload_optimizer at stages 1-2, a CPU model's gradients and
  // weights go through host staging buffers, hooks and copies as a CUDA
  // model's do (Note [Offload copies] in engine/flat_binding.h), so the
  // tests here run that path (all but the copy stream).
  bool offload_staging_on_cpu = false;
};

class Engine final {
 public:
  // IoError if offload_optimizer.nvme_path or offload_param.nvme_path
  // cannot hold the state (missing, not a directory, not writable, full).
  // The files are opened before any collective, so a path that cannot be
  // opened fails before communicating; a full drive is found when the
  // stage reserves the space, after the initial broadcast.
  Engine(std::shared_ptr<torch::nn::Module> model, const Config& config,
         Communicator* comm, const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Accumulates d(loss)/d(params) into the flat gradient buffer. With
  // scale_wrt_gas and gradient_accumulation_scaling "configured", the loss
  // is divided by gradient_accumulation_steps first (DeepSpeed). Managed
  // mode reduces the window's gradients when this backward is on the
  // boundary (stage 0/1).
  void backward(const torch::Tensor& loss, bool scale_wrt_gas = true);

  // Managed: on the boundary, finalizes and applies one update; otherwise
  // only advances micro_steps. Unmanaged: always finalizes the gradients of
  // the backward() calls since the last step and applies one update.
  //
  // fp16: if any gradient of the window on any rank is inf or NaN, the
  // update is skipped instead (was_step_applied() false, skipped_steps()
  // + 1, gradients cleared, lr schedule and global_steps unchanged) and the
  // loss scale backs off. An overflow at fp16.min_loss_scale with no
  // hysteresis left skips the same way and then throws UsageError (as
  // DeepSpeed raises there).
  //
  // NVMe offload: a device error is IoError naming the file on its rank
  // and CommError naming that rank on the others; parameters, optimizer
  // state and counters are as before the call everywhere and the engine
  // refuses further calls (as after a CommError, below).
  //
  // `overrides` replace configured hyperparameters for this step only. Bad
  // values (lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0,
  // gradient_clipping < 0) are a UsageError that changes nothing.
  void step(const StepOverrides& overrides = {});

  bool is_gradient_accumulation_boundary() const;
  void set_gradient_accumulation_boundary(bool is_boundary);

  int64_t micro_steps() const { return boundary_.micro_steps(); }
  int64_t global_steps() const { return boundary_.global_steps(); }
  int64_t global_samples() const { return boundary_.global_samples(); }
  int64_t skipped_steps() const { return boundary_.skipped_steps(); }
  // backward() calls in the current (open) window.
  int64_t window_backwards() const { return boundary_.window_backwards(); }
  // Whether the last step() applied an update (false for a managed
  // non-boundary step and for an fp16 window that overflowed).
  bool was_step_applied() const { return step_applied_; }
  // The training dtype (config fp16 / bf16; fp32 otherwise).
  Precision dtype() const { return config_.precision.dtype; }
  // fp16: the scale the next backward() multiplies the loss by, and its
  // schedule; 1 (static) in fp32 and bf16.
  double loss_scale() const { return scaler_.scale(); }
  const LossScaler& loss_scaler() const { return scaler_; }
  // The lr the next applied update will use (the schedule's, or the
  // configured constant; a StepOverrides lr wins for its step).
  double get_lr() const { return lr_schedule_.lr(); }
  const LrSchedule& lr_schedule() const { return lr_schedule_; }
  // The global gradient L2 norm of the last applied update (after the
  // division of per_step_count scaling, before clipping); -1 before the
  // first update.
  double get_global_grad_norm() const { return last_grad_norm_; }

  const Config& config() const { return config_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }

  // The trainable parameters, in registration order (views of the flat
  // buffer).
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  // The flat parameter buffer (layout().numel elements; padding excluded),
  // a view. Stages 0-2 only: UsageError at stage 3, and at stages 1-2 under
  // bf16, whose float32 master is partitioned (Note [Partitioned master] in
  // zero/stage.h).
  torch::Tensor flat_parameters() const;
  // The flat gradient buffer, accumulated over the open window (float32;
  // fp16: still multiplied by loss_scale(), which step() divides out).
  // Stages 0-1, and stage 2 with reduce_once_per_step; UsageError at stage
  // 3 and at stage 2 otherwise, which holds no full gradient (Note [Stage 2
  // buckets] in zero/stage2.h).
  torch::Tensor flat_gradients() const;
  // A copy of every trainable parameter, concatenated in registration order
  // (layout().numel elements). At stage 3 it all-gathers the partitions: a
  // collective, so every rank must call it at the same point.
  torch::Tensor full_parameters();
  // Stage 3: restarts the peak of memory().peak_bytes from what is resident
  // now; other stages: nothing.
  void reset_peak_memory();

  // Checkpoints and model files (engine/checkpoint.cc; engine/
  // checkpoint_io.h and engine/safetensors.h for the formats). Every rank
  // calls them at the same point, between windows (inside an open
  // accumulation window: UsageError, on every rank for save).
  // save_checkpoint and export_full_model are collectives; load_checkpoint
  // and load_model_weights read files locally (state is stored in
  // canonical order) and communicate nothing.
  //
  // save_checkpoint writes <dir>/<tag>/ beside the previous one and then
  // switches it in (Note [Checkpoint switch] in engine/checkpoint_io.h):
  // rank 0 prepares <dir>/.<tag>.tmp/, rank r writes
  // <dir>/.<tag>.tmp/rank_<r>.bin, and rank 0 writes manifest.json there,
  // renames an existing <dir>/<tag>/ to <dir>/.<tag>.old/, renames the new
  // folder to <dir>/<tag>/, writes <dir>/latest and removes the old folder.
  // Saving again under an existing tag is allowed and replaces it. Every
  // rank must see the same <dir> (a shared file system). IoError on every
  // rank if any rank could not write; a crash or error at any point leaves
  // the old or the new checkpoint loadable under <tag> and `latest` naming
  // a loadable one. Tags starting with '.', containing '/', or "latest":
  // UsageError.
  void save_checkpoint(const std::string& dir, const std::string& tag);
  // load_checkpoint reads <dir>/<tag> (tag "" = the one <dir>/latest names;
  // if an interrupted save left only <dir>/.<tag>.old or .<tag>.tmp, that)
  // and restores parameters, optimizer state, counters and the lr schedule,
  // for a bitwise-identical continuation. Every rank reads <dir>/latest
  // (tag ""), manifest.json and every rank's rank_<i>.bin, whether or not
  // it re-shards (state is stored in canonical order), so every rank must
  // be able to read the whole checkpoint folder. Everything is read and
  // verified before anything changes, the manifest included (its checksum,
  // and the ranges and consistency of every counter, scale and schedule
  // value): IoError (missing, truncated, corrupt or edited file, naming the
  // file and, for the manifest, the field) or UsageError (another model,
  // optimizer, world size or stage without allow_reshard) leave the engine
  // as it was.
  //
  // Precision: a checkpoint holds the float32 master weights and moments
  // whatever the engine's dtype, so any checkpoint loads into an fp32,
  // bf16 or fp16 engine. A bf16 engine's model weights are then the
  // float32 values rounded to bf16. The loss scaler's state is restored
  // only when both the checkpoint and the engine are fp16; otherwise an
  // fp16 engine keeps its own scaler state (a fresh engine: the initial
  // scale), and an fp16 checkpoint's scale is ignored by fp32 and bf16.
  // When the dtypes differ, rank 0 says so through the log hook.
  void load_checkpoint(const std::string& dir, const std::string& tag = "",
                       const LoadOptions& options = {});
  // A collective: rank 0 writes every trainable parameter to `path` as a
  // safetensors file (engine/safetensors.h), atomically (temporary file,
  // fsync, rename). Each tensor is named as the model's named_parameters()
  // names it (dotted), has its shape, and holds its master values in
  // options.dtype; the header's "__metadata__" is {"format": "pt"} (what
  // Hugging Face's loaders expect). Stage 3 all-gathers the partitions
  // first, so every rank must call it at the same point. IoError on every
  // rank if rank 0 could not write (`path` is then unchanged).
  void export_full_model(const std::string& path,
                         const ExportOptions& options = {});
  // Sets the model's trainable parameters from the safetensors file `path`
  // (as export_full_model writes, from any world size or stage, or any
  // other writer), e.g. to start training from pretrained weights. Every
  // rank reads the whole file itself; nothing is communicated, but every
  // rank must call it at the same point (between windows), so that the
  // replicas stay equal. Tensors are matched by name against the
  // trainable parameters' named_parameters() names; each must have the
  // parameter's shape and dtype F32 or BF16 (widened exactly to float32).
  // The values go through the stage's load path, as load_checkpoint's,
  // so stage 3 partitions and the bf16/fp16 model weights follow them.
  // Optimizer state (moments, step count), counters, the lr schedule and
  // the loss scale are left as they are: call it before training, or
  // expect Adam's moments from the previous weights.
  //
  // Errors, with nothing changed: UsageError inside an open accumulation
  // window; IoError if the file cannot be read or is not valid
  // safetensors; UsageError listing every mismatch at once (parameters the
  // file lacks, tensors the model lacks, wrong shapes, other dtypes) when
  // it does not fit the model.
  void load_model_weights(const std::string& path);
  const FlatLayout& layout() const { return layout_; }

  // The optimizer this rank runs: its state covers the flat ranges
  // owned_spans(), concatenated in that order.
  const FlatOptimizer& optimizer() const { return stage_->optimizer(); }
  const std::vector<Span>& owned_spans() const { return stage_->owned_spans(); }
  // The parameters this rank's optimizer updates, in its state's order (a
  // copy; stage 3: the rank's partitions).
  std::vector<float> owned_parameters() const {
    return stage_->owned_parameters();
  }
  // Where the owned state sits in canonical order (the trainable
  // parameters concatenated in registration order, no padding): at stages
  // 1-3 each canonical element is in exactly one rank's segments, at stage
  // 0 in every rank's.
  std::vector<Segment> owned_segments() const {
    return stage_->owned_segments();
  }
  // The stage's resident bytes plus, under mixed precision and offload,
  // the model's own weights and one-backward gradients (at stage 3: the
  // bf16 copies of the pool's slots and the persistent groups), term by
  // term as memory_plan() plans them (Note [Memory plan] in
  // zero/schedule.h).
  MemoryStats memory() const;

 private:
  OptimizerHyper hyper(const StepOverrides& overrides = {}) const;
  // Every rank agrees that no rank is inside an accumulation window
  // (UsageError on every rank otherwise; zero/agreement.h).
  void require_between_windows(const char* what);

  Config config_;
  Communicator* comm_;
  std::shared_ptr<torch::nn::Module> model_;
  std::vector<torch::Tensor> params_;
  FlatLayout layout_;
  LossScaler scaler_;
  AccumulationBoundary boundary_;
  LrSchedule lr_schedule_;  // advances on every applied update
  // The first failed collective (or step()'s offload IoError); then every
  // further call is refused.
  FailureLatch latch_;
  // Stage 2 without a full buffer to stage the all-gather in: a failed
  // step() keeps this rank's elements, not the whole replica (Note
  // [Transactional update] in zero/stage.h).
  bool replica_may_tear_ = false;
  // NVMe offload: the devices (outlive the binding's stage).
  std::unique_ptr<OffloadDevices> offload_;
  // A model on a device (Note [Device kernels]): the kernels the engine
  // made for it, and the staging of a host-memory communicator.
  std::unique_ptr<Kernels> own_kernels_;
  std::unique_ptr<StagingCommunicator> staging_;
  std::unique_ptr<ParamBinding> binding_;
  Stage* stage_ = nullptr;             // binding_->stage()
  CheckpointFiles* checkpoint_files_;  // EngineOptions::checkpoint_files
  bool step_applied_ = false;
  double last_grad_norm_ = -1.0;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_ENGINE_H_
