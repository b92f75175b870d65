// device_adam_bench: one AdamW step of the engine on a device (issue 12
// item 4), against LibTorch's fused AdamW as torch.optim uses it and against
// the device's memory bandwidth, timed alternately in the same benchmark so
// that the ratios are taken under the same conditions:
//   zerostep  TorchKernels::adam (engine/torch_kernels.h) over one flat
//             float32 partition of n parameters: what every ZeRO stage runs
//             on a device (LibTorch's at::_fused_adamw_ on one tensor)
//   torch     at::_fused_adamw_ over the same n parameters cut into the
//             tensors of a GPT (per block: qkv, proj, fc, fc2 weights and
//             their biases, two norms; d_model 1024), which is what
//             torch.optim.AdamW(fused=True) issues for a model's parameters
//   copy      dst.copy_(src) of n floats on the device: 8 bytes per element
//             of traffic, the achieved memory bandwidth. The roofline of an
//             Adam step is 28 bytes per parameter (read p, g, m, v; write p,
//             m, v) at that bandwidth.
//
//   ./bazelw run --config=cuda //benchmarks:device_adam_bench --
//       --benchmark_format=json --benchmark_out=/tmp/adam.json
//       --benchmark_out_format=json
//   (one command line; on the GPU node, the packed binary: gpu_pack/run.sh)
//
// ZS_BENCH_DEVICE=cuda|cpu picks the device (default: cuda when LibTorch
// sees one, else the CPU, where it is a smoke run of the same code, not a
// measurement of anything this benchmark is for). Sizes: 16, 64 and 256 Mi
// parameters on cuda, 1 and 4 Mi on the CPU. Every iteration times each
// alternative once, rotating which goes first; one timing is `reps` steps
// between two device synchronisations (10 below 64 Mi, else 3), so the
// launch and synchronisation cost is amortised. The iteration's manual time
// is zerostep's. Counters:
//   zerostep_ms, torch_ms, copy_ms    median time of one step (one copy)
//   zerostep_GBps, torch_GBps         28 B/param / step time
//   copy_GBps                         8 B/element / copy time
//   zerostep_over_torch               median paired torch time / zerostep
//                                     time (above 1: zerostep faster)
//   zerostep_over_roofline            median paired roofline time (28 B/param
//                                     at that iteration's copy bandwidth) /
//                                     zerostep time
//   bitwise_equal_to_torch            1 when both sides' parameters are
//                                     equal to the bit after the same steps
//                                     on the same data, else 0
//
// Needs LibTorch 2.x (at::_fused_adamw_): with Debian's 1.13 every
// benchmark reports that as its error. Benchmarks never run under `bazel
// test`: the target is tagged "benchmark".
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "engine/torch_kernels.h"
#include "offload/fused_adam.h"

namespace zerostep {
namespace {

torch::Device bench_device() {
  const char* env = std::getenv("ZS_BENCH_DEVICE");
  const std::string want = env != nullptr ? env : "";
  if (want == "cpu") return torch::kCPU;
  if (want == "cuda" || (want.empty() && torch::cuda::is_available()))
    return torch::Device(torch::kCUDA, 0);
  return torch::kCPU;
}

#if TORCH_VERSION_MAJOR >= 2
void sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The sizes of a GPT's parameter tensors (d_model d), repeated until they
// cover n; the last one is cut to fit.
std::vector<int64_t> gpt_tensor_sizes(int64_t n, int64_t d) {
  const std::vector<int64_t> block = {d,         d,     3 * d * d, 3 * d,
                                      d * d,     d,     d,         d,
                                      4 * d * d, 4 * d, 4 * d * d, d};
  std::vector<int64_t> out;
  int64_t left = n;
  for (size_t i = 0; left > 0; i = (i + 1) % block.size()) {
    out.push_back(std::min(left, block[i]));
    left -= out.back();
  }
  return out;
}

void BM_DeviceAdamStep(benchmark::State& state) {
  const torch::Device device = bench_device();
  const int64_t n = state.range(0) << 20;
  const int reps = state.range(0) < 64 ? 10 : 3;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::manual_seed(7);
  // Both sides start from the same values.
  const torch::Tensor p0 = torch::randn({n}, f32);
  const torch::Tensor g0 = torch::randn({n}, f32).mul_(1e-2);
  torch::Tensor p = p0.clone(), g = g0.clone();
  torch::Tensor m = torch::zeros({n}, f32), v = torch::zeros({n}, f32);
  torch::Tensor tp = p0.clone(), tg = g0.clone();
  torch::Tensor tm = torch::zeros({n}, f32), tv = torch::zeros({n}, f32);
  std::vector<torch::Tensor> ps, gs, ms, vs;
  int64_t at = 0;
  for (int64_t size : gpt_tensor_sizes(n, 1024)) {
    ps.push_back(tp.narrow(0, at, size));
    gs.push_back(tg.narrow(0, at, size));
    ms.push_back(tm.narrow(0, at, size));
    vs.push_back(tv.narrow(0, at, size));
    at += size;
  }
  torch::Tensor src = torch::randn({n}, f32), dst = torch::empty({n}, f32);

  TorchKernels kernels(device);
  AdamStepParams h;
  h.lr = 1e-4;
  h.weight_decay = 0.01;
  int64_t step = 0, torch_step = 0;
  auto zerostep = [&] {
    h.step = ++step;
    kernels.adam(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                 v.data_ptr<float>(), static_cast<size_t>(n), h);
  };
  auto torch_fused = [&] {
    // torch.optim keeps one step tensor per parameter, incremented before
    // the kernel reads it.
    ++torch_step;
    std::vector<torch::Tensor> steps(
        ps.size(), torch::full({}, static_cast<double>(torch_step), f32));
    at::_fused_adamw_(ps, gs, ms, vs, {}, steps, h.lr, h.beta1, h.beta2,
                      h.weight_decay, h.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
  };
  auto copy = [&] { dst.copy_(src); };
  // Seconds per call of f, `reps` calls between two synchronisations.
  auto time = [&](const std::function<void()>& f) {
    sync(device);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    sync(device);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         t0)
               .count() /
           reps;
  };
  // Warm-up: kernels loaded, the allocator's blocks in place.
  time(zerostep);
  time(torch_fused);
  time(copy);

  std::vector<double> zs, ts, cs, vs_torch, vs_roof;
  int round = 0;
  for (auto _ : state) {
    double tz = 0, tt = 0, tc = 0;
    for (int k = 0; k < 3; ++k) {
      switch ((round + k) % 3) {
        case 0: tz = time(zerostep); break;
        case 1: tt = time(torch_fused); break;
        default: tc = time(copy); break;
      }
    }
    ++round;
    state.SetIterationTime(tz);
    zs.push_back(tz);
    ts.push_back(tt);
    cs.push_back(tc);
    vs_torch.push_back(tt / tz);
    // 28 bytes per parameter at the copy's 8 bytes per element.
    vs_roof.push_back(tc * 28.0 / 8.0 / tz);
  }
  // The same number of steps on the same data: the same bits when the two
  // kernels compute alike (both are at::_fused_adamw_ here).
  while (torch_step < step) torch_fused();
  while (step < torch_step) zerostep();
  sync(device);
  const bool equal = torch::equal(p, tp);
  const double bytes = 28.0 * static_cast<double>(n);
  state.counters["zerostep_ms"] = median(zs) * 1e3;
  state.counters["torch_ms"] = median(ts) * 1e3;
  state.counters["copy_ms"] = median(cs) * 1e3;
  state.counters["zerostep_GBps"] = bytes / median(zs) / 1e9;
  state.counters["torch_GBps"] = bytes / median(ts) / 1e9;
  state.counters["copy_GBps"] = 8.0 * static_cast<double>(n) / median(cs) / 1e9;
  state.counters["zerostep_over_torch"] = median(vs_torch);
  state.counters["zerostep_over_roofline"] = median(vs_roof);
  state.counters["bitwise_equal_to_torch"] = equal ? 1 : 0;
  state.SetLabel(device.str());
}
#else
void BM_DeviceAdamStep(benchmark::State& state) {
  state.SkipWithError(
      "needs LibTorch 2.x (at::_fused_adamw_); build with --config=cuda");
  for (auto _ : state) {
  }
}
#endif

}  // namespace
}  // namespace zerostep

// Registered here, not at static initialisation: the sizes depend on the
// device, which LibTorch can only be asked about once it is loaded.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const bool cuda = zerostep::bench_device().is_cuda();
  auto* b = benchmark::RegisterBenchmark("BM_DeviceAdamStep",
                                         zerostep::BM_DeviceAdamStep);
  for (int64_t mi : cuda ? std::vector<int64_t>{16, 64, 256}
                         : std::vector<int64_t>{1, 4})
    b->Arg(mi);
  b->ArgName("mparams")
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(15);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
