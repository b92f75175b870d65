// Kernels: every arithmetic and memory operation the ZeRO stages and the
// optimizer run on their flat float32 buffers, behind one interface, so that
// the same stage code runs on host memory and on a device.
//
// Note [Device kernels]
// ~~~~~~~~~~~~~~~~~~~~~
// The stages (zero/stage*.h) and FlatOptimizer never touch a buffer's
// elements themselves: they allocate through Kernels and call it to copy,
// clear, scale, accumulate, take norms and run the optimizer. A Kernels
// object owns one device's memory:
//   host_kernels()            the CPU: the loops and the fused AVX Adam of
//                             offload/fused_adam.h. Pointers are host
//                             memory. This is the default everywhere, and
//                             what every bitwise claim of the simulator and
//                             the harness is about.
//   TorchKernels (engine/)    any LibTorch device (CUDA; CPU in the tests
//                             here): LibTorch operations on views of the
//                             buffers, queued on the device's current
//                             stream. Pointers are that device's memory.
// Every operation is ordered after the ones issued before it on the same
// Kernels (one stream); only the ones returning a value to the host wait
// for the device (sum_of_squares, download). The stages call those at
// most once per step: the gradient norm in finalize() (one 8-byte value,
// needed on the host for clipping and for GradStats), and nothing per
// bucket or per backward. Checkpoints download the state they write.
//
// Communicators take the same pointers: a backend that reads device memory
// (NCCL) gets them as they are; one that reads host memory (the simulator,
// Gloo) is wrapped in a StagingCommunicator (zero/staging_comm.h), which
// copies through host buffers.
//
// Thread safety: a Kernels object may be shared by threads that use
// disjoint buffers (host_kernels() is shared by every rank of a process);
// TorchKernels issues on the calling thread's current stream.
#ifndef ZEROSTEP_ZERO_KERNELS_H_
#define ZEROSTEP_ZERO_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "offload/fused_adam.h"
#include "precision/precision.h"

namespace zerostep {

// A zero-initialised float32 array in one Kernels' memory; move-only owner
// (an empty array owns nothing).
class DeviceArray {
 public:
  DeviceArray() = default;
  // `owner` keeps `data` alive; released with the array.
  DeviceArray(float* data, size_t numel, std::shared_ptr<void> owner)
      : data_(data), numel_(numel), owner_(std::move(owner)) {}
  DeviceArray(DeviceArray&&) noexcept = default;
  DeviceArray& operator=(DeviceArray&&) noexcept = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  float* data() const { return data_; }
  size_t size() const { return numel_; }
  bool empty() const { return numel_ == 0; }
  size_t bytes() const { return numel_ * sizeof(float); }

 private:
  float* data_ = nullptr;
  size_t numel_ = 0;
  std::shared_ptr<void> owner_;
};

// SGD with momentum (dampening 0, no Nesterov): LibTorch's order.
struct SgdStepParams {
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.0;
  bool first = true;  // the first step: the buffer becomes the gradient
};

class Kernels {
 public:
  virtual ~Kernels() = default;

  // "cpu", "cuda:0", ...
  virtual std::string device() const = 0;
  // Whether the pointers are host memory (a host-only communicator can
  // read them; checkpoints can read them without a copy).
  virtual bool host_addressable() const = 0;

  // n zeros (the host's: 64-byte aligned). Out of memory: the allocator's
  // error (std::bad_alloc on the host, LibTorch's OutOfMemoryError on a
  // device).
  virtual DeviceArray allocate(size_t n) = 0;
  // dst[0, n) = src[0, n), both in this device's memory; may overlap only
  // when equal.
  virtual void copy(float* dst, const float* src, size_t n) = 0;
  virtual void zero(float* x, size_t n) = 0;
  // Host <-> device. download() waits for the device; upload() may return
  // before the copy is done but the host buffer may be reused at once.
  virtual void download(float* host, const float* x, size_t n) = 0;
  virtual void upload(float* x, const float* host, size_t n) = 0;

  // x[i] = x[i] / divisor, in float (nothing for divisor == 1).
  virtual void divide(float* x, size_t n, double divisor) = 0;
  // x[i] *= factor.
  virtual void scale(float* x, size_t n, float factor) = 0;
  // Sum of x[i]^2 accumulated in double (the host: in a fixed order, Note
  // [Sum of squares order] in kernels.cc); waits for the device.
  virtual double sum_of_squares(const float* x, size_t n) = 0;
  // divide(x, n, first), divide(x, n, second), then sum_of_squares(x, n):
  // the same bits, in one pass over x where the kernels fuse them (the
  // host's do).
  virtual double divide_and_sum_of_squares(float* x, size_t n, double first,
                                           double second) {
    divide(x, n, first);
    divide(x, n, second);
    return sum_of_squares(x, n);
  }
  // acc[i] = round_to(acc_p, acc[i] + round_to(grad_p, g[i]))
  // (Note [Precision model] in precision/precision.h).
  virtual void accumulate(float* acc, const float* g, size_t n,
                          Precision grad_p, Precision acc_p) = 0;

  // One Adam/AdamW update of p[0, n) with its moments m, v.
  virtual void adam(float* p, const float* g, float* m, float* v, size_t n,
                    const AdamStepParams& params) = 0;
  // The same update out of place (Note [Update out of place] in
  // offload/fused_adam.h): the *_out arrays get the new values, the *_in
  // ones keep theirs; each out array is its in array or does not overlap
  // it. The same bits as adam(). By default the in arrays are copied to
  // the out ones and adam() runs there (what a device's in-place kernel
  // needs); the host's kernel reads and writes apart in one pass.
  virtual void adam_into(const AdamArrays& a, size_t n,
                         const AdamStepParams& params) {
    if (a.params_out != a.params_in) copy(a.params_out, a.params_in, n);
    if (a.exp_avg_out != a.exp_avg_in) copy(a.exp_avg_out, a.exp_avg_in, n);
    if (a.exp_avg_sq_out != a.exp_avg_sq_in)
      copy(a.exp_avg_sq_out, a.exp_avg_sq_in, n);
    adam(a.params_out, a.grads, a.exp_avg_out, a.exp_avg_sq_out, n, params);
  }
  // One SGD update; `buf` is the momentum buffer (nullptr without momentum).
  virtual void sgd(float* p, const float* g, float* buf, size_t n,
                   const SgdStepParams& params) = 0;
};

// The CPU's kernels (Note [Device kernels]); one object per process.
Kernels& host_kernels();

namespace internal {
// The host's gradient-norm passes on one instruction set (kAuto: the
// widest this CPU has; UsageError for one it lacks), for tests and
// benchmarks; HostKernels calls them with kAuto. Every ISA gives the same
// bits (Note [Sum of squares order] in kernels.cc).
double host_sum_of_squares(const float* x, size_t n, Isa isa);
double host_divide_and_sum_of_squares(float* x, size_t n, double first,
                                      double second, Isa isa);
// The host's zero() with the streaming stores of `isa` (Note [Zeroing
// around the caches]; below AVX-512, SSE's).
void host_zero(float* x, size_t n, Isa isa);
}  // namespace internal

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_KERNELS_H_
