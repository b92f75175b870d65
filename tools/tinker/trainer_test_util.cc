#include "tools/tinker/trainer_test_util.h"

#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "sim/sim_world.h"

namespace zerostep {
namespace tinker {

std::vector<CommandResult> execute_on_sim_world(
    int world, const TrainerOptions& options,
    const std::vector<Command>& commands) {
  at::set_num_threads(1);
  SimWorld sim({world, 1});
  std::vector<std::unique_ptr<RankTrainer>> trainers;
  for (int r = 0; r < world; ++r)
    trainers.push_back(std::make_unique<RankTrainer>(&sim.comm(r), options));
  std::vector<std::vector<CommandResult>> results(world);
  sim.run([&](int r) {
    for (const Command& c : commands)
      results[r].push_back(trainers[r]->execute(c));
  });
  return results[0];
}

std::string test_tmp_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

std::string digest_of(const CommandResult& result) {
  const nlohmann::json& m = result.json.at("metrics");
  const uint64_t hi =
      static_cast<uint64_t>(m.at("param_digest_hi:unique").get<double>());
  const uint64_t lo =
      static_cast<uint64_t>(m.at("param_digest_lo:unique").get<double>());
  return digest_hex(hi << 32 | lo);
}

}  // namespace tinker
}  // namespace zerostep
