// FROZEN: a user's training program as it was written against zerostep on
// 2026-11-29 (issue 44, "Why"). Do not edit it to follow a change of
// zerostep's public API: a change that breaks it must be named in
// CHANGELOG.md with its migration, and only then is the migration applied
// here, in the same commit (examples/api_freeze/README.md).
//
// It includes engine/config.h (moved to config/config.h since), reaches
// Zero3Block through engine/engine.h (moved to blocks/zero3_block.h) and
// runs its ranks in one process on the simulator (@zerostep//sim:sim_world,
// testonly and public), exiting nonzero if training misbehaves:
//   1. zerostep's "mlp" task on 2 ranks, stage 1, the caller owning the
//      accumulation boundary: 3 steps of (3 backward(), 1 step());
//   2. a model of its own with two Zero3Block blocks, on 2 ranks at stage 3,
//      managed accumulation over 2 micro-batches: 4 updates.
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "sim/sim_world.h"

namespace {

constexpr int kWorld = 2;
constexpr uint64_t kSeed = 1234;

int fail(const std::string& why) {
  std::fprintf(stderr, "week_old_program: FAILED: %s\n", why.c_str());
  return 1;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> to_floats(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// --- 1. the mlp task, unmanaged, stage 1 ----------------------------------

constexpr int kSteps = 3;
constexpr int kBackwardsPerStep = 3;
constexpr int64_t kMicroBatch = 4;

const char* const kUnmanagedConfig = R"({
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 3,
  "managed_gradient_accumulation": false,
  "gradient_accumulation_scaling": "per_step_count",
  "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.0}},
  "zero_optimization": {"stage": 1}
})";

int run_mlp_task() {
  const zerostep::Config config = zerostep::parse_config(kUnmanagedConfig, kWorld);
  if (config.managed_gradient_accumulation)
    return fail("config kept managed gradient accumulation");

  std::unique_ptr<zerostep::Task> task = zerostep::make_task("mlp");
  const int64_t window = kBackwardsPerStep * kWorld * kMicroBatch;
  const zerostep::Batch data = task->make_data(kSeed ^ 0x5eed, window);
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < kWorld; ++r) models.push_back(task->make_model(kSeed));

  std::vector<double> first_loss(kWorld), last_loss(kWorld);
  std::vector<int64_t> steps(kWorld), samples(kWorld), applied(kWorld);
  std::vector<std::vector<float>> finals(kWorld);

  zerostep::SimWorld world({kWorld, kSeed});
  world.run([&](int r) {
    torch::nn::Module& model = *models[r];
    zerostep::Engine engine(models[r], config, &world.comm(r));
    {
      torch::NoGradGuard no_grad;
      first_loss[r] = task->loss(model, data).item<double>();
    }
    for (int k = 0; k < kSteps; ++k) {
      for (int i = 0; i < kBackwardsPerStep; ++i) {
        const int64_t first = (int64_t{i} * kWorld + r) * kMicroBatch;
        engine.backward(
            task->loss(model, zerostep::slice(data, first, kMicroBatch)));
      }
      engine.step();  // exactly one update for the 3 backward() calls
      applied[r] += engine.was_step_applied() ? 1 : 0;
    }
    {
      torch::NoGradGuard no_grad;
      last_loss[r] = task->loss(model, data).item<double>();
    }
    steps[r] = engine.global_steps();
    samples[r] = engine.global_samples();
    finals[r] = to_floats(engine.flat_parameters());
  });

  std::printf("mlp, stage 1, unmanaged: loss %.6f -> %.6f, global_steps %lld, "
              "global_samples %lld\n",
              first_loss[0], last_loss[0], static_cast<long long>(steps[0]),
              static_cast<long long>(samples[0]));
  const int64_t want_samples =
      int64_t{kSteps} * kBackwardsPerStep * kWorld * kMicroBatch;
  for (int r = 0; r < kWorld; ++r) {
    const std::string who = "mlp: rank " + std::to_string(r) + ": ";
    if (steps[r] != kSteps)
      return fail(who + "global_steps " + std::to_string(steps[r]));
    if (applied[r] != kSteps)
      return fail(who + "applied " + std::to_string(applied[r]) + " updates");
    if (samples[r] != want_samples)
      return fail(who + "global_samples " + std::to_string(samples[r]) +
                  " != " + std::to_string(want_samples));
    if (!same_floats(finals[r], finals[0]))
      return fail(who + "parameters differ from rank 0's");
    if (!(last_loss[r] < first_loss[r]))
      return fail(who + "loss did not fall");
  }
  return 0;
}

// --- 2. a model of its own, with Zero3Block blocks, stage 3 ---------------

constexpr int64_t kWidth = 16;

// A residual block whose parameters form one stage 3 group.
struct BlockImpl : torch::nn::Module, zerostep::Zero3Block {
  BlockImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kWidth, 2 * kWidth))),
        fc2(register_module("fc2", torch::nn::Linear(2 * kWidth, kWidth))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return zerostep::zero3_block(*this, x, [&](const torch::Tensor& in) {
      return in + fc2(torch::tanh(fc1(in)));
    });
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl()
      : first(register_module("first", Block())),
        second(register_module("second", Block())),
        head(register_module("head", torch::nn::Linear(kWidth, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return head(second(first(x)));
  }
  Block first, second;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

const char* const kStage3Config = R"({
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
  "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}
})";

int run_own_model() {
  const zerostep::Config config = zerostep::parse_config(kStage3Config, kWorld);
  constexpr int kUpdates = 4;
  constexpr int kMicro = 2;
  constexpr int64_t kBatch = 8;

  // Every rank starts from the same weights; data: rank r's micro-batch m.
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < kWorld; ++r) {
    torch::manual_seed(kSeed);
    models.push_back(Net().ptr());
  }
  torch::manual_seed(kSeed + 1);
  const torch::Tensor x = torch::randn({kWorld * kMicro * kBatch, kWidth});
  const torch::Tensor y = x.sum(1, /*keepdim=*/true).sin();

  std::vector<double> first_loss(kWorld), last_loss(kWorld);
  std::vector<int64_t> steps(kWorld);
  std::vector<std::vector<float>> finals(kWorld);

  zerostep::SimWorld world({kWorld, kSeed});
  world.run([&](int r) {
    auto& net = dynamic_cast<NetImpl&>(*models[r]);
    zerostep::Engine engine(models[r], config, &world.comm(r));
    auto loss_of = [&](const torch::Tensor& in, const torch::Tensor& want) {
      return torch::mse_loss(net.forward(in), want);
    };
    {
      torch::NoGradGuard no_grad;
      first_loss[r] = loss_of(x, y).item<double>();
    }
    for (int k = 0; k < kUpdates * kMicro; ++k) {
      const int64_t at = ((k % kMicro) * kWorld + r) * kBatch;
      engine.backward(loss_of(x.narrow(0, at, kBatch), y.narrow(0, at, kBatch)));
      engine.step();  // applies on every second call (the boundary)
    }
    {
      torch::NoGradGuard no_grad;
      last_loss[r] = loss_of(x, y).item<double>();
    }
    steps[r] = engine.global_steps();
    finals[r] = to_floats(engine.full_parameters());  // every rank calls it
  });

  std::printf("own model, stage 3, Zero3Block: loss %.6f -> %.6f, "
              "global_steps %lld\n",
              first_loss[0], last_loss[0], static_cast<long long>(steps[0]));
  for (int r = 0; r < kWorld; ++r) {
    const std::string who = "own model: rank " + std::to_string(r) + ": ";
    if (steps[r] != kUpdates)
      return fail(who + "global_steps " + std::to_string(steps[r]));
    if (!same_floats(finals[r], finals[0]))
      return fail(who + "parameters differ from rank 0's");
    if (!(last_loss[r] < first_loss[r]))
      return fail(who + "loss did not fall");
  }
  return 0;
}

}  // namespace

int main() {
  try {
    if (int rc = run_mlp_task()) return rc;
    if (int rc = run_own_model()) return rc;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  std::printf("OK\n");
  return 0;
}
