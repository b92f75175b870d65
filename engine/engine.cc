#include "engine/engine.h"

#include <sstream>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "common/errors.h"

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
  GradReadyHook(Stage* stage, size_t param_index)
      : stage_(stage), param_index_(param_index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list&) override {
    stage_->on_grad_ready(param_index_);
    return outputs;
  }

 private:
  Stage* stage_;
  size_t param_index_;
};

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model, const Config& config,
               Communicator* comm)
    : config_(config),
      comm_(comm),
      model_(std::move(model)),
      params_(trainable(*model_)),
      layout_(FlatLayout::make(numels_of(params_), comm->world_size())),
      boundary_(boundary_options(config, comm->world_size())) {
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
                       std::string(c10::toString(p.scalar_type())) +
                       " on " + p.device().str() +
                       ": this build trains float32 parameters on the CPU");
    }
  }
  // Flat buffers, allocated once and touched once (zeros) up front.
  auto opts = torch::TensorOptions().dtype(torch::kFloat32);
  flat_params_ = torch::zeros({static_cast<int64_t>(layout_.padded_numel)}, opts);
  flat_grads_ = torch::zeros({static_cast<int64_t>(layout_.padded_numel)}, opts);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      const int64_t off = static_cast<int64_t>(layout_.offsets[i]);
      const int64_t n = static_cast<int64_t>(layout_.numels[i]);
      torch::Tensor view = flat_params_.narrow(0, off, n).view(p.sizes());
      view.copy_(p);
      p.set_data(view);
      // A defined .grad makes autograd accumulate in place (+=) into it.
      p.mutable_grad() = flat_grads_.narrow(0, off, n).view(p.sizes());
    }
  }
  // Every replica starts from rank 0's values.
  comm_->broadcast(Buffer::of(flat_params_.data_ptr<float>(),
                              layout_.padded_numel),
                   {0, Phase::kSetup});
  StageOptions so;
  so.stage = config_.zero.stage;
  so.layout = layout_;
  so.optimizer = hyper();
  so.reduce_bucket_size = config_.zero.reduce_bucket_size;
  so.allgather_bucket_size = config_.zero.allgather_bucket_size;
  so.overlap_comm = config_.zero.overlap_comm;
  stage_ = make_stage(so,
                      {flat_params_.data_ptr<float>(),
                       flat_grads_.data_ptr<float>()},
                      comm_);
  if (stage_->wants_grad_ready()) {
    for (size_t i = 0; i < params_.size(); ++i) {
      // The parameter holds its accumulator weakly: keep it (and the hook)
      // alive for the engine's lifetime.
      grad_accumulators_.push_back(
          torch::autograd::impl::grad_accumulator(params_[i]));
      grad_accumulators_.back()->add_post_hook(
          std::make_unique<GradReadyHook>(stage_.get(), i));
    }
  }
}

Engine::~Engine() = default;

OptimizerHyper Engine::hyper() const {
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
  h.lr = config_.optimizer.lr;
  h.beta1 = config_.optimizer.beta1;
  h.beta2 = config_.optimizer.beta2;
  h.eps = config_.optimizer.eps;
  h.weight_decay = config_.optimizer.weight_decay;
  h.momentum = config_.optimizer.momentum;
  return h;
}

void Engine::backward(const torch::Tensor& loss, bool scale_wrt_gas) {
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
  stage_->begin_backward(boundary_.window_backwards() + 1,
                         boundary_.global_steps());
  try {
    scaled.backward();
  } catch (const c10::Error& e) {
    throw UsageError(std::string("backward(): LibTorch's autograd failed on "
                                 "rank ") +
                     std::to_string(rank()) + ": " + e.what_without_backtrace());
  }
  stage_->end_backward();
  if (plan.reduce_window) {
    stage_->reduce_window(boundary_.window_backwards() + 1,
                          boundary_.global_steps(), Phase::kBackward);
  }
  boundary_.commit_backward(plan);
}

void Engine::step() {
  const StepPlan plan = boundary_.plan_step();
  boundary_.enter_step();
  try {
    if (plan.apply_update) {
      if (plan.reduce_window_first) {
        stage_->reduce_window(plan.window_backwards, boundary_.global_steps(),
                              Phase::kStep);
      }
      const double divisor =
          config_.gradient_accumulation_scaling == GradAccumScaling::kPerStepCount
              ? static_cast<double>(plan.window_backwards)
              : 1.0;
      GradStats stats = stage_->finalize(divisor, config_.gradient_clipping);
      stage_->apply_update(hyper());
      stage_->zero_grad();
      last_grad_norm_ = stats.global_norm;
    }
  } catch (...) {
    boundary_.abort_step();
    throw;
  }
  boundary_.finish_step(plan, plan.apply_update);
  step_applied_ = plan.apply_update;
}

bool Engine::is_gradient_accumulation_boundary() const {
  return boundary_.is_gradient_accumulation_boundary();
}

void Engine::set_gradient_accumulation_boundary(bool is_boundary) {
  boundary_.set_gradient_accumulation_boundary(is_boundary);
}

torch::Tensor Engine::flat_parameters() const {
  return flat_params_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

torch::Tensor Engine::flat_gradients() const {
  return flat_grads_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

}  // namespace zerostep
