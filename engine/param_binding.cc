#include "engine/param_binding.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <variant>

#include "common/errors.h"
#include "engine/flat_binding.h"
#include "engine/stage3_binding.h"

namespace zerostep {
namespace {

// Runs after AccumulateGrad has added a backward's gradient into a
// parameter's .grad: the point from which a stage may communicate that
// gradient (overlap_comm, stage 3).
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

}  // namespace

namespace internal {

torch::Device model_device(const std::vector<torch::Tensor>& params) {
  if (params.empty() || params.front().is_meta()) return torch::kCPU;
  return params.front().device();
}

void bind_parameter(torch::Tensor& p, const torch::Tensor& view) {
  if (!p.is_meta()) {
    p.set_data(view);
    return;
  }
  // LibTorch's set_data() refuses meta to another device; what it does
  // after that check is this metadata copy.
  p.unsafeGetTensorImpl()->shallow_copy_from(view.getIntrusivePtr());
}

void read_from_source(const ParameterSource* source, const std::string& name,
                      int64_t offset, int64_t numel, Precision dtype,
                      float* out) {
  if (source == nullptr)
    throw UsageError("parameter " + name +
                     " is on the meta device and no EngineOptions::"
                     "parameter_source gives its values. Fix: build the "
                     "model on a real device, or pass a ParameterSource "
                     "(e.g. an HfCheckpointSource over its folder)");
  source->read(name, offset, numel, out);
  if (dtype == Precision::kBf16)
    round_in_place(Precision::kBf16, out, static_cast<size_t>(numel));
}

}  // namespace internal

void ParamBinding::install_grad_ready_hooks(
    const std::vector<torch::Tensor>& params, bool binding_wants) {
  if (!stage().wants_grad_ready() && !binding_wants) return;
  for (size_t i = 0; i < params.size(); ++i) {
    grad_accumulators_.push_back(
        torch::autograd::impl::grad_accumulator(params[i]));
    grad_accumulators_.back()->add_post_hook(std::make_unique<GradReadyHook>(
        [this](size_t p) { on_grad_ready(p); }, i));
  }
}

std::unique_ptr<ParamBinding> make_param_binding(
    std::shared_ptr<torch::nn::Module> model, std::vector<torch::Tensor> params,
    const BindingOptions& options, Communicator* comm, FailureLatch* latch) {
  if (std::holds_alternative<Stage3Options>(options.stage.per_stage))
    return std::make_unique<Stage3Binding>(std::move(model), std::move(params),
                                           options, comm, latch);
  return std::make_unique<FlatBinding>(std::move(model), std::move(params),
                                       options, comm);
}

}  // namespace zerostep
