// The Hugging Face decoders without Python: transformers' names and order,
// meta-device builds, folder round trips, refused loads, LoRA and PEFT's
// adapter files, and causality. Numbers against transformers itself:
// models/hf_parity_test.sh.
#include "models/hf_decoder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <utility>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "engine/hf_checkpoint.h"
#include "engine/safetensors.h"
#include "models/lora.h"

namespace zerostep {
namespace {

namespace fs = std::filesystem;

HfDecoderConfig small(HfArchitecture a, bool tied = false) {
  HfDecoderConfig c = hf_config_for(a);
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = tied;
  c.llama3_rope = a == HfArchitecture::kLlama;
  c.rope_factor = 8.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_position_embeddings = 8;
  return c;
}

HfCausalLm random_model(const HfDecoderConfig& c, uint64_t seed = 1,
                        const HfLoraOptions& lora = {}) {
  HfDecoderOptions o;
  o.lora = lora;
  HfCausalLm m = make_hf_decoder(c, o);
  init_hf_decoder_weights(*m, seed);
  return m;
}

std::vector<std::string> names(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& item : m.named_parameters()) out.push_back(item.key());
  return out;
}

std::string temp_dir(const std::string& leaf) {
  const fs::path d = fs::path(::testing::TempDir()) /
                     ::testing::UnitTest::GetInstance()->current_test_info()->name() /
                     leaf;
  fs::remove_all(d);
  return d.string();
}

// The PEFT adapter folder of m's adapters (save_lora_tensors, then
// write_peft_adapter for the base "/models/base"): its adapter_config.json
// and adapter_model.safetensors.
std::pair<nlohmann::json, SafetensorsFile> peft_adapter_of(
    const HfCausalLmImpl& m, const HfLoraOptions& lora) {
  const std::string lora_file = temp_dir("lora.safetensors");
  fs::create_directories(fs::path(lora_file).parent_path());
  save_lora_tensors(m, lora_file);
  const std::string dir = temp_dir("adapter");
  write_peft_adapter(lora_file, lora, "/models/base", dir);
  std::ifstream cfg(dir + "/adapter_config.json");
  return {nlohmann::json::parse(cfg),
          read_safetensors_file(dir + "/adapter_model.safetensors")};
}

TEST(HfDecoderTest, ParametersCarryTransformersNamesInItsOrder) {
  HfDecoderConfig c = small(HfArchitecture::kQwen3);
  c.num_hidden_layers = 1;
  EXPECT_EQ(names(*make_hf_decoder(c)),
            (std::vector<std::string>{
                "model.embed_tokens.weight",
                "model.layers.0.self_attn.q_proj.weight",
                "model.layers.0.self_attn.k_proj.weight",
                "model.layers.0.self_attn.v_proj.weight",
                "model.layers.0.self_attn.o_proj.weight",
                "model.layers.0.self_attn.q_norm.weight",
                "model.layers.0.self_attn.k_norm.weight",
                "model.layers.0.mlp.gate_proj.weight",
                "model.layers.0.mlp.up_proj.weight",
                "model.layers.0.mlp.down_proj.weight",
                "model.layers.0.input_layernorm.weight",
                "model.layers.0.post_attention_layernorm.weight",
                "model.norm.weight", "lm_head.weight"}));
  // Qwen2: q/k/v biases, no o_proj bias; tied: no lm_head.
  c = small(HfArchitecture::kQwen2, /*tied=*/true);
  c.num_hidden_layers = 1;
  const std::vector<std::string> n = names(*make_hf_decoder(c));
  EXPECT_EQ(std::vector<std::string>(n.begin() + 1, n.begin() + 8),
            (std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.0.self_attn.q_proj.bias",
                                      "model.layers.0.self_attn.k_proj.weight",
                                      "model.layers.0.self_attn.k_proj.bias",
                                      "model.layers.0.self_attn.v_proj.weight",
                                      "model.layers.0.self_attn.v_proj.bias",
                                      "model.layers.0.self_attn.o_proj.weight"}));
  EXPECT_EQ(n.back(), "model.norm.weight");
}

TEST(HfDecoderTest, BlocksAreTheLayersAndAnUntiedModelsEmbeddingAndHead) {
  const Zero3BlockMap untied =
      map_zero3_blocks(*make_hf_decoder(small(HfArchitecture::kLlama)));
  EXPECT_EQ(untied.blocks.size(), 4u);  // embed, 2 layers, lm_head
  EXPECT_EQ(untied.block_of_param.front(), 0);
  EXPECT_EQ(untied.block_of_param.back(), 3);
  const Zero3BlockMap tied =
      map_zero3_blocks(*make_hf_decoder(small(HfArchitecture::kLlama, true)));
  EXPECT_EQ(tied.blocks.size(), 2u);  // the layers only
  EXPECT_EQ(tied.block_of_param.front(), -1);  // embedding: persistent
}

TEST(HfDecoderTest, MetaBuildHasTheSameNamesAndShapesAndNoStorage) {
  for (bool tied : {false, true}) {
    HfDecoderOptions meta;
    meta.device = torch::kMeta;
    meta.lora.rank = 2;
    meta.lora.target_modules.push_back("lm_head");
    HfDecoderOptions cpu;
    cpu.lora = meta.lora;
    const HfCausalLm a = make_hf_decoder(small(HfArchitecture::kQwen3, tied), meta);
    const HfCausalLm b = make_hf_decoder(small(HfArchitecture::kQwen3, tied), cpu);
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i].key(), pb[i].key());
      EXPECT_EQ(pa[i].value().sizes(), pb[i].value().sizes());
      EXPECT_TRUE(pa[i].value().is_meta()) << pa[i].key();
      EXPECT_EQ(pa[i].value().requires_grad(), pb[i].value().requires_grad());
    }
  }
}

TEST(HfDecoderTest, FolderRoundTripsExactlyInF32AndRoundsInBf16) {
  HfCausalLm m = random_model(small(HfArchitecture::kQwen2), 3);
  const std::string dir = temp_dir("f32");
  save_hf_folder(*m, dir);
  HfCausalLm back = load_hf_decoder(dir);
  EXPECT_EQ(back->config().architecture, HfArchitecture::kQwen2);
  const auto pa = m->named_parameters(), pb = back->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pa[i].value(), pb[i].value())) << pa[i].key();
  const torch::Tensor tokens = torch::randint(50, {2, 7}, torch::kLong);
  EXPECT_TRUE(torch::equal(m->forward(tokens), back->forward(tokens)));

  const std::string dir16 = temp_dir("bf16");
  save_hf_folder(*m, dir16, HfDtype::kBF16);
  EXPECT_EQ(HfCheckpointSource(dir16).tensor("model.norm.weight").dtype, "BF16");
  const HfCausalLm b16 = load_hf_decoder(dir16);
  const auto pc = b16->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(torch::equal(pc[i].value(), pa[i].value()
                                                .to(torch::kBFloat16)
                                                .to(torch::kFloat)))
        << pa[i].key();
}

TEST(HfDecoderTest, LoadChecksEverythingFirstAndNamesEveryMismatch) {
  HfCausalLm m = random_model(small(HfArchitecture::kLlama), 4);
  const std::string dir = temp_dir("folder");
  save_hf_folder(*m, dir);
  // A model whose config differs from the folder's weights: a wider MLP
  // and an extra layer.
  HfDecoderConfig other = small(HfArchitecture::kLlama);
  other.intermediate_size = 48;
  other.num_hidden_layers = 3;
  HfCausalLm target = random_model(other, 5);
  const torch::Tensor before = target->named_parameters()[0].value().clone();
  const HfCheckpointSource source(dir);
  try {
    load_hf_weights(*target, source);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'model.layers.0.mlp.gate_proj.weight' has shape "
                       "[40, 32] in the folder, [48, 32] in the model"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("'model.layers.2.self_attn.q_proj.weight' is missing"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("problems"), std::string::npos) << msg;
  }
  EXPECT_TRUE(torch::equal(target->named_parameters()[0].value(), before));
}

TEST(HfDecoderTest, LaterTokensDoNotChangeEarlierLogits) {
  for (HfArchitecture a : {HfArchitecture::kLlama, HfArchitecture::kQwen2,
                           HfArchitecture::kQwen3}) {
    HfCausalLm m = random_model(small(a), 6);
    torch::Tensor tokens = torch::randint(50, {1, 9}, torch::kLong);
    const torch::Tensor full = m->forward(tokens);
    tokens[0][8] = (tokens[0][8].item<int64_t>() + 1) % 50;
    const torch::Tensor changed = m->forward(tokens);
    EXPECT_TRUE(torch::equal(full.narrow(1, 0, 8), changed.narrow(1, 0, 8)));
    EXPECT_FALSE(torch::equal(full.narrow(1, 8, 1), changed.narrow(1, 8, 1)));
  }
}

TEST(HfDecoderTest, ConfigsTheArchitectureCannotHaveAreRefused) {
  HfDecoderConfig c = small(HfArchitecture::kQwen3);
  c.qk_norm = false;  // as a hand-made config might forget
  EXPECT_THROW(make_hf_decoder(c), UsageError);
  c = small(HfArchitecture::kQwen2);
  c.qkv_bias = false;
  EXPECT_THROW(make_hf_decoder(c), UsageError);
  c = small(HfArchitecture::kLlama);
  c.num_key_value_heads = 3;
  EXPECT_THROW(make_hf_decoder(c), UsageError);
}

// Note [bf16 products on LibTorch 1.13's CPU]: a bf16 projection's output
// (bias included) and weight gradient are the float32 results rounded once
// (Python torch 2's numbers), on every LibTorch.
TEST(HfDecoderTest, Bf16ProjectionsRoundOnce) {
  HfLinear lin(64, 96, /*bias=*/true, HfLoraOptions{}, false, 0, torch::kCPU);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : lin->parameters()) p.normal_();
  }
  lin->to(torch::kBFloat16);
  const torch::Tensor x = torch::randn({2, 24, 64}).to(torch::kBFloat16);
  const torch::Tensor dy = torch::randn({2, 24, 96}).to(torch::kBFloat16);
  const torch::Tensor y = lin->forward(x);
  y.backward(dy);
  const auto params = lin->parameters();
  const torch::Tensor w = params[0].detach().to(torch::kFloat);
  const torch::Tensor b = params[1].detach().to(torch::kFloat);
  const torch::Tensor y_exact = torch::linear(x.to(torch::kFloat), w, b);
  const torch::Tensor dw_exact =
      torch::matmul(dy.to(torch::kFloat).reshape({48, 96}).t(),
                    x.to(torch::kFloat).reshape({48, 64}));
  // One rounding to bf16: at most half a bf16 ulp, 2^-8 relative (LibTorch
  // 1.13's own bf16 weight gradient is off by several ulps here).
  const auto within_one_rounding = [](const torch::Tensor& got,
                                      const torch::Tensor& exact) {
    return ((got.to(torch::kFloat) - exact).abs() -
            exact.abs() * std::ldexp(1.0, -8))
               .max()
               .item<double>() <= 1e-6;
  };
  EXPECT_TRUE(within_one_rounding(y, y_exact));
  EXPECT_TRUE(within_one_rounding(params[0].grad(), dw_exact));
}

TEST(HfDecoderTest, BadTokensAreUsageErrors) {
  HfCausalLm m = random_model(small(HfArchitecture::kLlama), 7);
  EXPECT_THROW(m->forward(torch::full({1, 3}, 50, torch::kLong)), UsageError);
  EXPECT_THROW(m->forward(torch::zeros({1, 33}, torch::kLong)), UsageError);
  EXPECT_THROW(m->forward(torch::zeros({3}, torch::kLong)), UsageError);
}

TEST(HfDecoderTest, Llama3RopeScalesOnlyTheLowFrequencies) {
  HfDecoderConfig c = small(HfArchitecture::kLlama);
  c.head_dim = 16;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.llama3_rope = false;
  const torch::Tensor plain = make_hf_decoder(c)->inv_freq();
  c.llama3_rope = true;
  const torch::Tensor scaled = make_hf_decoder(c)->inv_freq();
  // Wavelengths 2 pi / f: under high_freq_wavelen (8 / 4 = 2) untouched,
  // over low_freq_wavelen (8) divided by the factor, smoothed between.
  for (int64_t i = 0; i < plain.numel(); ++i) {
    const double f = plain[i].item<double>(), g = scaled[i].item<double>();
    const double wavelen = 2 * M_PI / f;
    if (wavelen < 2)
      EXPECT_EQ(g, f) << i;
    else if (wavelen > 8)
      EXPECT_FLOAT_EQ(g, f / 8) << i;
    else
      EXPECT_TRUE(g < f && g > f / 8) << i;
  }
}

TEST(HfDecoderTest, FreshLoraChangesNothingAndTrainsAlone) {
  HfLoraOptions lora;
  lora.rank = 4;
  lora.alpha = 8;
  lora.seed = 9;
  lora.target_modules = {"q_proj", "v_proj", "down_proj"};
  const HfDecoderConfig c = small(HfArchitecture::kQwen3);
  HfCausalLm base = random_model(c, 10);
  HfCausalLm adapted = random_model(c, 10, lora);
  const torch::Tensor tokens = torch::randint(50, {2, 6}, torch::kLong);
  EXPECT_TRUE(torch::equal(base->forward(tokens), adapted->forward(tokens)));
  std::vector<std::string> lora_names;
  for (const std::string& n : names(*adapted))
    if (is_lora_parameter_name(n)) lora_names.push_back(n);
  EXPECT_EQ(lora_names.size(), 2u * 3 * 2);  // layers x targets x (A, B)
  EXPECT_EQ(lora_names[0], "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(lora_names[1], "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(freeze_all_but_lora(*adapted), 12);

  HfLoraOptions bad = lora;
  bad.target_modules = {"qkv_proj"};
  try {
    make_hf_decoder(c, HfDecoderOptions{bad});
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'qkv_proj' is not one of q_proj, "
                                         "k_proj, v_proj, o_proj, gate_proj, "
                                         "up_proj, down_proj, lm_head"),
              std::string::npos)
        << e.what();
  }
}

// Note [The head's LoRA]: "lm_head" adapts the head under peft's names,
// tied or untied; a tied model's lm_head module holds only the adapters
// and is a stage 3 block; the adapter adds (x A^T) B^T * alpha / rank.
TEST(HfDecoderTest, HeadLoraCarriesPeftNamesTiedAndUntied) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const HfDecoderConfig c = small(HfArchitecture::kLlama, tied);
    HfLoraOptions lora;
    lora.rank = 3;
    lora.alpha = 6;
    lora.seed = 5;
    lora.target_modules = {"lm_head"};
    HfCausalLm base = random_model(c, 13);
    HfCausalLm adapted = random_model(c, 13, lora);
    const std::vector<std::string> n = names(*adapted);
    std::vector<std::string> want = names(*base);
    want.push_back("lm_head.lora_A.weight");
    want.push_back("lm_head.lora_B.weight");
    EXPECT_EQ(n, want);
    const auto params = adapted->named_parameters();
    const torch::Tensor a = params["lm_head.lora_A.weight"];
    const torch::Tensor b = params["lm_head.lora_B.weight"];
    EXPECT_EQ(a.sizes(), (std::vector<int64_t>{3, 32}));
    EXPECT_EQ(b.sizes(), (std::vector<int64_t>{50, 3}));
    // A from the seed's stream after every layer's, B zero.
    EXPECT_TRUE(torch::equal(
        a, lora_initial_a(3, 32, 5, 2 * 7)));
    EXPECT_TRUE(torch::equal(b, torch::zeros({50, 3})));
    EXPECT_EQ(freeze_all_but_lora(*adapted), 2);
    // The head is a block (the last), holding the adapters.
    const Zero3BlockMap map = map_zero3_blocks(*adapted);
    EXPECT_EQ(map.blocks.size(), tied ? 3u : 4u);
    EXPECT_EQ(map.block_of_param,
              (std::vector<int>{static_cast<int>(map.blocks.size()) - 1,
                                static_cast<int>(map.blocks.size()) - 1}));
    // Fresh: the base's logits. With B set, the logits move by
    // (h A^T) B^T * alpha / rank: twice as far at alpha 6 as at alpha 3
    // (the scale), and as far again for B doubled (linear in B).
    const torch::Tensor tokens = torch::randint(50, {2, 6}, torch::kLong);
    torch::NoGradGuard no_grad;
    const torch::Tensor plain = base->forward(tokens);
    EXPECT_TRUE(torch::equal(plain, adapted->forward(tokens)));
    b.normal_(0.0, 0.5);
    const torch::Tensor moved = adapted->forward(tokens) - plain;
    EXPECT_GT(moved.abs().max().item<double>(), 1e-2);
    HfLoraOptions half = lora;
    half.alpha = 3;
    HfCausalLm halved = random_model(c, 13, half);
    halved->named_parameters()["lm_head.lora_B.weight"].copy_(b);
    EXPECT_TRUE(torch::allclose(halved->forward(tokens) - plain, moved / 2,
                                1e-4, 1e-5));
    b.mul_(2);
    EXPECT_TRUE(torch::allclose(adapted->forward(tokens) - plain, moved * 2,
                                1e-4, 1e-5));
  }
}

TEST(HfDecoderTest, PeftAdapterFilesNameEveryAdapterAsPeftSavesIt) {
  HfLoraOptions lora;
  lora.rank = 2;
  lora.alpha = 6;
  lora.target_modules = {"o_proj", "up_proj"};
  HfCausalLm m = random_model(small(HfArchitecture::kLlama), 11, lora);
  const auto [j, f] = peft_adapter_of(*m, lora);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 2);
  EXPECT_EQ(j["lora_alpha"], 6.0);
  EXPECT_EQ(j["target_modules"], (std::vector<std::string>{"o_proj", "up_proj"}));
  EXPECT_EQ(j["base_model_name_or_path"], "/models/base");
  ASSERT_EQ(f.tensors.size(), 2u * 2 * 2);
  std::set<std::string> got;
  for (const SafetensorsTensor& t : f.tensors) got.insert(t.name);
  EXPECT_TRUE(got.count(
      "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"));
  EXPECT_TRUE(got.count(
      "base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight"));

  // A file with base weights in it is refused, naming one.
  const std::string full = temp_dir("full");
  save_hf_folder(*m, full);
  try {
    write_peft_adapter(full + "/model.safetensors", lora, "b", temp_dir("x"));
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"),
              std::string::npos)
        << e.what();
  }
}

// The head's adapters in PEFT's files: lm_head in target_modules, its
// tensors under base_model.model.lm_head (tied too: peft's name for them).
TEST(HfDecoderTest, PeftAdapterFilesHoldTheHeadsAdapters) {
  HfLoraOptions lora;
  lora.rank = 2;
  lora.target_modules = {"q_proj", "lm_head"};
  HfCausalLm m = random_model(small(HfArchitecture::kQwen3, /*tied=*/true), 14,
                              lora);
  const auto [j, f] = peft_adapter_of(*m, lora);
  EXPECT_EQ(j["target_modules"], (std::vector<std::string>{"q_proj", "lm_head"}));
  ASSERT_EQ(f.tensors.size(), 2u * 2 + 2);
  EXPECT_EQ(f.tensors[4].name, "base_model.model.lm_head.lora_A.weight");
  EXPECT_EQ(f.tensors[4].shape, (std::vector<uint64_t>{2, 32}));
  EXPECT_EQ(f.tensors[5].name, "base_model.model.lm_head.lora_B.weight");
  EXPECT_EQ(f.tensors[5].shape, (std::vector<uint64_t>{50, 2}));
}

TEST(HfDecoderTest, MetadataCopySkipsWeights) {
  HfCausalLm m = random_model(small(HfArchitecture::kLlama), 12);
  const std::string from = temp_dir("from");
  save_hf_folder(*m, from);
  std::ofstream(from + "/tokenizer.json") << "{}";
  std::ofstream(from + "/model-00001-of-00002.safetensors") << "x";
  const std::string to = temp_dir("to");
  copy_hf_folder_metadata(from, to);
  EXPECT_TRUE(fs::exists(to + "/config.json"));
  EXPECT_TRUE(fs::exists(to + "/tokenizer.json"));
  EXPECT_FALSE(fs::exists(to + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(to + "/model-00001-of-00002.safetensors"));
}

}  // namespace
}  // namespace zerostep
