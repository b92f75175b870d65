#include "engine/engine.h"

#include <cmath>
#include <string>

#include "blocks/zero3_block.h"
#include "common/errors.h"
#include "common/log.h"
#include "engine/stage_factory.h"
#include "engine/torch_kernels.h"
#include "precision/precision.h"
#include "zero/phase.h"
#include "zero/stage.h"

namespace zerostep {
namespace {

BoundaryOptions boundary_options(const Config& c, int world_size) {
  BoundaryOptions o;
  o.managed = c.managed_gradient_accumulation;
  o.gradient_accumulation_steps = c.gradient_accumulation_steps;
  o.train_batch_size = c.train_batch_size;
  o.micro_batch_size = c.train_micro_batch_size_per_gpu;
  o.world_size = world_size;
  return o;
}

std::vector<size_t> numels_of(const std::vector<torch::Tensor>& ps) {
  std::vector<size_t> n;
  for (const torch::Tensor& p : ps) n.push_back(static_cast<size_t>(p.numel()));
  return n;
}

LossScalerOptions scaler_options(const PrecisionConfig& p) {
  LossScalerOptions o;
  o.dynamic = p.dtype == Precision::kFp16 && p.loss_scale == 0.0;
  o.static_scale = p.dtype == Precision::kFp16 ? p.loss_scale : 1.0;
  o.initial_scale_power = p.initial_scale_power;
  o.scale_window = p.loss_scale_window;
  o.hysteresis = p.hysteresis;
  o.consecutive_hysteresis = p.consecutive_hysteresis;
  o.min_scale = p.min_loss_scale;
  return o;
}

// Float32 parameters, all on one device; off the host, the stage works on
// that device (Note [Device kernels] in zero/kernels.h, Note [Stage 3 on a
// device] in zero/stage3.h) or, with offload, on the host (Note
// [ZeRO-Offload] in engine/flat_binding.h, Note [Stage 3 offload from a
// device] in zero/stage3.h).
void check_parameter_devices(const std::vector<torch::Tensor>& params) {
  for (const torch::Tensor& p : params) {
    if (p.scalar_type() != torch::kFloat32)
      throw UsageError("trainable parameter of dtype " +
                       std::string(c10::toString(p.scalar_type())) +
                       ": the engine takes a float32 model (for bf16 or "
                       "fp16, pass the float32 model and enable bf16 or "
                       "fp16 in the config)");
    if (p.device() != params.front().device())
      throw UsageError("trainable parameters on " +
                       params.front().device().str() + " and on " +
                       p.device().str() +
                       ": every trainable parameter must be on one device. "
                       "Fix: move the whole model with model->to(device)");
  }
}

// A model built on the meta device: its frozen parameters are read whole
// from `source` (they are never partitioned) and its buffers must not be
// on meta; the trainable ones stay for the binding, which reads only what
// the rank holds. Returns the trainable parameters' names, in
// trainable_parameters() order.
std::vector<std::string> materialize_meta(torch::nn::Module& model,
                                          const ParameterSource* source) {
  std::vector<std::string> names;
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    torch::Tensor& p = item.value();
    if (p.requires_grad()) {
      names.push_back(item.key());
      continue;
    }
    if (!p.is_meta()) continue;
    torch::Tensor values = torch::empty(p.sizes(), torch::kFloat32);
    internal::read_from_source(source, item.key(), 0, p.numel(),
                               Precision::kFp32, values.data_ptr<float>());
    internal::bind_parameter(p, values);
  }
  for (const auto& item : model.named_buffers(/*recurse=*/true))
    if (item.value().is_meta())
      throw UsageError("buffer " + item.key() +
                       " is on the meta device: the engine reads parameters "
                       "from EngineOptions::parameter_source, not buffers. "
                       "Fix: build buffers on the device the model trains "
                       "on (only parameters may be on meta)");
  return names;
}

// Which kernels work on which memory (Note [Device kernels]): `stage`, the
// stage's own buffers (nullptr: the host's); `groups`, stage 3's gathered
// groups when they are elsewhere (Note [Stage 3 offload from a device]).
struct ChosenKernels {
  Kernels* stage = nullptr;
  Kernels* groups = nullptr;
};

// The caller's kernels, a TorchKernels on the model's device, or none,
// where kernel_placement() puts them (Note [Stage factory]).
ChosenKernels choose_kernels(const std::vector<torch::Tensor>& params,
                             const ZeroConfig& zero, Kernels* given,
                             std::unique_ptr<Kernels>* own) {
  const KernelPlacement placement = kernel_placement(zero);
  auto placed = [&](Kernels* k) {
    return placement == KernelPlacement::kGroups ? ChosenKernels{nullptr, k}
                                                 : ChosenKernels{k, nullptr};
  };
  if (given != nullptr) {
    if (placement == KernelPlacement::kNone)
      throw UsageError(
          "EngineOptions::kernels is given with zero_optimization.stage " +
          std::to_string(zero.stage) +
          " and offload_optimizer: at stages 1-2 offload keeps the state on "
          "the host and moves the model's gradients and weights with "
          "LibTorch copies, so no kernels are used. Fix: leave "
          "EngineOptions::kernels unset");
    return placed(given);
  }
  if (internal::model_device(params).is_cpu()) return {};
  if (placement == KernelPlacement::kNone) return {};  // Note [ZeRO-Offload]
  *own = std::make_unique<TorchKernels>(params.front().device());
  return placed(own->get());
}

void check_overrides(const StepOverrides& o) {
  std::vector<std::string> bad;
  auto check = [&](const char* name, const std::optional<double>& v, bool ok,
                   const char* rule) {
    if (v && !ok)
      bad.push_back(std::string(name) + " = " + std::to_string(*v) + " " +
                    rule);
  };
  check("lr", o.lr, o.lr && std::isfinite(*o.lr) && *o.lr >= 0,
        "must be a finite number >= 0");
  check("beta1", o.beta1, o.beta1 && *o.beta1 >= 0 && *o.beta1 < 1,
        "must be in [0, 1)");
  check("beta2", o.beta2, o.beta2 && *o.beta2 >= 0 && *o.beta2 < 1,
        "must be in [0, 1)");
  check("eps", o.eps, o.eps && *o.eps > 0, "must be > 0");
  check(
      "weight_decay", o.weight_decay,
      o.weight_decay && std::isfinite(*o.weight_decay) && *o.weight_decay >= 0,
      "must be a finite number >= 0");
  check("gradient_clipping", o.gradient_clipping,
        o.gradient_clipping && std::isfinite(*o.gradient_clipping) &&
            *o.gradient_clipping >= 0,
        "must be a finite number >= 0 (0 = off)");
  if (bad.empty()) return;
  std::string msg = "step(): invalid per-step hyperparameters: ";
  for (size_t i = 0; i < bad.size(); ++i) msg += (i ? "; " : "") + bad[i];
  throw UsageError(msg +
                   ". Nothing was changed; fix the values and call "
                   "step() again");
}

}  // namespace

void check_step_overrides(const StepOverrides& overrides) {
  check_overrides(overrides);
}

Engine::Engine(std::shared_ptr<torch::nn::Module> model, const Config& config,
               Communicator* comm, const EngineOptions& options)
    : config_(config),
      comm_(comm),
      model_(std::move(model)),
      params_(trainable_parameters(*model_)),
      layout_(FlatLayout::make(numels_of(params_), comm->world_size())),
      scaler_(scaler_options(config.precision)),
      boundary_(boundary_options(config, comm->world_size())),
      lr_schedule_(config.scheduler, config.optimizer.lr),
      latch_(comm->rank()),
      checkpoint_files_(options.checkpoint_files != nullptr
                            ? options.checkpoint_files
                            : &posix_checkpoint_files()) {
  ZS_CHECK(comm_ != nullptr);
  if (config_.world_size != comm_->world_size()) {
    throw UsageError("the config was parsed for world_size " +
                     std::to_string(config_.world_size) +
                     " but the communicator has " +
                     std::to_string(comm_->world_size()) +
                     " ranks. Fix: pass the communicator's world size to "
                     "parse_config");
  }
  check_parameter_devices(params_);
  const ChosenKernels kernels =
      choose_kernels(params_, config_.zero, options.kernels, &own_kernels_);
  // A host-memory backend carries the device's buffers through host copies.
  Kernels* device = kernels.groups != nullptr ? kernels.groups : kernels.stage;
  if (device != nullptr && !device->host_addressable() &&
      !comm_->reads_device_memory()) {
    staging_ = std::make_unique<StagingCommunicator>(comm_, device);
    comm_ = staging_.get();
  }
  offload_ = std::make_unique<OffloadDevices>(config_.zero, comm_->rank(),
                                              options.optimizer_device,
                                              options.param_device);
  // DeepSpeed's initialize converts the module; the float32 master weights
  // start from the bf16 values.
  const std::vector<std::string> names =
      materialize_meta(*model_, options.parameter_source);
  if (dtype() == Precision::kBf16) model_->to(torch::kBFloat16);
  // Note [Stage factory]: the stage and its options, chosen from the config.
  StageResources resources;
  resources.layout = layout_;
  resources.optimizer = hyper();
  resources.optimizer_swap = offload_->optimizer_swap();
  resources.param_swap = offload_->param_swap();
  resources.kernels = kernels.stage;
  resources.group_kernels = kernels.groups;
  resources.collectives_outside_backward =
      options.stage3_collectives_outside_backward;
  const StageChoice chosen = choose_stage(config_, resources);
  BindingOptions bo;
  bo.stage = chosen.options;
  bo.fold_accum = chosen.fold_accum;
  bo.dtype = dtype();
  bo.persistence_threshold = config_.zero.stage3_param_persistence_threshold;
  bo.offload = config_.zero.offload_optimizer.device != OffloadDevice::kNone;
  bo.pin_memory = config_.zero.offload_optimizer.pin_memory;
  bo.offload_staging_on_cpu = options.offload_staging_on_cpu;
  bo.source = options.parameter_source;
  bo.names = names;
  // Note [Transactional update]: what a failed step() keeps as it was.
  replica_may_tear_ = chosen.replica_may_tear;
  binding_ = make_param_binding(model_, params_, bo, comm_, &latch_);
  stage_ = &binding_->stage();
  // Once per run, not once per rank.
  const std::string ignored = ignored_keys_note(config_);
  if (comm_->rank() == 0 && !ignored.empty())
    log_message(LogLevel::kInfo, ignored);
}

Engine::~Engine() = default;

OptimizerHyper Engine::hyper(const StepOverrides& o) const {
  OptimizerHyper h;
  switch (config_.optimizer.type) {
    case OptimizerType::kAdam:
      h.kind = OptimizerKind::kAdam;
      break;
    case OptimizerType::kAdamW:
      h.kind = OptimizerKind::kAdamW;
      break;
    case OptimizerType::kSGD:
      h.kind = OptimizerKind::kSGD;
      break;
  }
  h.lr = o.lr.value_or(lr_schedule_.lr());
  h.beta1 = o.beta1.value_or(config_.optimizer.beta1);
  h.beta2 = o.beta2.value_or(config_.optimizer.beta2);
  h.eps = o.eps.value_or(config_.optimizer.eps);
  h.weight_decay = o.weight_decay.value_or(config_.optimizer.weight_decay);
  h.momentum = config_.optimizer.momentum;
  h.bias_correction = config_.optimizer.bias_correction;
  // The host's AdamW splits its pass like LibTorch's own ops (and its fused
  // AdamW): over the intra-op threads, which set_compute_threads sets.
  h.threads = torch::get_num_threads();
  return h;
}

void Engine::backward(const torch::Tensor& loss, bool scale_wrt_gas) {
  latch_.require_working("backward()");
  const BackwardPlan plan = boundary_.plan_backward();
  if (!loss.defined() || loss.numel() != 1) {
    throw UsageError("backward(loss): loss must be a defined scalar tensor");
  }
  torch::Tensor scaled = loss;
  if (scale_wrt_gas &&
      config_.gradient_accumulation_scaling == GradAccumScaling::kConfigured &&
      config_.gradient_accumulation_steps > 1) {
    scaled = loss / static_cast<double>(config_.gradient_accumulation_steps);
  }
  if (dtype() == Precision::kFp16) scaled = scaled * scaler_.scale();
  const int64_t index = boundary_.window_backwards() + 1;
  try {
    stage_->begin_backward(index, boundary_.global_steps());
    if (plan.reduce_window)
      stage_->begin_boundary_backward(index, boundary_.global_steps());
    binding_->begin_backward();
    try {
      scaled.backward();
    } catch (const c10::Error& e) {
      throw UsageError(std::string("backward(): LibTorch's autograd failed "
                                   "on rank ") +
                       std::to_string(rank()) + ": " +
                       e.what_without_backtrace());
    }
    binding_->end_backward();
    stage_->end_backward();
    if (plan.reduce_window) {
      stage_->reduce_window(index, boundary_.global_steps(), phase::kBackward);
    }
  } catch (const CommError& e) {
    latch_.comm_failed(e,
                       "backward() number " + std::to_string(index) +
                           " of the window at global step " +
                           std::to_string(boundary_.global_steps()),
                       "no counter moved");
  }
  boundary_.commit_backward(plan);
}

void Engine::step(const StepOverrides& overrides) {
  latch_.require_working("step()");
  check_overrides(overrides);
  const StepPlan plan = boundary_.plan_step();
  const bool fp16 = dtype() == Precision::kFp16;
  bool overflow = false;
  boundary_.enter_step();
  try {
    if (plan.apply_update) {
      if (plan.reduce_window_first) {
        stage_->reduce_window(plan.window_backwards, boundary_.global_steps(),
                              phase::kStep);
      }
      double divisor = config_.gradient_accumulation_scaling ==
                               GradAccumScaling::kPerStepCount
                           ? static_cast<double>(plan.window_backwards)
                           : 1.0;
      // fp16: unscale with the same division.
      if (fp16) divisor *= scaler_.scale();
      GradStats stats = stage_->finalize(
          divisor,
          overrides.gradient_clipping.value_or(config_.gradient_clipping));
      // The norm sums every element of every rank's partition: it is
      // finite exactly when no gradient of the window overflowed, and every
      // rank computes the same value, so all ranks skip together.
      overflow = fp16 && !std::isfinite(stats.global_norm);
      if (!overflow) {
        // All or nothing: Note [Transactional update] (zero/stage.h).
        binding_->will_write_params();
        stage_->apply_update(hyper(overrides));
        binding_->params_written();
        last_grad_norm_ = stats.global_norm;
      }
      stage_->zero_grad();
    }
  } catch (const CommError& e) {
    boundary_.abort_step();
    latch_.comm_failed(
        e,
        "step() at global step " + std::to_string(boundary_.global_steps()) +
            " (window of " + std::to_string(plan.window_backwards) +
            " backward() calls)",
        "global_steps, global_samples and the lr schedule did "
        "not advance",
        replica_may_tear_
            ? "This rank's own elements of the parameters (what a "
              "checkpoint saves; the elements other ranks own may hold the "
              "update) and the optimizer state are"
            : "Parameters and optimizer state are");
  } catch (const IoError& e) {
    // The NVMe optimizer state's device failed on this rank (the others
    // fail in this step's collectives). The update was undone (Note
    // [Transactional update]), but finalize() has already changed the
    // window's gradients.
    boundary_.abort_step();
    latch_.record(e.what());
    throw IoError(
        "step() at global step " + std::to_string(boundary_.global_steps()) +
        " failed on rank " + std::to_string(rank()) + ": " + e.what() +
        ". Parameters and optimizer state are as before the call "
        "and no counter moved (Note [Transactional update]); the "
        "window's gradients are lost. Fix: check the drive, then "
        "build new engines and load the last checkpoint");
  } catch (...) {
    boundary_.abort_step();
    throw;
  }
  const bool applied = plan.apply_update && !overflow;
  boundary_.finish_step(plan, applied);
  step_applied_ = applied;
  if (applied) lr_schedule_.advance();
  // May throw at the minimum scale; the skip is complete by then.
  if (plan.apply_update && fp16) scaler_.update(overflow);
}

bool Engine::is_gradient_accumulation_boundary() const {
  return boundary_.is_gradient_accumulation_boundary();
}

void Engine::set_gradient_accumulation_boundary(bool is_boundary) {
  boundary_.set_gradient_accumulation_boundary(is_boundary);
}

torch::Tensor Engine::flat_parameters() const {
  return binding_->flat_parameters();
}

torch::Tensor Engine::flat_gradients() const {
  return binding_->flat_gradients();
}

torch::Tensor Engine::full_parameters() { return binding_->full_parameters(); }

MemoryStats Engine::memory() const { return binding_->memory(); }

void Engine::reset_peak_memory() { binding_->reset_peak_memory(); }

}  // namespace zerostep
