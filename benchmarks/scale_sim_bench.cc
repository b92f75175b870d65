// scale_sim_bench: the wall time of scale mode itself (scale/scale_sim.h):
// one window of a model preset at thousands of simulated ranks, per ZeRO
// stage. (What it reports is virtual time; this measures how long the
// simulation takes to compute it.)
//
//   ./bazelw run -c opt //benchmarks:scale_sim_bench --
//       --benchmark_min_time=0.2
//   (one command line)
//
// One benchmark per (stage, world) for the 7B preset with the harness's
// --simulate-scale defaults (4096 tokens per micro-batch, 1 backward per
// window). Counter: ledger_entries, the collectives one rank issues in the
// window (the work, which does not grow with the world size: Note
// [Symmetric ranks]).
//
// Benchmarks never run under `bazel test`: the target is tagged "benchmark"
// and is a cc_binary.
#include <benchmark/benchmark.h>

#include "scale/scale_sim.h"

namespace zerostep {
namespace {

void BM_SimulateScale7B(benchmark::State& state) {
  const ModelShape model = model_preset("7B");
  ScaleOptions o;
  o.schedule.stage = static_cast<int>(state.range(0));
  o.schedule.world_size = static_cast<int>(state.range(1));
  size_t entries = 0;
  for (auto _ : state) {
    const ScaleReport r = simulate_scale(model, o);
    entries = r.ledger.size();
    benchmark::DoNotOptimize(r.step_s);
  }
  state.counters["ledger_entries"] = static_cast<double>(entries);
}

BENCHMARK(BM_SimulateScale7B)
    ->ArgNames({"stage", "world"})
    ->ArgsProduct({{0, 1, 2, 3}, {1024, 4096}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace zerostep

// main() comes from //third_party:benchmark_main.
