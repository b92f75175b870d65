#include "tools/tinker/export_weights.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/errors.h"
#include "engine/safetensors.h"

namespace zerostep {
namespace tinker {
namespace {

namespace fs = std::filesystem;

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

SafetensorsTensor f32(const std::string& name, std::vector<uint64_t> shape,
                      float first) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = first + static_cast<float>(i);
  return {name, "F32", shape,
          std::string(reinterpret_cast<const char*>(v.data()), n * 4)};
}

std::string dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string d = std::string(tmp ? tmp : "/tmp") + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(ExportWeights, PeftNamesEveryAdapter) {
  EXPECT_EQ(peft_name("block0.qkv_lora.lora_a"),
            "base_model.model.block0.qkv.lora_A.weight");
  EXPECT_EQ(peft_name("block1.fc_out_lora.lora_b"),
            "base_model.model.block1.fc_out.lora_B.weight");
  EXPECT_EQ(peft_name("head_lora.lora_a"),
            "base_model.model.head.lora_A.weight");
  EXPECT_EQ(peft_name("block0.qkv.weight"), "");
  AdapterSpec s;
  s.mlp = false;
  EXPECT_EQ(peft_target_modules(s),
            (std::vector<std::string>{"qkv", "proj", "head"}));
}

TEST(ExportWeights, AnAdapterFolderAsPeftSavesIt) {
  SafetensorsFile trainable;
  trainable.tensors = {f32("block0.qkv_lora.lora_a", {2, 4}, 1),
                       f32("block0.qkv_lora.lora_b", {12, 2}, 100)};
  AdapterSpec spec;
  spec.rank = 2;
  spec.alpha = 0;  // scale 1: lora_alpha = r
  spec.mlp = spec.unembed = false;
  spec.base_model = "zerostep/tiny-gpt";
  const std::string d = dir("peft");
  write_peft_adapter(trainable, spec, d);
  const SafetensorsFile back = decode_safetensors(
      read(d + "/adapter_model.safetensors"), "adapter_model.safetensors");
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[0].name, "base_model.model.block0.qkv.lora_A.weight");
  EXPECT_EQ(back.tensors[0].data, trainable.tensors[0].data);  // same bits
  EXPECT_EQ(back.tensors[1].shape, (std::vector<uint64_t>{12, 2}));
  const nlohmann::json config =
      nlohmann::json::parse(read(d + "/adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 2);
  EXPECT_EQ(config["lora_alpha"], 2.0);
  EXPECT_EQ(config["target_modules"], nlohmann::json({"qkv", "proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], "zerostep/tiny-gpt");
  EXPECT_EQ(external_weight_files(d),
            (std::vector<std::string>{"adapter_config.json",
                                      "adapter_model.safetensors"}));
  // A base weight among the tensors: refused.
  trainable.tensors.push_back(f32("block0.qkv.weight", {12, 4}, 0));
  EXPECT_THROW(write_peft_adapter(trainable, spec, dir("peft2")), UsageError);
}

TEST(ExportWeights, AFullModelUnderItsOwnNames) {
  SafetensorsFile params;
  params.tensors = {f32("tok.weight", {4, 2}, 0), f32("head.bias", {4}, 9)};
  const std::string d = dir("full");
  write_full_model(params, {{"model_type", "zerostep_tiny_gpt"}}, d);
  std::ofstream(d + "/tinker_meta.json") << "{}";  // the server's own
  const SafetensorsFile back =
      decode_safetensors(read(d + "/model.safetensors"), "model.safetensors");
  ASSERT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors[1].name, "head.bias");
  EXPECT_EQ(back.tensors[1].data, params.tensors[1].data);
  EXPECT_EQ(external_weight_files(d),
            (std::vector<std::string>{"config.json", "model.safetensors"}));
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
