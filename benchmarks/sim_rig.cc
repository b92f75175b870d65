#include "benchmarks/sim_rig.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace zerostep {

SimRig::SimRig(const Task& task, const Config& config, int world_size,
               int backwards, int64_t micro_batch, uint64_t seed)
    : task_(task),
      config_(config),
      backwards_(backwards),
      world_(SimOptions{world_size, seed}) {
  // Models are built on this thread (make_model uses torch's global seed).
  for (int r = 0; r < world_size; ++r)
    models_.push_back(task.make_model(seed));
  const Batch all = task.make_data(
      seed ^ 0x5eed,
      static_cast<int64_t>(world_size) * backwards * micro_batch);
  batches_.resize(world_size);
  for (int r = 0; r < world_size; ++r)
    for (int i = 0; i < backwards; ++i)
      batches_[r].push_back(
          slice(all, (static_cast<int64_t>(i) * world_size + r) * micro_batch,
                micro_batch));
  engines_.resize(world_size);
  // The Engine constructor broadcasts, so it runs on the rank threads.
  world_.run([&](int r) {
    engines_[r] =
        std::make_unique<Engine>(models_[r], config_, &world_.comm(r));
  });
}

double SimRig::window() {
  const auto t0 = std::chrono::steady_clock::now();
  world_.run([&](int r) { run_window(r); });
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(t1 - t0).count();
}

void SimRig::clear_ledgers() {
  for (int r = 0; r < world_.world_size(); ++r)
    world_.mutable_ledger(r).clear();
}

void SimRig::run_window(int r) {
  Engine& engine = *engines_[r];
  torch::nn::Module& model = *models_[r];
  const bool managed = config_.managed_gradient_accumulation;
  const int64_t steps_before = engine.global_steps();
  for (int i = 0; i < backwards_; ++i) {
    engine.backward(task_.loss(model, batches_[r][i]));
    if (managed) engine.step();
  }
  if (!managed) engine.step();
  if (!engine.was_step_applied() ||
      engine.global_steps() != steps_before + 1 ||
      engine.window_backwards() != 0) {
    throw std::logic_error("rank " + std::to_string(r) +
                           ": the window did not end in exactly one "
                           "applied update");
  }
}

}  // namespace zerostep
