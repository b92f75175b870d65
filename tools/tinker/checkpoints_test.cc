// The size bounds behind a tenant's max_bytes, against the files a save
// really writes, and the quota's refusal (checkpoints.h, sampling.h).
#include "tools/tinker/checkpoints.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "engine/safetensors.h"
#include "sim/sim_world.h"
#include "tools/tinker/sampling.h"
#include "tools/tinker/tenancy.h"
#include "tools/tinker/trainer.h"
#include "tools/tinker/trainer_test_util.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

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
        const Saved s = save(stage, world, lora, test_tmp_dir("bounds"), Caller());
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
  const std::string state = test_tmp_dir("quota");
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

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Issue 43 items 4 and 5 on a world of 2 at stage 2 (the export's gather is
// a collective): external weights of a LoRA model (PEFT's files, the
// adapters' bits) and of a full model (every parameter under its own
// name); TTLs, their range and their expiry on a fake clock; runs; copies;
// weights_info; each for the caller's tenant only.
TEST(CheckpointStoreTest, ExternalWeightsTtlsRunsAndCopies) {
  const std::string state = test_tmp_dir("rest");
  int64_t now = 1'000'000;
  const Config config =
      parse_config(server_ds_config(R"({"zero_optimization":{"stage":2}})", 2),
                   2);
  Caller alice;
  alice.tenant = "alice";
  Caller bob;
  bob.tenant = "bob";
  SimWorld sim({2, 1});
  std::vector<std::string> errors(2);
  json out;  // rank 0's answers, by step
  std::vector<float> lora_bits, full_bits;
  sim.run([&](int r) {
    at::set_num_threads(1);
    ModelRegistry models(&sim.comm(r), config, 1234);
    CheckpointStore cp(&sim.comm(r), state, 2, [&] { return now; });
    models.create_model({{"model_id", "s-1:train:0"},
                         {"base_model", "zerostep/tiny-gpt"},
                         {"lora_config", {{"rank", 2}}},
                         {"user_metadata", {{"renderer", "role_colon"}}}},
                        "alice");
    models.create_model({{"model_id", "full"},
                         {"base_model", "zerostep/tiny-gpt"}},
                        "alice");
    const json ext = cp.save_external(
        models, alice,
        {{"model_id", "s-1:train:0"}, {"path", "final"}, {"ttl_seconds", 7200}});
    cp.save_external(models, alice, {{"model_id", "full"}, {"path", "all"}});
    cp.save_weights(models, alice,
                    {{"model_id", "s-1:train:0"}, {"path", "w"}});
    try {  // out of range: refused on every rank, nothing written
      cp.save_external(models, alice, {{"model_id", "full"},
                                       {"path", "x"},
                                       {"ttl_seconds", 60}});
    } catch (const UsageError& e) {
      errors[r] = e.what();
    }
    if (r == 0) {
      const std::string f =
          state + "/tenants/alice/s-1_train_0/external_weights/final";
      const std::string bytes = slurp(f + "/adapter_model.safetensors");
      out["peft_bytes"] = json::binary_t(
          std::vector<uint8_t>(bytes.begin(), bytes.end()));
      out["adapter"] = json::parse(slurp(f + "/adapter_config.json"));
      const std::string whole = slurp(
          state + "/tenants/alice/full/external_weights/all/model.safetensors");
      out["full_bytes"] =
          json::binary_t(std::vector<uint8_t>(whole.begin(), whole.end()));
      for (const auto& p : models.get("s-1:train:0", "alice").engine->parameters())
        for (int64_t i = 0; i < p.numel(); ++i)
          lora_bits.push_back(p.contiguous().data_ptr<float>()[i]);
      const torch::Tensor fp =
          models.get("s-1:train:0", "alice").engine->full_parameters();
      out["flat_numel"] = fp.numel();
      out["flat_equals"] =
          std::vector<float>(fp.data_ptr<float>(),
                             fp.data_ptr<float>() + fp.numel()) == lora_bits;
      out["ext"] = ext;
      out["files"] = cp.external_files(
          alice, {{"path", "tinker://s-1:train:0/external_weights/final"}});
      out["runs"] = cp.runs(models, alice,
                            {{"live", {"s-1:train:0", "full"}},
                             {"limit", 20},
                             {"offset", 0}});
      out["bob_runs"] = cp.runs(models, bob, {{"live", json::array()}});
      out["info"] = cp.weights_info(
          alice, {{"tinker_path", "tinker://s-1:train:0/weights/w"}});
      out["copy"] = cp.copy(alice, {{"source_path", "tinker://s-1:train:0/weights/w"},
                                    {"new_run", "copy-1"},
                                    {"destination_project_id", "p"}});
      // bob can neither see, copy, delete nor extend alice's.
      for (const char* what : {"copy", "ttl", "delete", "files"}) {
        try {
          const json a = {{"path", "tinker://s-1:train:0/weights/w"},
                          {"source_path", "tinker://s-1:train:0/weights/w"},
                          {"new_run", "copy-2"},
                          {"ttl_seconds", nullptr}};
          if (std::string(what) == "copy") cp.copy(bob, a);
          if (std::string(what) == "ttl") cp.set_ttl(bob, a);
          if (std::string(what) == "delete") cp.remove(bob, a);
          if (std::string(what) == "files") cp.external_files(bob, a);
          out["bob"][what] = "no error";
        } catch (const NotFound& e) {
          out["bob"][what] = e.what();
        }
      }
      // The TTL runs out: the external weights are gone for everyone.
      now += 7199;
      out["before"] = cp.list(alice, {{"limit", 100}, {"offset", 0}});
      now += 1;
      out["after"] = cp.list(alice, {{"limit", 100}, {"offset", 0}});
      // A TTL set on the copy, then removed; then one that runs out and
      // is swept.
      cp.set_ttl(alice, {{"path", "tinker://copy-1/weights/w"},
                         {"ttl_seconds", 3600}});
      cp.set_ttl(alice, {{"path", "tinker://copy-1/weights/w"},
                         {"ttl_seconds", nullptr}});
      now += 4000;
      out["copy_alive"] = cp.list(alice, {{"model_id", "copy-1"}});
      cp.set_ttl(alice, {{"path", "tinker://full/external_weights/all"},
                         {"ttl_seconds", 3600}});
      now += 3600;
      out["swept"] = cp.sweep_expired(0);
    }
  });
  EXPECT_EQ(errors[0], errors[1]);
  EXPECT_NE(errors[0].find("ttl_seconds = 60 must be from 3600 (1 hour) to "
                           "315360000 (10 years)"),
            std::string::npos)
      << errors[0];
  EXPECT_EQ(out["ext"]["path"], "tinker://s-1:train:0/external_weights/final");
  EXPECT_EQ(out["files"]["files"], json({"adapter_config.json",
                                         "adapter_model.safetensors"}));
  EXPECT_EQ(out["files"]["expires_at"], 1'000'000 + 7200);
  // PEFT's files hold the adapters' bits, in the engine's order.
  const std::string folder =
      state + "/tenants/alice/s-1_train_0/external_weights/final";
  const auto& raw = out["peft_bytes"].get_binary();
  const SafetensorsFile peft =
      decode_safetensors(std::string(raw.begin(), raw.end()), "a");
  std::vector<float> got;
  for (const SafetensorsTensor& t : peft.tensors) {
    EXPECT_EQ(t.name.rfind("base_model.model.", 0), 0u) << t.name;
    const size_t n = t.data.size() / 4;
    const size_t at = got.size();
    got.resize(at + n);
    std::memcpy(got.data() + at, t.data.data(), t.data.size());
  }
  EXPECT_EQ(got, lora_bits);
  EXPECT_EQ(out["flat_numel"], lora_bits.size());
  EXPECT_EQ(out["flat_equals"], true);
  const json& adapter = out["adapter"];
  EXPECT_EQ(adapter["r"], 2);
  EXPECT_EQ(adapter["target_modules"],
            json({"qkv", "proj", "fc", "fc_out", "head"}));
  const auto& whole = out["full_bytes"].get_binary();
  const SafetensorsFile full =
      decode_safetensors(std::string(whole.begin(), whole.end()), "m");
  EXPECT_EQ(full.tensors.front().name, "tok.weight");
  EXPECT_EQ(full.tensors.size(), 2 + 2 * 12 + 4u);  // tok, pos, 2 blocks, ln_f, head
  // Runs: both live, with the LoRA one's rank, metadata and checkpoint.
  const json& runs = out["runs"]["training_runs"];
  ASSERT_EQ(runs.size(), 2u) << out["runs"];
  EXPECT_EQ(out["runs"]["cursor"]["total_count"], 2);
  for (const json& run : runs) {
    EXPECT_EQ(run["model_owner"], "alice");
    if (run["training_run_id"] == "s-1:train:0") {
      EXPECT_EQ(run["lora_rank"], 2);
      EXPECT_EQ(run["user_metadata"], json({{"renderer", "role_colon"}}));
      EXPECT_EQ(run["last_checkpoint"]["tinker_path"],
                "tinker://s-1:train:0/weights/w");
    } else {
      EXPECT_EQ(run["is_lora"], false);
    }
  }
  EXPECT_EQ(out["bob_runs"]["training_runs"], json::array());
  EXPECT_EQ(out["info"]["lora_rank"], 2);
  EXPECT_EQ(out["info"]["base_model"], "zerostep/tiny-gpt");
  EXPECT_EQ(out["copy"]["tinker_path"], "tinker://copy-1/weights/w");
  for (const char* what : {"copy", "ttl", "delete", "files"})
    EXPECT_NE(out["bob"][what].get<std::string>().find("tinker://s-1:train:0"),
              std::string::npos)
        << what << ": " << out["bob"][what];
  // Listed with its expiry until it passes, then gone (and its folder).
  auto paths = [](const json& listing) {
    std::vector<std::string> p;
    for (const json& c : listing["checkpoints"]) p.push_back(c["tinker_path"]);
    std::sort(p.begin(), p.end());
    return p;
  };
  EXPECT_EQ(paths(out["before"]),
            (std::vector<std::string>{
                "tinker://copy-1/weights/w",
                "tinker://full/external_weights/all",
                "tinker://s-1:train:0/external_weights/final",
                "tinker://s-1:train:0/weights/w"}));
  EXPECT_EQ(paths(out["after"]),
            (std::vector<std::string>{"tinker://copy-1/weights/w",
                                      "tinker://full/external_weights/all",
                                      "tinker://s-1:train:0/weights/w"}));
  EXPECT_FALSE(fs::exists(folder));
  EXPECT_EQ(paths(out["copy_alive"]),
            (std::vector<std::string>{"tinker://copy-1/weights/w"}));
  EXPECT_EQ(out["swept"], 1);
  EXPECT_FALSE(fs::exists(state + "/tenants/alice/full/external_weights/all"));
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
