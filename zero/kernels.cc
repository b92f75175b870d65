#include "zero/kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>
#include <type_traits>
#include <vector>

#include "offload/fused_adam.h"

namespace zerostep {
namespace {

// Note [Sum of squares order]: element i goes into partial sum i % 8, and
// the eight partial sums are added pairwise at the end. One fixed order, so
// every build and every run gives the same bits. Eight independent
// additions in flight (one vector of doubles where the compiler
// vectorizes) instead of one chain: a single chain is bound by the latency
// of a double addition per element, several times slower than reading the
// gradient from memory.
// The sum of f(x[i])^2; when x is writable, x[i] = f(x[i]) in the same pass.
template <typename T, typename F>
double squares_after(T* x, size_t n, F f) {
  constexpr bool kWrite = !std::is_const_v<T>;
  double lane[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (size_t j = 0; j < 8; ++j) {
      const float y = f(x[i + j]);
      if constexpr (kWrite) x[i + j] = y;
      const double v = y;
      lane[j] += v * v;
    }
  for (size_t j = 0; i < n; ++i, ++j) {
    const float y = f(x[i]);
    if constexpr (kWrite) x[i] = y;
    const double v = y;
    lane[j] += v * v;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The CPU: plain loops (compiled without FMA contraction, so every build
// gives the same bits) and the fused Adam kernel.
class HostKernels final : public Kernels {
 public:
  std::string device() const override { return "cpu"; }
  bool host_addressable() const override { return true; }

  DeviceArray allocate(size_t n) override {
    if (n == 0) return {};
    // 64-byte aligned, as a flat buffer's partitions are: the fused
    // kernel streams its stores only to aligned outputs (Note [Update out
    // of place] in offload/fused_adam.h).
    const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    void* raw = std::aligned_alloc(64, bytes);
    if (raw == nullptr) throw std::bad_alloc();
    std::memset(raw, 0, bytes);  // zeros, touched here
    std::shared_ptr<void> owner(raw, [](void* q) { std::free(q); });
    return DeviceArray(static_cast<float*>(raw), n, std::move(owner));
  }
  void copy(float* dst, const float* src, size_t n) override {
    if (n != 0 && dst != src) std::memmove(dst, src, n * sizeof(float));
  }
  void zero(float* x, size_t n) override {
    if (n != 0) std::memset(x, 0, n * sizeof(float));
  }
  void download(float* host, const float* x, size_t n) override {
    copy(host, x, n);
  }
  void upload(float* x, const float* host, size_t n) override {
    copy(x, host, n);
  }
  void divide(float* x, size_t n, double divisor) override {
    if (divisor == 1.0) return;
    const float d = static_cast<float>(divisor);
    for (size_t i = 0; i < n; ++i) x[i] = x[i] / d;
  }
  void scale(float* x, size_t n, float factor) override {
    for (size_t i = 0; i < n; ++i) x[i] *= factor;
  }
  double sum_of_squares(const float* x, size_t n) override {
    return squares_after(x, n, [](float v) { return v; });
  }
  // The divisions and the squares in one pass: each element is divided
  // (as divide() does, in float, first then second) and written back, and
  // its square goes into the lanes of Note [Sum of squares order]. The
  // same operations on every element as the three passes.
  double divide_and_sum_of_squares(float* x, size_t n, double first,
                                   double second) override {
    const float a = static_cast<float>(first);
    const float b = static_cast<float>(second);
    if (first == 1.0 && second == 1.0) return sum_of_squares(x, n);
    if (second == 1.0)
      return squares_after(x, n, [a](float v) { return v / a; });
    if (first == 1.0)
      return squares_after(x, n, [b](float v) { return v / b; });
    return squares_after(x, n, [a, b](float v) { return v / a / b; });
  }
  void accumulate(float* acc, const float* g, size_t n, Precision grad_p,
                  Precision acc_p) override {
    zerostep::accumulate(acc, g, n, grad_p, acc_p);
  }
  void adam(float* p, const float* g, float* m, float* v, size_t n,
            const AdamStepParams& params) override {
    FusedAdamOptions options;
    options.threads = params.threads;
    fused_adam_step(p, g, m, v, n, params, options);
  }
  void adam_into(const AdamArrays& a, size_t n,
                 const AdamStepParams& params) override {
    FusedAdamOptions options;
    options.threads = params.threads;
    fused_adam_step(a, n, params, options);
  }
  void sgd(float* p, const float* g, float* buf, size_t n,
           const SgdStepParams& h) override {
    const float lr = static_cast<float>(h.lr);
    const float wd = static_cast<float>(h.weight_decay);
    const float mom = static_cast<float>(h.momentum);
    for (size_t i = 0; i < n; ++i) {
      float d = g[i];
      if (wd != 0.0f) d += wd * p[i];
      if (buf != nullptr) {
        buf[i] = h.first ? d : mom * buf[i] + d;
        d = buf[i];
      }
      p[i] -= lr * d;
    }
  }
};

}  // namespace

Kernels& host_kernels() {
  static HostKernels k;
  return k;
}

}  // namespace zerostep
