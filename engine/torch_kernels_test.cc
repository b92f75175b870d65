// TorchKernels on CPU tensors against the host's kernels, op by op (Note
// [Device kernels] in zero/kernels.h): the same results where LibTorch's
// op is the same arithmetic, close where its kernels differ (division by a
// scalar, the fused Adam of LibTorch 2.x or the elementwise one of 1.13).
#include "engine/torch_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "offload/adam_test_vectors.h"
#include "offload/fused_adam.h"

namespace zerostep {
namespace {

// A device buffer of `k` holding `host`, and back.
DeviceArray put(Kernels& k, const std::vector<float>& host) {
  DeviceArray a = k.allocate(host.size());
  k.upload(a.data(), host.data(), host.size());
  return a;
}
std::vector<float> get(Kernels& k, const DeviceArray& a) {
  std::vector<float> out(a.size());
  k.download(out.data(), a.data(), a.size());
  return out;
}

TEST(TorchKernelsTest, ElementwiseOpsMatchTheHost) {
  TorchKernels tk(torch::kCPU);
  Kernels& hk = host_kernels();
  EXPECT_FALSE(tk.host_addressable());
  EXPECT_EQ(tk.device(), "cpu");
  const size_t n = 1003;
  const std::vector<float> a = normal(n, 1, 1.0f), g = normal(n, 2, 0.1f);
  DeviceArray x = put(tk, a), y = put(tk, g);
  std::vector<float> hx = a;
  // allocate() is zeros.
  for (float v : get(tk, tk.allocate(5))) EXPECT_EQ(v, 0.0f);
  tk.scale(x.data(), n, 0.5f);
  hk.scale(hx.data(), n, 0.5f);
  EXPECT_EQ(get(tk, x), hx);
  for (Precision gp : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    for (Precision ap : {Precision::kFp32, Precision::kBf16}) {
      tk.accumulate(x.data(), y.data(), n, gp, ap);
      hk.accumulate(hx.data(), g.data(), n, gp, ap);
      EXPECT_EQ(get(tk, x), hx) << to_string(gp) << " into " << to_string(ap);
    }
  EXPECT_NEAR(tk.sum_of_squares(x.data(), n), hk.sum_of_squares(hx.data(), n),
              1e-12 * hk.sum_of_squares(hx.data(), n));
  tk.divide(x.data(), n, 3.0);
  hk.divide(hx.data(), n, 3.0);
  const std::vector<float> d = get(tk, x);
  for (size_t i = 0; i < n; ++i)
    EXPECT_NEAR(d[i], hx[i], 1e-6f * std::fabs(hx[i])) << i;
  tk.copy(y.data(), x.data(), n);
  EXPECT_EQ(get(tk, y), d);
  tk.zero(y.data() + 10, 20);
  const std::vector<float> z = get(tk, y);
  for (size_t i = 10; i < 30; ++i) EXPECT_EQ(z[i], 0.0f);
  EXPECT_EQ(z[9], d[9]);
  EXPECT_EQ(z[30], d[30]);
}

// Three steps of Adam and AdamW, with and without bias correction:
// LibTorch's kernels against the host's fused one. The first step's bias
// correction (step 1, not 0) is where a wrong step count, or a correction
// applied on one side only, shows as NaN or a 10x update.
TEST(TorchKernelsTest, AdamAndSgdAgreeWithTheHost) {
  TorchKernels tk(torch::kCPU);
  Kernels& hk = host_kernels();
  const size_t n = 517;
  for (int c = 0; c < 4; ++c) {
    const bool decoupled = (c & 1) == 0, bias_correction = (c & 2) == 0;
    std::vector<float> p = normal(n, 3, 1.0f), m(n, 0.0f), v(n, 0.0f);
    DeviceArray dp = put(tk, p), dm = tk.allocate(n), dv = tk.allocate(n);
    for (int64_t step = 1; step <= 3; ++step) {
      const std::vector<float> g = normal(n, 10 + step, 0.1f);
      DeviceArray dg = put(tk, g);
      AdamStepParams h;
      h.lr = 0.01;
      h.weight_decay = 0.1;
      h.step = step;
      h.decoupled = decoupled;
      h.bias_correction = bias_correction;
      tk.adam(dp.data(), dg.data(), dm.data(), dv.data(), n, h);
      hk.adam(p.data(), g.data(), m.data(), v.data(), n, h);
    }
    const std::vector<float> got = get(tk, dp);
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], p[i], 1e-6f)
          << (decoupled ? "AdamW " : "Adam ")
          << (bias_correction ? "" : "without bias correction ") << i;
  }
  std::vector<float> p = normal(n, 4, 1.0f), buf(n, 0.0f);
  DeviceArray dp = put(tk, p), db = tk.allocate(n);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = normal(n, 20 + step, 0.1f);
    DeviceArray dg = put(tk, g);
    const SgdStepParams s{0.1, 0.01, 0.9, step == 1};
    tk.sgd(dp.data(), dg.data(), db.data(), n, s);
    hk.sgd(p.data(), g.data(), buf.data(), n, s);
  }
  const std::vector<float> got = get(tk, dp);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], p[i], 1e-6f) << i;
}

}  // namespace
}  // namespace zerostep
