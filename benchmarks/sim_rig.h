// SimRig: the training windows step_bench and gpt_window_bench time.
// `world_size` simulated ranks (a SimWorld), each with its own replica of
// the task's model (every replica task.make_model(seed)), its own
// `backwards` micro-batches of `micro_batch` samples from one data set
// (rank r's i-th is rows (i * world_size + r) * micro_batch onwards, reused
// every window) and an Engine over `config`.
//
// Thread safety: build and call it from one thread; window() runs the
// ranks on their own threads (SimWorld::run). The constructor seeds
// LibTorch's global generator (make_model).
#ifndef ZEROSTEP_BENCHMARKS_SIM_RIG_H_
#define ZEROSTEP_BENCHMARKS_SIM_RIG_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/ledger.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "sim/sim_world.h"

namespace zerostep {

class SimRig {
 public:
  SimRig(const Task& task, const Config& config, int world_size,
         int backwards, int64_t micro_batch, uint64_t seed);

  // One window on every rank: `backwards` backward() calls, with step()
  // after each (config.managed_gradient_accumulation) or once after the
  // last. Returns its wall time in seconds; throws std::logic_error if a
  // rank's window did not end in exactly one applied update.
  double window();

  // Clears every rank's ledger of collectives.
  void clear_ledgers();
  const Ledger& ledger0() const { return world_.ledger(0); }
  Engine& engine0() { return *engines_[0]; }

 private:
  void run_window(int rank);

  const Task& task_;
  const Config config_;
  const int backwards_;
  SimWorld world_;
  std::vector<std::shared_ptr<torch::nn::Module>> models_;
  std::vector<std::vector<Batch>> batches_;  // [rank][backward]
  std::vector<std::unique_ptr<Engine>> engines_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_BENCHMARKS_SIM_RIG_H_
