#include "models/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <string>

namespace zerostep {

LoraAdapterImpl::LoraAdapterImpl(int64_t in_features, int64_t out_features,
                                 const LoraOptions& o, uint64_t stream)
    : scale_((o.alpha > 0 ? o.alpha : static_cast<double>(o.rank)) /
             static_cast<double>(o.rank)) {
  a_ = register_parameter("lora_a",
                          lora_initial_a(o.rank, in_features, o.seed, stream));
  b_ = register_parameter("lora_b", torch::zeros({out_features, o.rank}));
}

torch::Tensor lora_initial_a(int64_t rank, int64_t in_features, uint64_t seed,
                             uint64_t stream) {
  // A private generator: the model's global random stream is untouched.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      seed * 0x9E3779B97F4A7C15ull + stream + 1);
  torch::NoGradGuard no_grad;
  return torch::randn({rank, in_features}, gen) /
         std::sqrt(static_cast<double>(in_features));
}

bool is_lora_parameter_name(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) ==
               0;
  };
  return ends_with("lora_a") || ends_with("lora_b") ||
         ends_with("lora_A.weight") || ends_with("lora_B.weight");
}

torch::Tensor LoraAdapterImpl::forward(const torch::Tensor& x) {
  return torch::matmul(torch::matmul(x, a_.t()), b_.t()) * scale_;
}

torch::Tensor lora_linear(torch::nn::Linear& base, LoraAdapter& adapter,
                          const torch::Tensor& x) {
  torch::Tensor y = base->forward(x);
  if (adapter.is_empty()) return y;
  return y + adapter->forward(x);
}

int64_t freeze_all_but_lora(torch::nn::Module& model) {
  int64_t trainable = 0;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const bool lora = is_lora_parameter_name(item.key());
    item.value().set_requires_grad(lora);
    if (lora) ++trainable;
  }
  return trainable;
}

}  // namespace zerostep
