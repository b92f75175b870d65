// TorchKernels: the stages' kernels (Note [Device kernels] in
// zero/kernels.h) as LibTorch operations on one device: a CUDA device for a
// model there, or the CPU in the tests here, which run the engine's device
// path with it.
//
// Every operation is a LibTorch op on from_blob views of the flat buffers,
// issued on the device's current stream; the buffers are LibTorch tensors
// (allocate(): the caching allocator on CUDA). Adam/AdamW is LibTorch's
// fused multi-tensor kernel (at::_fused_adamw_ / _fused_adam_, LibTorch
// 2.x, on CUDA and CPU), or, on a LibTorch without it (Debian's 1.13), the
// same update as elementwise ops in LibTorch's order. SGD is elementwise ops.
// The norm accumulates squares in float64 over chunks and waits for the
// device once.
//
// Bits: every operation is deterministic on one device and one build, so
// managed and unmanaged runs stay bitwise equal and a run reproduces; the
// values can differ from host_kernels()'s in the last bits (other kernels:
// LibTorch may divide by a scalar as a multiplication by its reciprocal,
// and its fused Adam orders its operations its own way).
//
// Thread safety: as Kernels; operations use the calling thread's current
// stream.
#ifndef ZEROSTEP_ENGINE_TORCH_KERNELS_H_
#define ZEROSTEP_ENGINE_TORCH_KERNELS_H_

#include <torch/torch.h>

#include <string>

#include "zero/kernels.h"

namespace zerostep {

class TorchKernels final : public Kernels {
 public:
  // `host_addressable_`: whether the stage may treat the memory as the
  // host's; false on CUDA. The tests pass false on the CPU to run the
  // device path (staged collectives, downloads) with CPU tensors.
  explicit TorchKernels(torch::Device device, bool host_addressable = false);

  std::string device() const override { return device_.str(); }
  bool host_addressable() const override { return host_addressable_; }

  DeviceArray allocate(size_t n) override;
  void copy(float* dst, const float* src, size_t n) override;
  void zero(float* x, size_t n) override;
  void download(float* host, const float* x, size_t n) override;
  void upload(float* x, const float* host, size_t n) override;
  void divide(float* x, size_t n, double divisor) override;
  void scale(float* x, size_t n, float factor) override;
  double sum_of_squares(const float* x, size_t n) override;
  void accumulate(float* acc, const float* g, size_t n, Precision grad_p,
                  Precision acc_p) override;
  void adam(float* p, const float* g, float* m, float* v, size_t n,
            const AdamStepParams& params) override;
  void sgd(float* p, const float* g, float* buf, size_t n,
           const SgdStepParams& params) override;

 private:
  torch::Tensor view(const float* p, size_t n) const;

  torch::Device device_;
  bool host_addressable_;
  torch::TensorOptions options_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_TORCH_KERNELS_H_
