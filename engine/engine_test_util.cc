#include "engine/engine_test_util.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/errors.h"
#include "sim/sim_world.h"

namespace zerostep {

MlpWorld::MlpWorld(int world_size, Config config,
                   const MlpWorldOptions& options,
                   std::unique_ptr<LocalWorld> given_world)
    : world(given_world ? std::move(given_world)
                        : std::make_unique<SimWorld>(
                              SimOptions{world_size, options.sim_seed})),
      task(make_task("mlp", options.model_scale)),
      config(std::move(config)),
      data(task->make_data(options.data_seed, options.num_samples)) {
  ZS_CHECK(world->world_size() == world_size);
  for (int r = 0; r < world_size; ++r)
    models.push_back(task->make_model(options.model_seed));
}

void MlpWorld::make_engines(
    const std::function<EngineOptions(int rank)>& options_for) {
  engines.clear();
  engines.resize(models.size());
  world->run([&](int r) {
    const EngineOptions o = options_for ? options_for(r) : EngineOptions();
    engines[r] =
        std::make_unique<Engine>(models[r], config, &world->comm(r), o);
  });
}

torch::Tensor MlpWorld::loss_on(int rank, int64_t first, int64_t count) {
  return task->loss(*models[rank], slice(data, first, count));
}

torch::Tensor MlpWorld::loss(int rank, int i) {
  return loss_on(rank, (i * 4 + rank) % 60);
}

std::vector<torch::Tensor> MlpWorld::full_parameters() {
  std::vector<torch::Tensor> out(models.size());
  world->run([&](int r) { out[r] = engines[r]->full_parameters(); });
  return out;
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data_ptr(), b.data_ptr(),
                     a.numel() * a.element_size()) == 0;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string make_temp_dir(const std::string& prefix) {
  std::string path = "/tmp/" + prefix + "XXXXXX";
  if (mkdtemp(path.data()) == nullptr)
    throw IoError("cannot create a temporary directory '" + path +
                  "': " + std::strerror(errno));
  return path;
}

}  // namespace zerostep
