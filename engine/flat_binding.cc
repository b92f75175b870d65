#include "engine/flat_binding.h"

#include <cstring>

#include "common/errors.h"
#include "zero/agreement.h"

namespace zerostep {

FlatBinding::FlatBinding(std::shared_ptr<torch::nn::Module> model,
                         std::vector<torch::Tensor> params,
                         const BindingOptions& options, Communicator* comm)
    : model_(std::move(model)),
      params_(std::move(params)),
      layout_(options.stage.layout),
      dtype_(options.dtype),
      fold_accum_(options.stage.stage >= 2 ? Precision::kFp32
                                           : options.stage.grad_accum),
      folded_(params_.size(), 0) {
  // Flat buffers, allocated once and touched once (zeros) up front.
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t padded = static_cast<int64_t>(layout_.padded_numel);
  flat_params_ = torch::zeros({padded}, f32);
  flat_grads_ = torch::zeros({padded}, f32);
  const bool bf16 = dtype_ == Precision::kBf16;
  if (bf16) model_params_ = torch::zeros({padded}, torch::kBFloat16);
  if (folds_grads())
    model_grads_ =
        torch::zeros({padded}, bf16 ? torch::kBFloat16 : torch::kFloat32);
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
  broadcast_initial_parameters(*comm, flat_params_.data_ptr<float>(),
                               layout_.padded_numel);
  params_written();
  stage_ = make_stage(
      options.stage,
      {flat_params_.data_ptr<float>(), flat_grads_.data_ptr<float>()}, comm);
  install_grad_ready_hooks(params_);
}

void FlatBinding::begin_backward() {
  std::fill(folded_.begin(), folded_.end(), 0);
}

void FlatBinding::end_backward() {
  if (!folds_grads()) return;
  for (size_t i = 0; i < params_.size(); ++i) fold_grad(i);
}

void FlatBinding::on_grad_ready(size_t i) {
  if (folds_grads()) fold_grad(i);
  stage_->on_grad_ready(i);
}

void FlatBinding::fold_grad(size_t i) {
  if (folded_[i]) return;
  folded_[i] = 1;
  const size_t off = layout_.offsets[i], n = layout_.numels[i];
  float* acc = flat_grads_.data_ptr<float>() + off;
  if (dtype_ == Precision::kBf16) {
    auto* g = reinterpret_cast<uint16_t*>(model_grads_.data_ptr()) + off;
    accumulate_bf16(acc, g, n, fold_accum_);
    std::memset(g, 0, n * sizeof(uint16_t));
  } else {
    float* g = model_grads_.data_ptr<float>() + off;
    accumulate(acc, g, n, Precision::kFp16, fold_accum_);
    std::memset(g, 0, n * sizeof(float));
  }
}

void FlatBinding::params_written() {
  if (dtype_ != Precision::kBf16) return;
  to_bf16(flat_params_.data_ptr<float>(),
          reinterpret_cast<uint16_t*>(model_params_.data_ptr()),
          layout_.padded_numel);
}

torch::Tensor FlatBinding::full_parameters() {
  torch::Tensor out =
      torch::empty({static_cast<int64_t>(layout_.numel)}, torch::kFloat32);
  out.copy_(flat_params_.narrow(0, 0, static_cast<int64_t>(layout_.numel)));
  return out;
}

torch::Tensor FlatBinding::flat_parameters() const {
  return flat_params_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

torch::Tensor FlatBinding::flat_gradients() const {
  return flat_grads_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

MemoryStats FlatBinding::memory() const {
  MemoryStats m = stage_->memory();
  auto bytes = [](const torch::Tensor& t) -> size_t {
    return t.defined() ? t.storage().nbytes() : 0;
  };
  // Mixed precision: the model's own copies, beside the stage's float32,
  // held from construction on.
  const size_t params = bytes(model_params_), grads = bytes(model_grads_);
  m.param_bytes += params;
  m.grad_bytes += grads;
  m.peak_bytes += params + grads;
  return m;
}

}  // namespace zerostep
