// step_bench: the wall time of one gradient-accumulation window, unmanaged
// (N backward() calls, then one step()) against managed (backward() + step()
// N times, gradient_accumulation_steps = N), for ZeRO stages 0 and 1 on the
// simulator, measured alternately in the same run so that the ratio is taken
// under the same machine conditions. Stages 0-3; stage 3 with
// stage3_param_persistence_threshold 0, so every layer is partitioned.
//
//   ./bazelw run -c opt //benchmarks:step_bench --
//       --benchmark_min_time=0.2 --benchmark_format=json
//       --benchmark_out=/tmp/step.json
//   (one command line)
//
// One benchmark per (stage, world). Each builds two SimWorlds (one per
// mode), their models and their Engines once, runs a few warm-up windows,
// and then every benchmark iteration runs one managed window and one
// unmanaged window (order alternating between iterations), each as one
// SimWorld::run in which every rank runs the whole window. The Engines are
// constructed inside a first SimWorld::run (their constructor broadcasts)
// and reused by later runs: SimWorld restarts collective matching at
// sequence 0 in every run, and all ranks issue the same collectives, so
// the matching is unaffected.
//
// The iteration time (manual time) is the managed plus the unmanaged window.
// Counters (see docs/benchmarks.md):
//   managed_ms, unmanaged_ms          median window time of each mode
//   ratio_unmanaged_over_managed      median over iterations of the paired
//                                     ratio unmanaged_i / managed_i
//   bytes_per_rank_per_window_{managed,unmanaged}
//                                     rank 0's ledger bytes per window
//   backward_bytes_per_window_unmanaged   must be 0 for stages 0/1
//   wire_bytes_per_window, formula_wire_bytes_per_window, wire_over_formula
//                                     ring bytes sent vs the alpha-beta model
//   params                            trainable parameters of the model
//
// Benchmarks never run under `bazel test`: the target is tagged "benchmark"
// and is a cc_binary.
#include <benchmark/benchmark.h>
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

constexpr int kBackwardsPerWindow = 4;  // N = gradient_accumulation_steps
constexpr const char* kModel = "mlp";
constexpr int kModelScale = 6;       // mlp hidden width 64 * scale
constexpr int64_t kMicroBatch = 32;  // samples per backward per rank
constexpr uint64_t kSeed = 1;
constexpr int kWarmupWindows = 2;

std::string config_json(int stage, bool managed) {
  return std::string("{\"train_micro_batch_size_per_gpu\": ") +
         std::to_string(kMicroBatch) + ", \"gradient_accumulation_steps\": " +
         std::to_string(kBackwardsPerWindow) +
         ", \"managed_gradient_accumulation\": " +
         (managed ? "true" : "false") +
         ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         ", \"stage3_param_persistence_threshold\": 0"
         "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
         "{\"lr\": 0.001, \"weight_decay\": 0.01}}}";
}

// One simulated world training one copy of the model per rank in one mode.
std::unique_ptr<SimRig> make_rig(const Task& task, int stage, int world_size,
                                 bool managed) {
  return std::make_unique<SimRig>(
      task, parse_config(config_json(stage, managed), world_size), world_size,
      kBackwardsPerWindow, kMicroBatch, kSeed);
}

using bench::median;

void BM_Window(benchmark::State& state) {
  const int stage = static_cast<int>(state.range(0));
  const int world_size = static_cast<int>(state.range(1));
  std::unique_ptr<Task> task = make_task(kModel, kModelScale);
  std::unique_ptr<SimRig> managed, unmanaged;
  try {
    managed = make_rig(*task, stage, world_size, true);
    unmanaged = make_rig(*task, stage, world_size, false);
    for (int i = 0; i < kWarmupWindows; ++i) {
      managed->window();
      unmanaged->window();
    }
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  managed->clear_ledgers();
  unmanaged->clear_ledgers();

  std::vector<double> tm, tu, ratio;
  bool managed_first = true;
  for (auto _ : state) {
    double m = 0.0, u = 0.0;
    try {
      if (managed_first) {
        m = managed->window();
        u = unmanaged->window();
      } else {
        u = unmanaged->window();
        m = managed->window();
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      break;
    }
    managed_first = !managed_first;
    tm.push_back(m);
    tu.push_back(u);
    ratio.push_back(u / m);
    state.SetIterationTime(m + u);
  }
  if (tm.empty()) return;

  const double windows = static_cast<double>(tm.size());
  state.counters["managed_ms"] = median(tm) * 1e3;
  state.counters["unmanaged_ms"] = median(tu) * 1e3;
  state.counters["ratio_unmanaged_over_managed"] = median(ratio);
  state.counters["bytes_per_rank_per_window_managed"] =
      static_cast<double>(managed->ledger0().total_bytes()) / windows;
  state.counters["bytes_per_rank_per_window_unmanaged"] =
      static_cast<double>(unmanaged->ledger0().total_bytes()) / windows;
  state.counters["backward_bytes_per_window_unmanaged"] =
      static_cast<double>(unmanaged->ledger0().bytes_in(phase::kBackward)) /
      windows;
  const double params = static_cast<double>(managed->engine0().layout().numel);
  state.counters["params"] = params;
  // Ring wire bytes one rank sends per window, against the alpha-beta
  // model's β terms for Ψ = 4·params bytes, W ranks, N backwards:
  //   stage 0/1  2(W-1)/W·Ψ           (all-reduce; reduce-scatter+all-gather)
  //   stage 2    (N+1)(W-1)/W·Ψ       (reduce-scatter per backward, gather)
  //   stage 3    3N(W-1)/W·Ψ          (gather fwd, gather bwd, r-s per bwd)
  // The measured side adds padding and the small agreement/norm messages.
  const double w = world_size, n = kBackwardsPerWindow;
  const double psi = 4.0 * params;
  const double terms[] = {2, 2, n + 1, 3 * n};
  const double formula = terms[stage] * (w - 1) / w * psi;
  const double wire =
      static_cast<double>(unmanaged->ledger0().total_wire_bytes()) / windows;
  state.counters["wire_bytes_per_window"] = wire;
  state.counters["formula_wire_bytes_per_window"] = formula;
  if (world_size > 1)
    state.counters["wire_over_formula"] = wire / formula;
  // Both modes must move the same bytes, and stage 0/1 unmanaged nothing
  // during backward (Note [Parity claims] in parity/scenario.h): a timing
  // of runs that differ in traffic would not be a like-for-like ratio.
  if (managed->ledger0().total_bytes() != unmanaged->ledger0().total_bytes())
    state.SkipWithError("managed and unmanaged moved different bytes");
  else if (stage < 2 && unmanaged->ledger0().bytes_in(phase::kBackward) != 0)
    state.SkipWithError("stage 0/1 unmanaged communicated during backward");
}

BENCHMARK(BM_Window)
    ->ArgNames({"stage", "world"})
    ->ArgsProduct({{0, 1, 2, 3}, {1, 2, 4}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // One compute thread per rank (the harness's default); the rank threads
  // themselves are the parallelism.
  zerostep::set_compute_threads(1);
  benchmark::AddCustomContext("runtime", zerostep::runtime_info());
  benchmark::AddCustomContext(
      "workload", std::string("model=") + zerostep::kModel +
                      " model_scale=" + std::to_string(zerostep::kModelScale) +
                      " micro_batch=" + std::to_string(zerostep::kMicroBatch) +
                      " backwards_per_window=" +
                      std::to_string(zerostep::kBackwardsPerWindow));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
