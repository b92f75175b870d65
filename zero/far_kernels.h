// FarKernels (testonly): host_kernels() posing as a device's, so that the
// tests here run the engine's device path on the CPU (Note [Device kernels]
// in zero/kernels.h): its memory is not host-addressable, so collectives
// mark its buffers as device memory (host backends refuse them unless a
// StagingCommunicator stages them) and everything a checkpoint or a
// staging reads goes through download(). It counts the calls that wait for
// a device.
#ifndef ZEROSTEP_ZERO_FAR_KERNELS_H_
#define ZEROSTEP_ZERO_FAR_KERNELS_H_

#include <atomic>
#include <string>

#include "offload/fused_adam.h"
#include "zero/kernels.h"

namespace zerostep {

class FarKernels final : public Kernels {
 public:
  std::string device() const override { return "far"; }
  bool host_addressable() const override { return false; }
  DeviceArray allocate(size_t n) override { return h().allocate(n); }
  void copy(float* dst, const float* src, size_t n) override {
    h().copy(dst, src, n);
  }
  void zero(float* x, size_t n) override { h().zero(x, n); }
  void download(float* host, const float* x, size_t n) override {
    ++downloads;
    h().download(host, x, n);
  }
  void upload(float* x, const float* host, size_t n) override {
    h().upload(x, host, n);
  }
  void divide(float* x, size_t n, double d) override { h().divide(x, n, d); }
  void scale(float* x, size_t n, float f) override { h().scale(x, n, f); }
  double sum_of_squares(const float* x, size_t n) override {
    ++norms;
    return h().sum_of_squares(x, n);
  }
  void accumulate(float* acc, const float* g, size_t n, Precision gp,
                  Precision ap) override {
    h().accumulate(acc, g, n, gp, ap);
  }
  void adam(float* p, const float* g, float* m, float* v, size_t n,
            const AdamStepParams& a) override {
    adam_threads = a.threads;
    h().adam(p, g, m, v, n, a);
  }
  void sgd(float* p, const float* g, float* buf, size_t n,
           const SgdStepParams& s) override {
    h().sgd(p, g, buf, n, s);
  }

  // The calls that wait for the device: downloads (staged collectives,
  // checkpoints) and norms.
  std::atomic<int64_t> downloads{0};
  std::atomic<int64_t> norms{0};
  // The threads the last adam() was allowed (AdamStepParams::threads).
  std::atomic<int> adam_threads{0};

 private:
  static Kernels& h() { return host_kernels(); }
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_FAR_KERNELS_H_
