#include "engine/torch_kernels.h"

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "offload/fused_adam.h"

namespace zerostep {
namespace {

// Elements per piece of the norm: bounds its float64 temporary (128 MiB).
constexpr size_t kNormPiece = size_t{1} << 24;

torch::Tensor host_view(const float* p, size_t n) {
  return torch::from_blob(const_cast<float*>(p), {static_cast<int64_t>(n)},
                          torch::TensorOptions().dtype(torch::kFloat32));
}

// round_to(p, x) on a tensor (Note [Precision model]): through the format
// and back, LibTorch's round-to-nearest-even conversions.
void round_in_place(torch::Tensor& x, Precision p) {
  if (p == Precision::kFp32) return;
  x.copy_(x.to(p == Precision::kBf16 ? torch::kBFloat16 : torch::kHalf));
}

// LibTorch's torch.optim.Adam(W) order, as elementwise ops; without bias
// correction both corrections are 1 (DeepSpeed's FusedAdam then).
void adam_elementwise(torch::Tensor& param, torch::Tensor grad,
                      torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
                      const AdamStepParams& h) {
  const double t = static_cast<double>(h.step);
  const double bias1 = h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;
  const double bias2 = h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;
  if (h.decoupled)
    param.mul_(1.0 - h.lr * h.weight_decay);
  else if (h.weight_decay != 0.0)
    grad = grad.add(param, h.weight_decay);
  exp_avg.mul_(h.beta1).add_(grad, 1.0 - h.beta1);
  exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1.0 - h.beta2);
  torch::Tensor denom = exp_avg_sq.sqrt().div_(std::sqrt(bias2)).add_(h.eps);
  param.addcdiv_(exp_avg, denom, -h.lr / bias1);
}

}  // namespace

TorchKernels::TorchKernels(torch::Device device, bool host_addressable)
    : device_(device),
      host_addressable_(host_addressable && device.is_cpu()),
      options_(torch::TensorOptions().dtype(torch::kFloat32).device(device)) {}

torch::Tensor TorchKernels::view(const float* p, size_t n) const {
  return torch::from_blob(const_cast<float*>(p), {static_cast<int64_t>(n)},
                          options_);
}

DeviceArray TorchKernels::allocate(size_t n) {
  if (n == 0) return {};
  auto t = std::make_shared<torch::Tensor>(
      torch::zeros({static_cast<int64_t>(n)}, options_));
  return DeviceArray(t->data_ptr<float>(), n, t);
}

void TorchKernels::copy(float* dst, const float* src, size_t n) {
  if (n == 0 || dst == src) return;
  view(dst, n).copy_(view(src, n));
}

void TorchKernels::zero(float* x, size_t n) {
  if (n != 0) view(x, n).zero_();
}

void TorchKernels::download(float* host, const float* x, size_t n) {
  if (n != 0) host_view(host, n).copy_(view(x, n));  // waits for the device
}

void TorchKernels::upload(float* x, const float* host, size_t n) {
  // From pageable memory: the host buffer is read before copy_ returns.
  if (n != 0) view(x, n).copy_(host_view(host, n));
}

void TorchKernels::divide(float* x, size_t n, double divisor) {
  if (n == 0 || divisor == 1.0) return;
  view(x, n).div_(static_cast<float>(divisor));
}

void TorchKernels::scale(float* x, size_t n, float factor) {
  if (n != 0) view(x, n).mul_(factor);
}

double TorchKernels::sum_of_squares(const float* x, size_t n) {
  if (n == 0) return 0.0;
  torch::Tensor sum = torch::zeros({}, options_.dtype(torch::kFloat64));
  for (size_t at = 0; at < n; at += kNormPiece) {
    torch::Tensor piece =
        view(x + at, std::min(kNormPiece, n - at)).to(torch::kFloat64);
    sum.add_(piece.mul_(piece).sum());
  }
  return sum.item<double>();  // the one wait
}

void TorchKernels::accumulate(float* acc, const float* g, size_t n,
                              Precision grad_p, Precision acc_p) {
  if (n == 0) return;
  torch::Tensor a = view(acc, n);
  torch::Tensor grad = view(g, n);
  if (grad_p != Precision::kFp32) {
    grad = grad.clone();
    round_in_place(grad, grad_p);
  }
  a.add_(grad);
  round_in_place(a, acc_p);
}

void TorchKernels::adam(float* p, const float* g, float* m, float* v, size_t n,
                        const AdamStepParams& h) {
  if (n == 0) return;
  torch::Tensor param = view(p, n), grad = view(g, n);
  torch::Tensor exp_avg = view(m, n), exp_avg_sq = view(v, n);
#if TORCH_VERSION_MAJOR >= 2
  // torch's fused kernels always correct the bias.
  if (!h.bias_correction) {
    adam_elementwise(param, grad, exp_avg, exp_avg_sq, h);
    return;
  }
  // The step count of this update (torch.optim increments its state step
  // before calling the kernel, which only reads it).
  std::vector<torch::Tensor> steps = {
      torch::full({}, static_cast<double>(h.step), options_)};
  if (h.decoupled)
    at::_fused_adamw_({param}, {grad}, {exp_avg}, {exp_avg_sq}, {}, steps,
                      h.lr, h.beta1, h.beta2, h.weight_decay, h.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  else
    at::_fused_adam_({param}, {grad}, {exp_avg}, {exp_avg_sq}, {}, steps, h.lr,
                     h.beta1, h.beta2, h.weight_decay, h.eps,
                     /*amsgrad=*/false, /*maximize=*/false);
#else
  adam_elementwise(param, grad, exp_avg, exp_avg_sq, h);
#endif
}

void TorchKernels::sgd(float* p, const float* g, float* buf, size_t n,
                       const SgdStepParams& h) {
  if (n == 0) return;
  torch::Tensor param = view(p, n);
  torch::Tensor d = view(g, n);
  if (h.weight_decay != 0.0) d = d.add(param, h.weight_decay);
  if (buf != nullptr) {
    torch::Tensor b = view(buf, n);
    if (h.first)
      b.copy_(d);
    else
      b.mul_(h.momentum).add_(d);
    d = b;
  }
  param.add_(d, -h.lr);
}

}  // namespace zerostep
