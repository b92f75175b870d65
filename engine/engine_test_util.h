// What the engine's tests share (testonly): a world of ranks that each
// train their own replica of the mlp task's model from one data set, and
// bit-for-bit comparisons.
//
// Thread safety: build an MlpWorld and compare results on the test's
// thread; world->run() gives each rank a thread of its own (LocalWorld).
// make_model() seeds LibTorch's global generator, so MlpWorlds are built
// one at a time.
#ifndef ZEROSTEP_ENGINE_ENGINE_TEST_UTIL_H_
#define ZEROSTEP_ENGINE_ENGINE_TEST_UTIL_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/local_world.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"

namespace zerostep {

// An MlpWorld's model, data and simulator; each default is what most
// engine tests use.
struct MlpWorldOptions {
  uint64_t sim_seed = 11;    // the SimWorld's seed (unused with a world)
  int model_scale = 1;       // make_task("mlp", model_scale)
  uint64_t data_seed = 3;    // data = task->make_data(data_seed,
  int64_t num_samples = 64;  //                        num_samples)
  uint64_t model_seed = 5;   // every replica is make_model(model_seed)
};

// `world_size` ranks on a SimWorld (or on `world`, when given), each with
// its own replica of the mlp model (the same weights), one data set, and
// the `config` their Engines get. No Engine exists until make_engines().
class MlpWorld {
 public:
  MlpWorld(int world_size, Config config, const MlpWorldOptions& options = {},
           std::unique_ptr<LocalWorld> world = nullptr);
  MlpWorld(const MlpWorld&) = delete;
  MlpWorld& operator=(const MlpWorld&) = delete;

  // One Engine per rank over its replica with `config`, built in one
  // world->run (stage 3's constructor communicates); `options_for(r)` gives
  // rank r's EngineOptions (default: none). Rethrows a rank's error.
  void make_engines(
      const std::function<EngineOptions(int rank)>& options_for = nullptr);

  // The mean loss of rank `rank`'s replica on samples [first, first + count).
  torch::Tensor loss_on(int rank, int64_t first, int64_t count = 2);
  // Micro-batch `i` of rank `rank`: the two samples from (4i + rank) mod 60.
  torch::Tensor loss(int rank, int i);

  // Every rank's Engine::full_parameters() (a collective at stage 3;
  // needs make_engines()).
  std::vector<torch::Tensor> full_parameters();

  std::unique_ptr<LocalWorld> world;
  std::unique_ptr<Task> task;
  Config config;
  Batch data;
  std::vector<std::shared_ptr<torch::nn::Module>> models;  // one per rank
  std::vector<std::unique_ptr<Engine>> engines;  // one per rank, or none
};

// Same number of elements and the same bytes (dtype and layout are the
// callers': both contiguous, same element type).
bool same_bits(const torch::Tensor& a, const torch::Tensor& b);
bool same_bits(const std::vector<float>& a, const std::vector<float>& b);

// A new directory /tmp/<prefix>XXXXXX (mkdtemp); IoError if it cannot be
// created. The caller removes it.
std::string make_temp_dir(const std::string& prefix);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_ENGINE_TEST_UTIL_H_
