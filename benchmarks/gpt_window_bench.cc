// gpt_window_bench: one unmanaged window (N backward() calls, then one
// step()) of the tiny GPT (models/tiny_gpt.h) at a size where the stages'
// buffers matter, on the simulator, at ZeRO stages 2 and 3, with
// zero_optimization.reduce_once_per_step off (DeepSpeed's reduce after
// every backward) and on (one reduce-scatter per window: Note [Reduce once
// per step] in zero/stage.h). It measures what
// the window costs the process, not only how long it takes: minor page
// faults (getrusage ru_minflt, which sums every thread, i.e. every simulated
// rank) and the bytes and memory of rank 0.
//
//   ./bazelw run -c opt //benchmarks:gpt_window_bench --
//       --benchmark_min_time=1 --benchmark_format=json
//       --benchmark_out=/tmp/gpt_window.json --benchmark_out_format=json
//   (one command line)
//
// One benchmark per (stage, world, once). Each builds one SimWorld, its models
// and Engines (inside a first SimWorld::run: the constructor broadcasts), runs
// a few warm-up windows, then times one window per iteration.
//
// Counters (docs/benchmarks.md):
//   window_ms               median wall time of a window
//   minflt_per_window       median minor page faults of the process per
//                           window (all ranks)
//   minflt_mean_per_window  their mean (glibc sometimes returns freed
//                           memory to the kernel and sometimes not, so
//                           the faults of a window come in bursts)
//   bytes_per_rank_per_window          rank 0's ledger payload bytes
//   backward_bytes_per_rank_per_window of which in backward()
//   peak_bytes              rank 0's Engine::memory().peak_bytes over the
//                           timed windows
//   resident_bytes          rank 0's params + grads + optimizer + rollback
//                           bytes after the last window
//   grad_bytes              of which gradients (full and partitioned)
//   params                  trainable parameters
//
// Benchmarks never run under `bazel test`: the target is tagged "benchmark"
// and is a cc_binary.
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "benchmarks/sim_rig.h"
#include "comm/ledger.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "runtime/runtime_info.h"
#include "sim/sim_world.h"
#include "zero/phase.h"

namespace zerostep {
namespace {

constexpr int kBackwardsPerWindow = 4;
constexpr const char* kModel = "gpt";
constexpr int kModelScale = 16;     // d_model 512: 6.4M parameters
constexpr int64_t kMicroBatch = 4;  // sequences per backward per rank
constexpr uint64_t kSeed = 1;
constexpr int kWarmupWindows = 2;

std::string config_json(int stage, bool once) {
  return std::string("{\"train_micro_batch_size_per_gpu\": ") +
         std::to_string(kMicroBatch) + ", \"gradient_accumulation_steps\": " +
         std::to_string(kBackwardsPerWindow) +
         ", \"managed_gradient_accumulation\": false"
         ", \"zero_optimization\": {\"stage\": " +
         std::to_string(stage) +
         ", \"stage3_param_persistence_threshold\": 0"
         ", \"reduce_once_per_step\": " +
         (once ? "true" : "false") +
         "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
         "{\"lr\": 0.0001, \"weight_decay\": 0.01}}}";
}

int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_minflt);
}

using bench::median;

void BM_GptWindow(benchmark::State& state) {
  const int stage = static_cast<int>(state.range(0));
  const int world_size = static_cast<int>(state.range(1));
  const bool once = state.range(2) != 0;
  std::unique_ptr<Task> task = make_task(kModel, kModelScale);
  std::unique_ptr<SimRig> rig;
  try {
    rig = std::make_unique<SimRig>(
        *task, parse_config(config_json(stage, once), world_size), world_size,
        kBackwardsPerWindow, kMicroBatch, kSeed);
    for (int i = 0; i < kWarmupWindows; ++i) rig->window();
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  rig->clear_ledgers();
  rig->engine0().reset_peak_memory();
  std::vector<double> times, faults;
  for (auto _ : state) {
    const int64_t f0 = minor_faults();
    double t = 0.0;
    try {
      t = rig->window();
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    faults.push_back(static_cast<double>(minor_faults() - f0));
    times.push_back(t);
    state.SetIterationTime(t);
  }
  if (times.empty()) return;
  const double windows = static_cast<double>(times.size());
  const MemoryStats m = rig->engine0().memory();
  state.counters["window_ms"] = median(times) * 1e3;
  state.counters["minflt_per_window"] = median(faults);
  double fault_sum = 0.0;
  for (double f : faults) fault_sum += f;
  state.counters["minflt_mean_per_window"] = fault_sum / windows;
  state.counters["bytes_per_rank_per_window"] =
      static_cast<double>(rig->ledger0().total_bytes()) / windows;
  state.counters["backward_bytes_per_rank_per_window"] =
      static_cast<double>(rig->ledger0().bytes_in(phase::kBackward)) / windows;
  state.counters["peak_bytes"] = static_cast<double>(m.peak_bytes);
  state.counters["resident_bytes"] = static_cast<double>(
      m.param_bytes + m.grad_bytes + m.optimizer_state_bytes +
      m.rollback_bytes);
  state.counters["grad_bytes"] = static_cast<double>(m.grad_bytes);
  state.counters["params"] =
      static_cast<double>(rig->engine0().layout().numel);
}

BENCHMARK(BM_GptWindow)
    ->ArgNames({"stage", "world", "once"})
    ->ArgsProduct({{2, 3}, {2}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  zerostep::set_compute_threads(1);
  benchmark::AddCustomContext("runtime", zerostep::runtime_info());
  benchmark::AddCustomContext(
      "workload", std::string("model=") + zerostep::kModel +
                      " model_scale=" + std::to_string(zerostep::kModelScale) +
                      " micro_batch=" + std::to_string(zerostep::kMicroBatch) +
                      " backwards_per_window=" +
                      std::to_string(zerostep::kBackwardsPerWindow) +
                      " unmanaged stage3_param_persistence_threshold=0");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
