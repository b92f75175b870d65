// The size bounds behind a tenant's max_bytes, against the files a save
// really writes, and the quota's refusal (checkpoints.h, sampling.h).
#include "tools/tinker/checkpoints.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "sim/sim_world.h"
#include "tools/tinker/sampling.h"
#include "tools/tinker/tenancy.h"
#include "tools/tinker/trainer.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string tmp_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/" + name;
  fs::remove_all(dir);
  return dir;
}

struct Saved {
  uint64_t checkpoint_bytes = 0, checkpoint_bound = 0;
  uint64_t sampler_bytes = 0, sampler_bound = 0;
  std::vector<std::string> errors;  // every rank's, in rank order
};

// One model of `lora_rank` (0: every parameter trains) saved as a
// checkpoint "c" and sampler weights "s" by tenant "t" on a simulated
// world, under `caller`'s quota.
Saved save(int stage, int world, int lora_rank, const std::string& state,
           Caller caller) {
  at::set_num_threads(1);
  json ds = {{"zero_optimization", {{"stage", stage}}}};
  if (stage == 3)
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  const Config config =
      parse_config(server_ds_config(ds.dump(), world), world);
  SimWorld sim({world, 1});
  Saved out;
  out.errors.resize(world);
  sim.run([&](int r) {
    ModelRegistry models(&sim.comm(r), config, 1234);
    CheckpointStore checkpoints(&sim.comm(r), state, stage);
    SamplerStore samplers(&sim.comm(r), state);
    json create = {{"model_id", "m"}, {"base_model", "zerostep/tiny-gpt"}};
    if (lora_rank > 0) create["lora_config"] = {{"rank", lora_rank}};
    models.create_model(create, caller.tenant);
    try {
      checkpoints.save_weights(models, caller, {{"model_id", "m"},
                                                {"path", "c"}});
      samplers.save_for_sampler(models, caller,
                                {{"model_id", "m"}, {"path", "s"}});
    } catch (const UsageError& e) {
      out.errors[r] = e.what();
    }
    if (r == 0) {
      Model& m = models.get("m", caller.tenant);
      out.checkpoint_bound = checkpoint_bytes_bound(m, stage, world);
      out.sampler_bound = sampler_bytes_bound(m);
    }
  });
  const std::string run = run_dir(state, caller.tenant, "m");
  out.sampler_bytes = tree_bytes(run + "/sampler_weights");
  out.checkpoint_bytes = tree_bytes(run) - out.sampler_bytes;
  return out;
}

// Every stage and world 1-3, LoRA and full fine-tuning: the bound holds
// what was written (the checkpoint with its tinker_meta.json and the
// engine's `latest`), and is not loose by more than half plus 48 KiB.
TEST(CheckpointBoundsTest, HoldWhatEverySaveWrites) {
  for (int stage : {0, 1, 2, 3})
    for (int world : {1, 2, 3})
      for (int lora : {4, 0}) {
        const std::string at = "s" + std::to_string(stage) + " w" +
                               std::to_string(world) + " lora " +
                               std::to_string(lora);
        const Saved s = save(stage, world, lora, tmp_dir("bounds"), Caller());
        for (const std::string& e : s.errors) ASSERT_EQ(e, "") << at;
        ASSERT_GT(s.checkpoint_bytes, 0u) << at;
        EXPECT_LE(s.checkpoint_bytes, s.checkpoint_bound) << at;
        EXPECT_LE(s.checkpoint_bound, s.checkpoint_bytes * 3 / 2 + (48 << 10))
            << at << ": " << s.checkpoint_bytes;
        EXPECT_LE(s.sampler_bytes, s.sampler_bound) << at;
        EXPECT_LE(s.sampler_bound, s.sampler_bytes * 3 / 2 + (48 << 10))
            << at << ": " << s.sampler_bytes;
      }
}

// A save that would take the tenant over max_bytes is refused on every
// rank, rank 0 saying by how much, and writes nothing.
TEST(CheckpointBoundsTest, ASaveOverTheQuotaWritesNothing) {
  const std::string state = tmp_dir("quota");
  Caller caller;
  caller.tenant = "t";
  caller.max_bytes = 50000;
  const Saved s = save(2, 2, 4, state, caller);
  EXPECT_NE(s.errors[0].find("save_weights 'c': tenant 't' holds 0 bytes in "
                             "the state directory and this needs up to"),
            std::string::npos)
      << s.errors[0];
  EXPECT_NE(s.errors[0].find("over its quota of 50000 bytes (max_bytes"),
            std::string::npos)
      << s.errors[0];
  EXPECT_NE(s.errors[1].find("over the tenant's quota (rank 0 says how "
                             "much). Nothing was written"),
            std::string::npos)
      << s.errors[1];
  EXPECT_EQ(tree_bytes(tenant_dir(state, "t")), 0u);
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
