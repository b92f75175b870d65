// parse_hf_config: transformers' defaults and spellings, and every refusal
// of Note [Refused model configs] named with its key, all at once.
#include "models/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace zerostep {
namespace {

using nlohmann::json;

json llama() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 128},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4}};
}

// The problems' keys of the ConfigError parsing `j` raises ({} if none).
std::vector<std::string> problem_keys(const json& j) {
  try {
    parse_hf_config(j.dump(), "dir/config.json");
  } catch (const ConfigError& e) {
    std::vector<std::string> keys;
    for (const ConfigProblem& p : e.problems()) keys.push_back(p.key);
    return keys;
  }
  return {};
}

std::string message(const json& j) {
  try {
    parse_hf_config(j.dump(), "dir/config.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(HfConfigTest, LlamaDefaultsAreTransformers) {
  const HfDecoderConfig c = parse_hf_config(llama().dump(), "c");
  EXPECT_EQ(c.architecture, HfArchitecture::kLlama);
  EXPECT_EQ(c.num_key_value_heads, 4);  // = heads
  EXPECT_EQ(c.head_dim, 16);            // hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.llama3_rope);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias || c.qk_norm);
}

TEST(HfConfigTest, Llama3RopeInBothSpellings) {
  // transformers 5's rope_parameters.
  json j = llama();
  j["rope_parameters"] = {{"rope_type", "llama3"},       {"rope_theta", 500000.0},
                          {"factor", 32.0},              {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  HfDecoderConfig c = parse_hf_config(j.dump(), "c");
  EXPECT_TRUE(c.llama3_rope);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope_factor, 32.0);
  EXPECT_EQ(c.rope_original_max_position_embeddings, 8192);
  // Published Llama 3.x files: rope_theta at the top, "rope_scaling" (taken
  // over rope_parameters), original_max_position_embeddings defaulting to
  // max_position_embeddings.
  j = llama();
  j["rope_theta"] = 500000.0;
  j["max_position_embeddings"] = 4096;
  j["rope_parameters"] = {{"rope_type", "default"}};
  j["rope_scaling"] = {{"type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}};
  c = parse_hf_config(j.dump(), "c");
  EXPECT_TRUE(c.llama3_rope);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_original_max_position_embeddings, 4096);
}

TEST(HfConfigTest, QwenBiasesNormsAndHeadDims) {
  json q2 = llama();
  q2["architectures"] = {"Qwen2ForCausalLM"};
  q2["model_type"] = "qwen2";
  q2["attention_bias"] = false;  // Qwen2 has q/k/v biases regardless
  // Absent, num_key_value_heads is Qwen2Config's default 32, which 4 heads
  // cannot be grouped into.
  EXPECT_EQ(problem_keys(q2),
            (std::vector<std::string>{"num_key_value_heads"}));
  q2["num_key_value_heads"] = 2;
  HfDecoderConfig c = parse_hf_config(q2.dump(), "c");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.head_dim, 16);

  json q3 = llama();
  q3["architectures"] = {"Qwen3ForCausalLM"};
  q3["model_type"] = "qwen3";
  q3["num_key_value_heads"] = 2;
  q3["attention_bias"] = true;
  c = parse_hf_config(q3.dump(), "c");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.qkv_bias && c.o_bias);
  EXPECT_EQ(c.head_dim, 128);  // Qwen3's class default, not hidden/heads
}

TEST(HfConfigTest, RefusesWhatWouldChangeTheNumbersNamingEachKey) {
  json j = llama();
  j["hidden_act"] = "gelu";
  j["attention_dropout"] = 0.1;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  j["partial_rotary_factor"] = 0.5;
  j["quantization_config"] = {{"quant_method", "bitsandbytes"}};
  j["num_key_value_heads"] = 3;
  const std::vector<std::string> keys = problem_keys(j);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "num_key_value_heads", "hidden_act", "attention_dropout",
                      "quantization_config", "rope_scaling.rope_type",
                      "partial_rotary_factor"}));
  const std::string m = message(j);
  EXPECT_NE(m.find("invalid model config 'dir/config.json': 6 problems"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("\"yarn\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"default\" and \"llama3\""), std::string::npos) << m;
}

TEST(HfConfigTest, RefusesOtherArchitecturesAndBrokenShapes) {
  json j = llama();
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  EXPECT_EQ(problem_keys(j), (std::vector<std::string>{"architectures"}));
  EXPECT_NE(message(j).find("LlamaForCausalLM, Qwen2ForCausalLM or "
                            "Qwen3ForCausalLM"),
            std::string::npos);
  j = llama();
  j.erase("architectures");
  j.erase("vocab_size");
  j["hidden_size"] = -1;
  j["model_type"] = "mistral";
  EXPECT_EQ(problem_keys(j),
            (std::vector<std::string>{"architectures", "model_type",
                                      "vocab_size", "hidden_size"}));
  j = llama();
  j["num_attention_heads"] = 5;  // 64 % 5 != 0
  j["head_dim"] = 7;
  EXPECT_EQ(problem_keys(j),
            (std::vector<std::string>{"num_attention_heads", "head_dim"}));
  EXPECT_THROW(parse_hf_config("{", "c"), ConfigError);
  EXPECT_THROW(parse_hf_config("[1]", "c"), ConfigError);
}

TEST(HfConfigTest, SlidingWindowsAreRefusedOnlyWhereALayerWouldUseThem) {
  json j = llama();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  j["num_key_value_heads"] = 2;
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 2;  // every layer below it: full attention
  EXPECT_TRUE(problem_keys(j).empty());
  j["max_window_layers"] = 1;  // layer 1 would slide
  EXPECT_EQ(problem_keys(j), (std::vector<std::string>{"use_sliding_window"}));
  j["sliding_window"] = nullptr;  // no window after all
  EXPECT_TRUE(problem_keys(j).empty());
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_EQ(problem_keys(j), (std::vector<std::string>{"layer_types"}));
}

TEST(HfConfigTest, ItsOwnJsonReadsBack) {
  json j = llama();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["num_key_value_heads"] = 2;
  j["head_dim"] = 8;
  j["tie_word_embeddings"] = true;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 64}};
  const HfDecoderConfig c = parse_hf_config(j.dump(), "c");
  const HfDecoderConfig back = parse_hf_config(hf_config_json(c), "c");
  EXPECT_EQ(back.architecture, c.architecture);
  EXPECT_EQ(back.head_dim, 8);
  EXPECT_EQ(back.num_key_value_heads, 2);
  EXPECT_TRUE(back.tie_word_embeddings);
  EXPECT_TRUE(back.llama3_rope);
  EXPECT_EQ(back.rope_original_max_position_embeddings, 64);
  EXPECT_EQ(hf_parameter_count(back), hf_parameter_count(c));
  // 128*64 embedding (tied) + 2 layers + norm.
  const int64_t layer = 64 * 32 + 2 * 64 * 16 + 32 * 64 + 3 * 64 * 96 +
                        2 * 64 + 2 * 8;
  EXPECT_EQ(hf_parameter_count(c), 128 * 64 + 2 * layer + 64);
}

}  // namespace
}  // namespace zerostep
