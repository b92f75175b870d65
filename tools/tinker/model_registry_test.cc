// LoRA on Hugging Face folders through the registry (Note [LoRA on Hugging
// Face folders] in model_registry.h): train_attn, train_mlp and
// train_unembed map to PEFT's target modules, lm_head included; the head's
// adapters of a tied and an untied folder train at ZeRO stage 3 on two
// simulated ranks, and save_weights_external writes them in PEFT's files.
#include "tools/tinker/model_registry.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "engine/checkpoint_io.h"
#include "engine/hf_checkpoint.h"
#include "engine/safetensors.h"
#include "models/hf_decoder.h"
#include "sim/sim_world.h"
#include "tools/tinker/checkpoints.h"
#include "tools/tinker/tenancy.h"
#include "tools/tinker/trainer.h"
#include "tools/tinker/trainer_test_util.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// A small random folder of `a`, tied or not, written with save_hf_folder.
std::string make_folder(HfArchitecture a, bool tied, const std::string& name) {
  HfDecoderConfig c = hf_config_for(a);
  c.vocab_size = 40;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 16;
  c.tie_word_embeddings = tied;
  HfCausalLm m = make_hf_decoder(c);
  init_hf_decoder_weights(*m, 3);
  const std::string dir = test_tmp_dir(name);
  save_hf_folder(*m, dir);
  return dir;
}

// The test folders, served once for the whole binary: "tied" (Llama) and
// "untied" (Qwen3).
void serve_folders() {
  static const bool served = [] {
    serve_hf_base_models(
        {hf_base_model("tied", make_folder(HfArchitecture::kLlama, true,
                                           "tied_folder")),
         hf_base_model("untied", make_folder(HfArchitecture::kQwen3, false,
                                             "untied_folder"))});
    return true;
  }();
  (void)served;
}

std::vector<std::string> trainable_names(const Model& m) {
  std::vector<std::string> out;
  for (const auto& item : m.net.module->named_parameters())
    if (item.value().requires_grad()) out.push_back(item.key());
  return out;
}

TEST(HfLoraOptionsTest, EachFlagAddsItsModulesTheHeadLast) {
  LoraOptions l;
  l.rank = 4;
  l.alpha = 8;
  l.seed = 5;
  HfLoraOptions o = hf_lora_options(l);
  EXPECT_EQ(o.rank, 4);
  EXPECT_EQ(o.alpha, 8);
  EXPECT_EQ(o.seed, 5u);
  EXPECT_EQ(o.target_modules,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj",
                                      "gate_proj", "up_proj", "down_proj",
                                      "lm_head"}));
  l.attn = l.mlp = false;
  EXPECT_EQ(hf_lora_options(l).target_modules,
            (std::vector<std::string>{"lm_head"}));
  l.unembed = false;
  l.mlp = true;
  EXPECT_EQ(hf_lora_options(l).target_modules,
            (std::vector<std::string>{"gate_proj", "up_proj", "down_proj"}));
}

// train_unembed alone on a folder: only the head's two adapters train,
// tied or not; with every flag, the head's come after the layers'. A
// config that trains nothing is still refused, naming the keys.
TEST(ModelRegistryHfTest, TrainUnembedAdaptsTheHeadAloneOrWithTheRest) {
  serve_folders();
  SimWorld sim({1, 1});
  const Config config = parse_config(server_ds_config("{}", 1), 1);
  sim.run([&](int r) {
    ModelRegistry models(&sim.comm(r), config, 1234);
    for (const char* base : {"tied", "untied"}) {
      SCOPED_TRACE(base);
      const std::string id = std::string(base) + "-head";
      models.create_model({{"model_id", id},
                           {"base_model", base},
                           {"lora_config",
                            {{"rank", 2},
                             {"train_attn", false},
                             {"train_mlp", false}}}},
                          "t");
      EXPECT_EQ(trainable_names(models.get(id, "t")),
                (std::vector<std::string>{"lm_head.lora_A.weight",
                                          "lm_head.lora_B.weight"}));
      const std::string all = std::string(base) + "-all";
      models.create_model({{"model_id", all},
                           {"base_model", base},
                           {"lora_config", {{"rank", 2}}}},
                          "t");
      const std::vector<std::string> n = trainable_names(models.get(all, "t"));
      ASSERT_EQ(n.size(), 2u * 7 + 2);
      EXPECT_EQ(n.front(), "model.layers.0.self_attn.q_proj.lora_A.weight");
      EXPECT_EQ(n.back(), "lm_head.lora_B.weight");
      try {
        models.create_model({{"model_id", std::string(base) + "-none"},
                             {"base_model", base},
                             {"lora_config",
                              {{"rank", 2},
                               {"train_attn", false},
                               {"train_mlp", false},
                               {"train_unembed", false}}}},
                            "t");
        ADD_FAILURE() << "no error";
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(
                      "lora_config trains nothing: set one of train_attn, "
                      "train_mlp, train_unembed"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_FALSE(models.contains(std::string(base) + "-none"));
    }
  });
}

// At ZeRO stage 3 on two simulated ranks (every parameter partitioned:
// persistence threshold 0), two steps train the head's adapters of a tied
// and an untied folder, and save_weights_external writes them as PEFT's
// lm_head adapters with the engine's bits.
TEST(ModelRegistryHfTest, HeadAdaptersTrainAtStage3AndExportAsPeft) {
  serve_folders();
  const int world = 2;
  const Config config = parse_config(
      server_ds_config(
          R"({"zero_optimization": {"stage": 3,
                                    "stage3_param_persistence_threshold": 0}})",
          world),
      world);
  for (const char* base : {"tied", "untied"}) {
    SCOPED_TRACE(base);
    const std::string state = test_tmp_dir(std::string("state_") + base);
    Caller alice;
    alice.tenant = "alice";
    SimWorld sim({world, 1});
    std::vector<float> engine_bits;
    sim.run([&](int r) {
      at::set_num_threads(1);
      ModelRegistry models(&sim.comm(r), config, 1234);
      CheckpointStore cp(&sim.comm(r), state, 3);
      models.create_model({{"model_id", "m"},
                           {"base_model", base},
                           {"lora_config", {{"rank", 2}}}},
                          "alice");
      Model& m = models.get("m", "alice");
      const torch::Tensor tokens =
          torch::arange(r, r + 8, torch::kLong).remainder(40).view({1, 8});
      for (int step = 0; step < 2; ++step) {
        const torch::Tensor logits = m.net.lm->logits(tokens);
        m.engine->backward(torch::nn::functional::cross_entropy(
            logits.reshape({-1, 40}).narrow(0, 0, 7),
            tokens.reshape({-1}).narrow(0, 1, 7)));
        m.engine->step();
      }
      const torch::Tensor full = m.engine->full_parameters();  // collective
      cp.save_external(models, alice, {{"model_id", "m"}, {"path", "final"}});
      if (r == 0)
        engine_bits.assign(full.data_ptr<float>(),
                           full.data_ptr<float>() + full.numel());
    });
    const std::string folder =
        state + "/tenants/alice/m/external_weights/final";
    const json adapter = json::parse(read_file(folder + "/adapter_config.json"));
    EXPECT_EQ(adapter["target_modules"].back(), "lm_head");
    EXPECT_EQ(adapter["lora_alpha"], 2.0);  // the server's: the rank
    const SafetensorsFile f =
        read_safetensors_file(folder + "/adapter_model.safetensors");
    ASSERT_EQ(f.tensors.size(), 2u * 7 + 2);
    const SafetensorsTensor& head_a = f.tensors[f.tensors.size() - 2];
    const SafetensorsTensor& head_b = f.tensors.back();
    EXPECT_EQ(head_a.name, "base_model.model.lm_head.lora_A.weight");
    EXPECT_EQ(head_a.shape, (std::vector<uint64_t>{2, 16}));
    EXPECT_EQ(head_b.name, "base_model.model.lm_head.lora_B.weight");
    EXPECT_EQ(head_b.shape, (std::vector<uint64_t>{40, 2}));
    // B started at zero: it trained.
    std::vector<float> b(head_b.data.size() / 4);
    std::memcpy(b.data(), head_b.data.data(), head_b.data.size());
    float largest = 0;
    for (float v : b) largest = std::max(largest, std::abs(v));
    EXPECT_GT(largest, 0.0f);
    // The file's bits are the engine's, in its order.
    std::vector<float> file_bits;
    for (const SafetensorsTensor& t : f.tensors) {
      const size_t at = file_bits.size();
      file_bits.resize(at + t.data.size() / 4);
      std::memcpy(file_bits.data() + at, t.data.data(), t.data.size());
    }
    EXPECT_EQ(file_bits, engine_bits);
  }
}

// CHANGELOG's migration: state an earlier build saved for a folder with
// train_unembed=True holds no lm_head adapters (here: saved without them,
// its metadata then saying train_unembed=True). Loading it into a model
// created now is refused on every rank, naming the parameters that differ,
// and creates nothing.
TEST(ModelRegistryHfTest, StateSavedWithoutTheHeadsAdaptersIsRefused) {
  serve_folders();
  const std::string state = test_tmp_dir("state_before");
  const Config config = parse_config(server_ds_config("{}", 1), 1);
  Caller alice;
  alice.tenant = "alice";
  SimWorld sim({1, 1});
  sim.run([&](int r) {
    ModelRegistry models(&sim.comm(r), config, 1234);
    CheckpointStore cp(&sim.comm(r), state, 0);
    models.create_model({{"model_id", "old"},
                         {"base_model", "tied"},
                         {"lora_config", {{"rank", 2}, {"train_unembed", false}}}},
                        "alice");
    cp.save_weights(models, alice, {{"model_id", "old"}, {"path", "c"}});
    const std::string meta_path =
        state + "/tenants/alice/old/c/tinker_meta.json";
    json meta = json::parse(read_file(meta_path));
    ASSERT_EQ(meta["lora"]["train_unembed"], false);
    meta["lora"]["train_unembed"] = true;
    std::ofstream(meta_path) << meta.dump();
    try {
      cp.load_weights(models, alice,
                      {{"model_id", "new"},
                       {"path", "tinker://old/weights/c"},
                       {"create", true}});
      ADD_FAILURE() << "no error";
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("('lm_head.lora_A.weight', shape [2, 16], 32 "
                         "elements) has no counterpart in the checkpoint"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("Nothing was changed"), std::string::npos) << msg;
    }
    EXPECT_FALSE(models.contains("new"));
  });
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
