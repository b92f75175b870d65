#include "engine/engine.h"

#include <ATen/native/Resize.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "offload/posix_block_device.h"
#include "zero/precision.h"
#include "zero/stage3.h"

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

std::vector<torch::Tensor> trainable(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : model.parameters(/*recurse=*/true))
    if (p.requires_grad()) out.push_back(p);
  return out;
}

std::vector<size_t> numels_of(const std::vector<torch::Tensor>& ps) {
  std::vector<size_t> n;
  for (const torch::Tensor& p : ps) n.push_back(static_cast<size_t>(p.numel()));
  return n;
}

// Runs after AccumulateGrad has added a backward's gradient into a
// parameter's .grad (a view of the flat gradient buffer): the point from
// which a stage may communicate that gradient (overlap_comm).
class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(std::function<void(size_t)> ready, size_t param_index)
      : ready_(std::move(ready)), param_index_(param_index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list&) override {
    ready_(param_index_);
    return outputs;
  }

 private:
  std::function<void(size_t)> ready_;
  size_t param_index_;
};

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

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model, const Config& config,
               Communicator* comm, const EngineOptions& options)
    : config_(config),
      comm_(comm),
      model_(std::move(model)),
      params_(trainable(*model_)),
      layout_(FlatLayout::make(numels_of(params_), comm->world_size())),
      scaler_(scaler_options(config.precision)),
      boundary_(boundary_options(config, comm->world_size())),
      lr_schedule_(config.scheduler, config.optimizer.lr) {
  ZS_CHECK(comm_ != nullptr);
  if (config_.world_size != comm_->world_size()) {
    throw UsageError("the config was parsed for world_size " +
                     std::to_string(config_.world_size) +
                     " but the communicator has " +
                     std::to_string(comm_->world_size()) +
                     " ranks. Fix: pass the communicator's world size to "
                     "parse_config");
  }
  for (const torch::Tensor& p : params_) {
    if (p.scalar_type() != torch::kFloat32 || !p.device().is_cpu()) {
      throw UsageError("trainable parameter of dtype " +
                       std::string(c10::toString(p.scalar_type())) + " on " +
                       p.device().str() +
                       ": this build trains float32 parameters on the CPU "
                       "(for bf16, pass the float32 model and enable bf16 "
                       "in the config)");
    }
  }
  // DeepSpeed's initialize converts the module; the float32 master weights
  // start from the bf16 values.
  if (dtype() == Precision::kBf16) model_->to(torch::kBFloat16);
  folded_.assign(params_.size(), 0);
  if (config_.zero.stage == 3) {
    setup_stage3(options);
  } else {
    setup_flat(options);
  }
  if (stage_->wants_grad_ready()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      // The parameter holds its accumulator weakly: keep it (and the hook)
      // alive for the engine's lifetime.
      grad_accumulators_.push_back(
          torch::autograd::impl::grad_accumulator(params_[i]));
      grad_accumulators_.back()->add_post_hook(std::make_unique<GradReadyHook>(
          [this](size_t p) { on_grad_ready(p); }, i));
    }
  }
}

BlockDevice* Engine::swap_device(const OffloadConfig& o, BlockDevice* given,
                                  const char* what,
                                  std::unique_ptr<BlockDevice>* owned) {
  if (o.device != OffloadDevice::kNvme) return nullptr;
  if (given != nullptr) return given;
  // The run's state comes from construction or load_checkpoint(), never
  // from what an earlier run left in the file.
  PosixDeviceOptions po;
  po.truncate = true;
  *owned = PosixBlockDevice::open_in_directory(
      o.nvme_path,
      "zerostep_rank" + std::to_string(comm_->rank()) + "_" + what + ".swap",
      po);
  return owned->get();
}

OptimizerSwap Engine::optimizer_swap(const EngineOptions& options) {
  const OffloadConfig& o = config_.zero.offload_optimizer;
  OptimizerSwap swap;
  swap.device =
      swap_device(o, options.optimizer_device, "optimizer", &owned_device_);
  swap.sub_group_numel = static_cast<size_t>(config_.zero.sub_group_size);
  swap.buffer_count = static_cast<size_t>(o.buffer_count);
  return swap;
}

ParamSwap Engine::param_swap(const EngineOptions& options) {
  const OffloadConfig& o = config_.zero.offload_param;
  ParamSwap swap;
  swap.device =
      swap_device(o, options.param_device, "params", &owned_param_device_);
  swap.sub_group_numel = static_cast<size_t>(config_.zero.sub_group_size);
  swap.buffer_count = static_cast<size_t>(o.buffer_count);
  return swap;
}

void Engine::setup_flat(const EngineOptions& options) {
  // Flat buffers, allocated once and touched once (zeros) up front.
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t padded = static_cast<int64_t>(layout_.padded_numel);
  flat_params_ = torch::zeros({padded}, f32);
  flat_grads_ = torch::zeros({padded}, f32);
  const bool bf16 = dtype() == Precision::kBf16;
  if (bf16) model_params_ = torch::zeros({padded}, torch::kBFloat16);
  if (folds_grads())
    model_grads_ = torch::zeros({padded}, bf16 ? torch::kBFloat16 : torch::kFloat32);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      const int64_t off = static_cast<int64_t>(layout_.offsets[i]);
      const int64_t n = static_cast<int64_t>(layout_.numels[i]);
      flat_params_.narrow(0, off, n).view(p.sizes()).copy_(p);
      const torch::Tensor& weights = bf16 ? model_params_ : flat_params_;
      p.set_data(weights.narrow(0, off, n).view(p.sizes()));
      // A defined .grad makes autograd accumulate in place (+=) into it.
      const torch::Tensor& grads = folds_grads() ? model_grads_ : flat_grads_;
      p.mutable_grad() = grads.narrow(0, off, n).view(p.sizes());
    }
  }
  // Every replica starts from rank 0's values.
  comm_->broadcast(
      Buffer::of(flat_params_.data_ptr<float>(), layout_.padded_numel),
      {0, phase::kSetup});
  sync_model_params();
  StageOptions so;
  so.stage = config_.zero.stage;
  so.layout = layout_;
  so.optimizer = hyper();
  so.reduce_bucket_size = config_.zero.reduce_bucket_size;
  so.allgather_bucket_size = config_.zero.allgather_bucket_size;
  so.overlap_comm = config_.zero.overlap_comm;
  so.grad_accum = config_.precision.grad_accum_dtype;
  so.optimizer_swap = optimizer_swap(options);
  stage_ = make_stage(
      so, {flat_params_.data_ptr<float>(), flat_grads_.data_ptr<float>()},
      comm_);
}

// Note [Stage 3 groups] (zero/stage3.h): each Zero3Block's parameters form
// one group; the rest, and parameters below the persistence threshold, form
// the persistent group. Each group gets one full parameter storage and one
// full gradient storage that the parameters and their .grad view for the
// engine's lifetime; releasing a group resizes its storage to zero bytes
// (views stay valid objects, and tensors autograd saved from them see the
// data again once the group is gathered for backward).
void Engine::setup_stage3(const EngineOptions& options) {
  // The innermost block that contains a parameter owns it.
  std::map<const void*, size_t> block_of_param;  // TensorImpl* → block index
  std::vector<torch::nn::Module*> blocks;
  for (const auto& item : model_->named_modules()) {
    torch::nn::Module* m = item.value().get();
    if (dynamic_cast<Zero3Block*>(m) == nullptr) continue;
    for (const torch::Tensor& p : m->parameters(/*recurse=*/true))
      block_of_param[p.unsafeGetTensorImpl()] = blocks.size();
    blocks.push_back(m);
  }
  const int64_t threshold = config_.zero.stage3_param_persistence_threshold;
  std::vector<Stage3Group> groups(blocks.size());
  Stage3Group persistent;
  persistent.persistent = true;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto it = block_of_param.find(params_[i].unsafeGetTensorImpl());
    Stage3Group& g =
        it == block_of_param.end() || params_[i].numel() < threshold
            ? persistent
            : groups[it->second];
    g.params.push_back(i);
    g.numel += static_cast<size_t>(params_[i].numel());
  }
  // Blocks left with no parameter of their own are not groups.
  std::vector<Stage3Group> used;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (groups[b].params.empty()) continue;
    block_group_[blocks[b]] = used.size();
    used.push_back(groups[b]);
  }
  if (!persistent.params.empty()) used.push_back(persistent);
  const size_t quantum = FlatLayout::kAlignNumel * comm_->world_size();
  std::vector<float*> initial;
  {
    torch::NoGradGuard no_grad;
    const bool bf16 = dtype() == Precision::kBf16;
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    const auto model_dtype = torch::TensorOptions().dtype(
        bf16 ? torch::kBFloat16 : torch::kFloat32);
    for (const Stage3Group& g : used) {
      const int64_t padded = static_cast<int64_t>(
          std::max(quantum, (g.numel + quantum - 1) / quantum * quantum));
      group_params_.push_back(torch::zeros({padded}, model_dtype));
      group_grads_.push_back(torch::zeros({padded}, model_dtype));
      if (bf16) {
        group_params32_.push_back(torch::zeros({padded}, f32));
        group_grads32_.push_back(torch::zeros({padded}, f32));
      }
      torch::Tensor& master = bf16 ? group_params32_.back() : group_params_.back();
      int64_t at = 0;
      for (size_t i : g.params) {
        torch::Tensor& p = params_[i];
        const int64_t n = p.numel();
        master.narrow(0, at, n).view(p.sizes()).copy_(p);
        p.set_data(group_params_.back().narrow(0, at, n).view(p.sizes()));
        p.mutable_grad() = group_grads_.back().narrow(0, at, n).view(p.sizes());
        at += n;
      }
      // Every replica starts from rank 0's values.
      comm_->broadcast(
          Buffer::of(master.data_ptr<float>(), static_cast<size_t>(padded)),
          {0, phase::kSetup});
      if (bf16) group_params_.back().copy_(master);
      initial.push_back(master.data_ptr<float>());
    }
  }
  StageOptions so;
  so.stage = 3;
  so.layout = layout_;
  so.optimizer = hyper();
  so.grad_accum = config_.precision.grad_accum_dtype;
  so.optimizer_swap = optimizer_swap(options);
  so.param_swap = param_swap(options);
  auto stage3 = std::make_unique<Stage3>(so, used, layout_.numels, initial,
                                         &group_storage_, comm_);
  stage3_ = stage3.get();
  stage_ = std::move(stage3);
  for (torch::nn::Module* b : blocks)
    dynamic_cast<Zero3Block*>(b)->set_zero3_hooks(this);
  blocks_ = blocks;
}

void* Engine::GroupStorageImpl::resize(torch::Tensor& t, bool zero) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  at::native::resize_bytes_cpu(storage, bytes);
  void* data = t.data_ptr();
  if (zero) std::memset(data, 0, bytes);
  return data;
}

void Engine::GroupStorageImpl::free(torch::Tensor& t) {
  at::native::resize_bytes_cpu(t.storage().unsafeGetStorageImpl(), 0);
}

// bf16: the model views bf16 storages; the stage gathers into and reduces
// from float32 ones, converted by the two hooks below.
float* Engine::GroupStorageImpl::materialize_params(size_t g) {
  void* model = resize(engine->group_params_[g], /*zero=*/false);
  if (engine->group_params32_.empty()) return static_cast<float*>(model);
  return static_cast<float*>(resize(engine->group_params32_[g], false));
}
void Engine::GroupStorageImpl::release_params(size_t g) {
  free(engine->group_params_[g]);
  if (!engine->group_params32_.empty()) free(engine->group_params32_[g]);
}
float* Engine::GroupStorageImpl::materialize_grads(size_t g) {
  void* model = resize(engine->group_grads_[g], /*zero=*/true);
  if (engine->group_grads32_.empty()) return static_cast<float*>(model);
  return static_cast<float*>(resize(engine->group_grads32_[g], true));
}
void Engine::GroupStorageImpl::release_grads(size_t g) {
  free(engine->group_grads_[g]);
  if (!engine->group_grads32_.empty()) free(engine->group_grads32_[g]);
}
void Engine::GroupStorageImpl::params_written(size_t g) {
  if (engine->group_params32_.empty()) return;
  torch::Tensor& model = engine->group_params_[g];
  to_bf16(engine->group_params32_[g].data_ptr<float>(),
          reinterpret_cast<uint16_t*>(model.data_ptr()),
          static_cast<size_t>(model.numel()));
}
void Engine::GroupStorageImpl::grads_ready(size_t g) {
  torch::Tensor& model = engine->group_grads_[g];
  const size_t n = static_cast<size_t>(model.numel());
  switch (engine->dtype()) {
    case Precision::kFp32:
      return;
    case Precision::kFp16:
      round_in_place(Precision::kFp16, model.data_ptr<float>(), n);
      return;
    case Precision::kBf16: {
      // The float32 buffer is zero here (fresh, or cleared after the
      // group's last reduce).
      auto* bits = reinterpret_cast<uint16_t*>(model.data_ptr());
      accumulate_bf16(engine->group_grads32_[g].data_ptr<float>(), bits, n,
                      Precision::kFp32);
      std::memset(bits, 0, n * sizeof(uint16_t));
      return;
    }
  }
}

namespace {

// Identity in forward; in backward, gathers the block's group (parameters
// and zeroed gradient storage) before the block's own backward runs.
struct GatherForBackward : public torch::autograd::Function<GatherForBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor output, int64_t stage3,
                               int64_t group) {
    ctx->saved_data["stage3"] = stage3;
    ctx->saved_data["group"] = group;
    return output;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    auto* stage3 = reinterpret_cast<Stage3*>(ctx->saved_data["stage3"].toInt());
    stage3->gather_for_backward(
        static_cast<size_t>(ctx->saved_data["group"].toInt()));
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool Engine::enter(torch::nn::Module& block) {
  auto it = block_group_.find(&block);
  if (it == block_group_.end()) return false;
  require_working_comm("a ZeRO-3 block's forward");
  try {
    stage3_->gather(it->second, phase::kForward);
  } catch (const CommError& e) {
    comm_failed(e, "the forward of a ZeRO-3 block (group " +
                       std::to_string(it->second) + ")",
                "no counter moved");
  }
  return true;
}

torch::Tensor Engine::exit(torch::nn::Module& block,
                           const torch::Tensor& output) {
  const size_t g = block_group_.at(&block);
  stage3_->release(g);
  if (!torch::GradMode::is_enabled() || !output.requires_grad()) return output;
  return GatherForBackward::apply(
      output, static_cast<int64_t>(reinterpret_cast<intptr_t>(stage3_)),
      static_cast<int64_t>(g));
}

void Engine::abandon(torch::nn::Module& block) {
  stage3_->release(block_group_.at(&block));
}

torch::Tensor Engine::full_parameters() {
  torch::Tensor out =
      torch::empty({static_cast<int64_t>(layout_.numel)}, torch::kFloat32);
  if (stage3_ != nullptr) {
    stage3_->full_parameters(out.data_ptr<float>(), phase::kSetup);
    return out;
  }
  out.copy_(flat_params_.narrow(0, 0, static_cast<int64_t>(layout_.numel)));
  return out;
}

MemoryStats Engine::memory() const {
  MemoryStats m = stage_->memory();
  auto bytes = [](const torch::Tensor& t) -> size_t {
    return t.defined() ? t.storage().nbytes() : 0;
  };
  // Mixed precision: the model's own copies, beside the stage's float32.
  size_t params = bytes(model_params_), grads = bytes(model_grads_);
  if (!group_params32_.empty()) {
    for (const torch::Tensor& t : group_params_) params += bytes(t);
    for (const torch::Tensor& t : group_grads_) grads += bytes(t);
  }
  m.param_bytes += params;
  m.grad_bytes += grads;
  // Stages 0-2 hold them from construction on; stage 3's come and go with
  // their groups and are not in its peak.
  if (stage3_ == nullptr) m.peak_bytes += params + grads;
  return m;
}

void Engine::reset_peak_memory() {
  if (stage3_ != nullptr) stage3_->reset_peak();
}

Engine::~Engine() {
  for (torch::nn::Module* b : blocks_) {
    auto* marked = dynamic_cast<Zero3Block*>(b);
    if (marked->zero3_hooks() == this) marked->set_zero3_hooks(nullptr);
  }
}

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
  return h;
}

void Engine::backward(const torch::Tensor& loss, bool scale_wrt_gas) {
  require_working_comm("backward()");
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
    std::fill(folded_.begin(), folded_.end(), 0);
    try {
      scaled.backward();
    } catch (const c10::Error& e) {
      throw UsageError(std::string("backward(): LibTorch's autograd failed "
                                   "on rank ") +
                       std::to_string(rank()) + ": " +
                       e.what_without_backtrace());
    }
    if (folds_grads())
      for (size_t i = 0; i < params_.size(); ++i) fold_grad(i);
    stage_->end_backward();
    if (plan.reduce_window) {
      stage_->reduce_window(index, boundary_.global_steps(), phase::kBackward);
    }
  } catch (const CommError& e) {
    comm_failed(e, "backward() number " + std::to_string(index) +
                       " of the window at global step " +
                       std::to_string(boundary_.global_steps()),
                "no counter moved");
  }
  boundary_.commit_backward(plan);
}

namespace {

void check_overrides(const StepOverrides& o) {
  std::vector<std::string> bad;
  auto check = [&](const char* name, const std::optional<double>& v,
                   bool ok, const char* rule) {
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
  check("weight_decay", o.weight_decay,
        o.weight_decay && std::isfinite(*o.weight_decay) && *o.weight_decay >= 0,
        "must be a finite number >= 0");
  check("gradient_clipping", o.gradient_clipping,
        o.gradient_clipping && std::isfinite(*o.gradient_clipping) &&
            *o.gradient_clipping >= 0,
        "must be a finite number >= 0 (0 = off)");
  if (bad.empty()) return;
  std::string msg = "step(): invalid per-step hyperparameters: ";
  for (size_t i = 0; i < bad.size(); ++i) msg += (i ? "; " : "") + bad[i];
  throw UsageError(msg + ". Nothing was changed; fix the values and call "
                         "step() again");
}

}  // namespace

void Engine::require_working_comm(const char* what) const {
  if (comm_failure_.empty()) return;
  throw UsageError(std::string(what) + " on rank " + std::to_string(rank()) +
                   " after a collective or the optimizer's device failed in "
                   "an earlier call (" +
                   comm_failure_ +
                   "). The window's gradients are lost and the ranks may be "
                   "out of step. Fix: build a new world and new engines, "
                   "and load the last checkpoint");
}

void Engine::comm_failed(const CommError& e, const std::string& call,
                         const std::string& unchanged) {
  comm_failure_ = e.what();
  throw CommError(call + " failed on rank " + std::to_string(rank()) + ": " +
                  e.what() + ". Parameters and optimizer state are as before "
                  "the call and " + unchanged +
                  " (Note [Transactional update]); the window's gradients "
                  "are lost");
}

void Engine::step(const StepOverrides& overrides) {
  require_working_comm("step()");
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
        stage_->apply_update(hyper(overrides));
        sync_model_params();
        last_grad_norm_ = stats.global_norm;
      }
      stage_->zero_grad();
    }
  } catch (const CommError& e) {
    boundary_.abort_step();
    comm_failed(e,
                "step() at global step " +
                    std::to_string(boundary_.global_steps()) +
                    " (window of " + std::to_string(plan.window_backwards) +
                    " backward() calls)",
                "global_steps, global_samples and the lr schedule did not "
                "advance");
  } catch (const IoError& e) {
    // The NVMe optimizer state's device failed on this rank (the others
    // fail in this step's collectives). The update was undone (Note
    // [Transactional update]), but finalize() has already changed the
    // window's gradients.
    boundary_.abort_step();
    comm_failure_ = e.what();
    throw IoError("step() at global step " +
                  std::to_string(boundary_.global_steps()) + " failed on rank " +
                  std::to_string(rank()) + ": " + e.what() +
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

bool Engine::folds_grads() const {
  return dtype() != Precision::kFp32 && config_.zero.stage != 3;
}

void Engine::fold_grad(size_t i) {
  if (folded_[i]) return;
  folded_[i] = 1;
  const size_t off = layout_.offsets[i], n = layout_.numels[i];
  float* acc = flat_grads_.data_ptr<float>() + off;
  // Stage 2 reduces each backward's gradient (the flat buffer is zero
  // here) and accumulates the partitions itself in grad_accum_dtype.
  const Precision acc_p = config_.zero.stage >= 2
                              ? Precision::kFp32
                              : config_.precision.grad_accum_dtype;
  if (dtype() == Precision::kBf16) {
    auto* g = reinterpret_cast<uint16_t*>(model_grads_.data_ptr()) + off;
    accumulate_bf16(acc, g, n, acc_p);
    std::memset(g, 0, n * sizeof(uint16_t));
  } else {
    float* g = model_grads_.data_ptr<float>() + off;
    accumulate(acc, g, n, Precision::kFp16, acc_p);
    std::memset(g, 0, n * sizeof(float));
  }
}

void Engine::on_grad_ready(size_t i) {
  if (folds_grads()) fold_grad(i);
  stage_->on_grad_ready(i);
}

void Engine::sync_model_params() {
  if (dtype() != Precision::kBf16 || stage3_ != nullptr) return;
  to_bf16(flat_params_.data_ptr<float>(),
          reinterpret_cast<uint16_t*>(model_params_.data_ptr()),
          layout_.padded_numel);
}

bool Engine::is_gradient_accumulation_boundary() const {
  return boundary_.is_gradient_accumulation_boundary();
}

void Engine::set_gradient_accumulation_boundary(bool is_boundary) {
  boundary_.set_gradient_accumulation_boundary(is_boundary);
}

torch::Tensor Engine::flat_parameters() const {
  require_flat("flat_parameters");
  return flat_params_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

torch::Tensor Engine::flat_gradients() const {
  require_flat("flat_gradients");
  return flat_grads_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

void Engine::require_flat(const char* what) const {
  if (stage3_ == nullptr) return;
  throw UsageError(std::string(what) +
                   "() is not available at ZeRO stage 3: parameters and "
                   "gradients are partitioned at rest. Fix: use "
                   "full_parameters() (a collective: call it on every rank)");
}

}  // namespace zerostep

namespace zerostep {
namespace {

constexpr const char* kFormat = "zerostep-checkpoint-1";

std::string rank_file(int r) { return "rank_" + std::to_string(r) + ".bin"; }

}  // namespace

void Engine::require_between_windows(const char* what) {
  // Every rank learns every rank's window, so all agree on the answer.
  int64_t mine = boundary_.window_backwards();
  std::vector<int64_t> all(world_size());
  comm_->all_gather(Buffer::of(&mine, 1), Buffer::of(all.data(), all.size()),
                    {phase::kSetup});
  for (int r = 0; r < world_size(); ++r)
    if (all[r] != 0)
      throw UsageError(std::string(what) + " inside an open accumulation "
                       "window (rank " + std::to_string(r) + " has " +
                       std::to_string(all[r]) + " backward() call(s) since "
                       "its last step()): checkpoints are taken between "
                       "windows. Fix: call step() first. Nothing was written");
}

void Engine::save_checkpoint(const std::string& dir, const std::string& tag) {
  if (tag.empty() || tag.find('/') != std::string::npos || tag == "latest")
    throw UsageError("checkpoint tag '" + tag + "' must be a non-empty name "
                     "without '/' other than 'latest'");
  require_between_windows("save_checkpoint()");
  const std::string folder = dir + "/" + tag;
  // Each rank writes its file; failures are shared so every rank throws.
  std::string error;
  uint64_t bytes = 0, checksum = 0;
  try {
    make_dirs(folder);
    RankState st;
    st.rank = rank();
    st.segments = stage_->owned_segments();
    st.params = stage_->owned_parameters();
    st.exp_avg = stage_->optimizer().exp_avg();
    st.exp_avg_sq = stage_->optimizer().exp_avg_sq();
    const std::string encoded = encode_rank_state(st);
    atomic_write_file(folder + "/" + rank_file(rank()), encoded);
    bytes = encoded.size();
    checksum = fnv1a64(encoded.data(), encoded.size());
  } catch (const Error& e) {
    error = e.what();
  }
  int64_t mine[3] = {error.empty() ? 0 : 1, static_cast<int64_t>(bytes),
                     static_cast<int64_t>(checksum)};
  std::vector<int64_t> all(3 * world_size());
  comm_->all_gather(Buffer::of(mine, 3), Buffer::of(all.data(), all.size()),
                    {phase::kSetup});
  for (int r = 0; r < world_size(); ++r)
    if (all[3 * r] != 0)
      throw IoError("save_checkpoint('" + folder + "') failed on rank " +
                    std::to_string(r) +
                    (r == rank() ? ": " + error : std::string()) +
                    ". The previous checkpoint is untouched");
  // Rank 0 writes the manifest, then `latest`, and tells everyone whether
  // that worked, so every rank returns (or throws) together.
  int64_t manifest_failed = 0;
  std::string manifest_error;
  if (rank() == 0) {
    nlohmann::json m;
    m["format"] = kFormat;
    m["world_size"] = world_size();
    m["stage"] = config_.zero.stage;
    m["numel"] = layout_.numel;
    m["param_numels"] = layout_.numels;
    m["optimizer"] = to_string(config_.optimizer.type);
    m["optimizer_steps"] = stage_->optimizer().step_count();
    const auto c = boundary_.counters();
    m["counters"] = {{"micro_steps", c.micro_steps},
                     {"global_steps", c.global_steps},
                     {"global_samples", c.global_samples},
                     {"skipped_steps", c.skipped_steps}};
    m["lr_schedule_iteration"] = lr_schedule_.last_batch_iteration();
    m["dtype"] = to_string(dtype());
    const LossScaler::State& ls = scaler_.state();
    m["loss_scaler"] = {{"scale", ls.scale},
                        {"iteration", ls.iteration},
                        {"last_overflow_iteration", ls.last_overflow_iteration},
                        {"hysteresis_left", ls.hysteresis_left}};
    nlohmann::json files = nlohmann::json::array();
    for (int r = 0; r < world_size(); ++r)
      files.push_back({{"name", rank_file(r)},
                       {"bytes", static_cast<uint64_t>(all[3 * r + 1])},
                       {"fnv1a", static_cast<uint64_t>(all[3 * r + 2])}});
    m["files"] = files;
    // Manifest last, then `latest`: a crash before either leaves the
    // previous checkpoint the current one.
    try {
      atomic_write_file(folder + "/manifest.json", m.dump(1));
      atomic_write_file(dir + "/latest", tag + "\n");
    } catch (const Error& e) {
      manifest_failed = 1;
      manifest_error = e.what();
    }
  }
  comm_->broadcast(Buffer::of(&manifest_failed, 1), {0, phase::kSetup});
  if (manifest_failed != 0)
    throw IoError("save_checkpoint('" + folder + "') could not write its "
                  "manifest on rank 0" +
                  (rank() == 0 ? ": " + manifest_error : std::string()) +
                  ". The previous checkpoint is untouched");
}

void Engine::load_checkpoint(const std::string& dir, const std::string& tag_in,
                             const LoadOptions& options) {
  if (boundary_.window_backwards() != 0 || boundary_.in_step())
    throw UsageError("load_checkpoint() inside an open accumulation window: "
                     "call step() first. Nothing was changed");
  std::string tag = tag_in;
  if (tag.empty()) {
    tag = read_file(dir + "/latest");
    while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' '))
      tag.pop_back();
  }
  const std::string folder = dir + "/" + tag;
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_file(folder + "/manifest.json"));
    if (m.at("format").get<std::string>() != kFormat)
      throw IoError("'" + folder + "/manifest.json' is not a " + kFormat +
                    " manifest");
  } catch (const nlohmann::json::exception& e) {
    throw IoError("checkpoint manifest '" + folder +
                  "/manifest.json' is corrupt: " + e.what() +
                  ". Nothing was changed");
  }
  auto mismatch = [&](const std::string& what, const std::string& theirs,
                      const std::string& ours, const std::string& fix) {
    throw UsageError("checkpoint '" + folder + "' was written with " + what +
                     " " + theirs + ", this engine has " + ours + ". " + fix +
                     " Nothing was changed");
  };
  const auto numels = m.at("param_numels").get<std::vector<size_t>>();
  if (numels != layout_.numels)
    mismatch("a model of " + std::to_string(numels.size()) + " parameters",
             "(" + std::to_string(m.at("numel").get<size_t>()) + " elements)",
             std::to_string(layout_.numels.size()) + " (" +
                 std::to_string(layout_.numel) + " elements)",
             "Load it into the same model.");
  if (m.at("optimizer").get<std::string>() != to_string(config_.optimizer.type))
    mismatch("optimizer", m.at("optimizer").get<std::string>(),
             to_string(config_.optimizer.type), "Use the same optimizer.");
  const int their_world = m.at("world_size").get<int>();
  const int their_stage = m.at("stage").get<int>();
  if (!options.allow_reshard && (their_world != world_size() ||
                                 their_stage != config_.zero.stage))
    mismatch("world size / ZeRO stage",
             std::to_string(their_world) + " / " + std::to_string(their_stage),
             std::to_string(world_size()) + " / " +
                 std::to_string(config_.zero.stage),
             "Pass LoadOptions{.allow_reshard = true} to re-partition it.");
  // Read and verify every rank file, assembling the canonical vectors.
  const size_t n = layout_.numel;
  const bool has_m = !stage_->optimizer().exp_avg().empty();
  const bool has_v = !stage_->optimizer().exp_avg_sq().empty();
  std::vector<float> params(n, 0.0f), exp_avg(has_m ? n : 0, 0.0f),
      exp_avg_sq(has_v ? n : 0, 0.0f);
  std::vector<char> covered(n, 0);
  for (const auto& f : m.at("files")) {
    const std::string path = folder + "/" + f.at("name").get<std::string>();
    const std::string bytes = read_file(path);
    if (bytes.size() != f.at("bytes").get<uint64_t>() ||
        fnv1a64(bytes.data(), bytes.size()) != f.at("fnv1a").get<uint64_t>())
      throw IoError("checkpoint file '" + path + "' does not match its "
                    "manifest (size or checksum): truncated or replaced. "
                    "Nothing was changed");
    RankState st = decode_rank_state(bytes, path);
    if (has_m != !st.exp_avg.empty() || has_v != !st.exp_avg_sq.empty())
      mismatch("optimizer state", "of another shape", "its own",
               "Use the same optimizer settings.");
    for (const Segment& g : st.segments) {
      if (g.canonical_offset + g.numel > n)
        throw IoError("checkpoint file '" + path + "' maps state outside the "
                      "model. Nothing was changed");
      std::memcpy(params.data() + g.canonical_offset,
                  st.params.data() + g.state_offset, g.numel * sizeof(float));
      if (has_m)
        std::memcpy(exp_avg.data() + g.canonical_offset,
                    st.exp_avg.data() + g.state_offset, g.numel * sizeof(float));
      if (has_v)
        std::memcpy(exp_avg_sq.data() + g.canonical_offset,
                    st.exp_avg_sq.data() + g.state_offset,
                    g.numel * sizeof(float));
      std::fill(covered.begin() + g.canonical_offset,
                covered.begin() + g.canonical_offset + g.numel, 1);
    }
  }
  if (std::find(covered.begin(), covered.end(), 0) != covered.end())
    throw IoError("checkpoint '" + folder + "' does not cover every "
                  "parameter (a rank file is missing from the manifest). "
                  "Nothing was changed");
  const auto& c = m.at("counters");
  AccumulationBoundary::Counters counters{
      c.at("micro_steps").get<int64_t>(), c.at("global_steps").get<int64_t>(),
      c.at("global_samples").get<int64_t>(),
      c.at("skipped_steps").get<int64_t>()};
  // The loss scale continues only into fp16 training.
  std::optional<LossScaler::State> scaler_state;
  if (dtype() == Precision::kFp16 && m.contains("loss_scaler") &&
      m.value("dtype", "fp32") == "fp16") {
    const auto& ls = m.at("loss_scaler");
    scaler_state = LossScaler::State{
        ls.at("scale").get<double>(), ls.at("iteration").get<int64_t>(),
        ls.at("last_overflow_iteration").get<int64_t>(),
        ls.at("hysteresis_left").get<int64_t>()};
  }
  // Everything is verified: apply.
  int64_t optimizer_steps = m.at("optimizer_steps").get<int64_t>();
  if (!options.load_optimizer_states) {
    std::fill(exp_avg.begin(), exp_avg.end(), 0.0f);
    std::fill(exp_avg_sq.begin(), exp_avg_sq.end(), 0.0f);
    optimizer_steps = 0;
  }
  stage_->load_state(params, exp_avg, exp_avg_sq, optimizer_steps);
  sync_model_params();
  if (scaler_state) scaler_.restore(*scaler_state);
  boundary_.restore(counters);
  lr_schedule_.set_last_batch_iteration(
      m.at("lr_schedule_iteration").get<int64_t>());
}

void Engine::export_full_model(const std::string& path) {
  torch::Tensor all = full_parameters();
  if (rank() != 0) return;
  nlohmann::json h;
  h["format"] = "zerostep-model-1";
  nlohmann::json params = nlohmann::json::array();
  size_t i = 0;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    params.push_back({{"name", item.key()},
                      {"shape", item.value().sizes().vec()},
                      {"numel", layout_.numels[i++]}});
  }
  h["params"] = params;
  h["dtype"] = "float32";
  const std::string header = h.dump();
  std::string out = "ZSMODEL1";
  for (int b = 0; b < 8; ++b)
    out.push_back(static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * b)));
  out += header;
  out.append(reinterpret_cast<const char*>(all.data_ptr<float>()),
             static_cast<size_t>(all.numel()) * sizeof(float));
  atomic_write_file(path, out);
}

}  // namespace zerostep
