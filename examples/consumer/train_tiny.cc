// train_tiny: trains zerostep's "mlp" task on 2 ranks (threads of this
// process talking Gloo over loopback TCP) with the
// caller owning the gradient-accumulation boundary
// (managed_gradient_accumulation = false): each step is 3 backward() calls
// followed by one step(). Prints the loss per step and the engine's counters;
// exits nonzero if anything is off.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "comm/gloo_world.h"
#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"

namespace {

constexpr int kWorld = 2;
constexpr int kSteps = 3;
constexpr int kBackwardsPerStep = 3;
constexpr int64_t kMicroBatch = 4;
constexpr uint64_t kSeed = 1234;

// gradient_accumulation_steps is only the divisor of the "configured"
// scaling; in unmanaged mode the caller decides how many backward() calls
// go into each step, so per_step_count averages over the calls actually made.
const char* const kDsConfig = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 3,
  "managed_gradient_accumulation": false,
  "gradient_accumulation_scaling": "per_step_count",
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
  "zero_optimization": {"stage": 1}
})";

int fail(const std::string& why) {
  std::fprintf(stderr, "train_tiny: FAILED: %s\n", why.c_str());
  return 1;
}

int run() {
  const zerostep::Config config = zerostep::parse_config(kDsConfig, kWorld);
  if (config.managed_gradient_accumulation)
    return fail("config kept managed gradient accumulation");

  std::unique_ptr<zerostep::Task> task = zerostep::make_task("mlp");
  // One fixed window of data, revisited every step: samples are laid out
  // [backward i][rank r][micro-batch], so the loss over it must fall.
  const int64_t window = kBackwardsPerStep * kWorld * kMicroBatch;
  const zerostep::Batch data = task->make_data(kSeed ^ 0x5eed, window);

  // make_model uses torch's global seed: build every rank's model here, on
  // one thread, before the ranks start.
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(task->make_model(kSeed));

  std::vector<std::vector<double>> losses(kWorld,
                                          std::vector<double>(kSteps + 1));
  std::vector<int64_t> steps(kWorld), samples(kWorld), applied(kWorld);
  std::vector<std::vector<float>> finals(kWorld);

  zerostep::GlooLocalWorld world(kWorld);
  world.run([&](int r) {
    torch::nn::Module& model = *models[r];
    zerostep::Engine engine(models[r], config, &world.comm(r));
    for (int k = 0; k < kSteps; ++k) {
      double sum = 0.0;
      for (int i = 0; i < kBackwardsPerStep; ++i) {
        const int64_t first = (int64_t{i} * kWorld + r) * kMicroBatch;
        torch::Tensor loss =
            task->loss(model, zerostep::slice(data, first, kMicroBatch));
        sum += loss.item<double>();
        engine.backward(loss);
      }
      engine.step();  // exactly one update for the 3 backward() calls
      applied[r] += engine.was_step_applied() ? 1 : 0;
      losses[r][k] = sum / kBackwardsPerStep;
    }
    // Loss after the last update, over the whole window.
    {
      torch::NoGradGuard no_grad;
      losses[r][kSteps] = task->loss(model, data).item<double>();
    }
    steps[r] = engine.global_steps();
    samples[r] = engine.global_samples();
    torch::Tensor flat = engine.flat_parameters().contiguous();
    finals[r].assign(flat.data_ptr<float>(),
                     flat.data_ptr<float>() + flat.numel());
  });

  // The mean over ranks of each step's loss (before that step's update).
  std::vector<double> mean(kSteps + 1, 0.0);
  for (int k = 0; k <= kSteps; ++k) {
    for (int r = 0; r < kWorld; ++r) mean[k] += losses[r][k];
    mean[k] /= kWorld;
  }
  for (int k = 0; k < kSteps; ++k)
    std::printf("step %d: loss %.6f (mean of its %d backward calls)\n", k + 1,
                mean[k], kBackwardsPerStep);
  std::printf("after step %d: loss %.6f\n", kSteps, mean[kSteps]);
  std::printf("global_steps %lld, global_samples %lld\n",
              static_cast<long long>(steps[0]),
              static_cast<long long>(samples[0]));

  const int64_t want_samples =
      int64_t{kSteps} * kBackwardsPerStep * kWorld * kMicroBatch;
  for (int r = 0; r < kWorld; ++r) {
    const std::string who = "rank " + std::to_string(r) + ": ";
    if (steps[r] != kSteps)
      return fail(who + "global_steps " + std::to_string(steps[r]) +
                  " != " + std::to_string(kSteps));
    if (applied[r] != kSteps)
      return fail(who + "applied " + std::to_string(applied[r]) + " of " +
                  std::to_string(kSteps) + " updates");
    if (samples[r] != want_samples)
      return fail(who + "global_samples " + std::to_string(samples[r]) +
                  " != " + std::to_string(want_samples));
    if (finals[r].size() != finals[0].size() ||
        std::memcmp(finals[r].data(), finals[0].data(),
                    finals[0].size() * sizeof(float)) != 0)
      return fail(who + "parameters differ from rank 0's");
  }
  for (int k = 1; k <= kSteps; ++k)
    if (!(mean[k] < mean[k - 1]))
      return fail("loss did not fall with update " + std::to_string(k) +
                  ": " + std::to_string(mean[k - 1]) + " -> " +
                  std::to_string(mean[k]));
  std::printf("OK\n");
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
