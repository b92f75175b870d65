// HfDecoderConfig: a Hugging Face config.json of the decoder families
// zerostep implements (models/hf_decoder.h), read with transformers' rules
// (pinned 5.24.0): its defaults for absent keys, its legacy spellings
// ("rope_scaling" beside "rope_parameters", "type" beside "rope_type").
// Torch-free.
//
// Note [Refused model configs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A key the decoders do not implement is refused when ignoring it would
// change the numbers, never silently dropped: an architecture other than
// LlamaForCausalLM, Qwen2ForCausalLM or Qwen3ForCausalLM (MoE variants
// included), a hidden_act other than silu, a RoPE type other than
// "default" and "llama3" (linear, dynamic, yarn, longrope, ...), a
// partial_rotary_factor other than 1, RoPE parameters per layer type,
// sliding-window attention on any layer (use_sliding_window with
// max_window_layers below num_hidden_layers, or a "sliding_attention"
// layer type), attention_dropout other than 0 (transformers applies it in
// training), a quantization_config, and shapes transformers itself
// refuses (heads not dividing hidden_size for Llama, num_key_value_heads
// not dividing num_attention_heads, an odd head_dim). Keys that change
// nothing in transformers 5.24 for the architecture (Llama's
// pretraining_tp, Qwen2's attention_bias and mlp_bias, use_cache, token
// ids, ...) are accepted. Every problem of a config is reported at once, in
// one ConfigError naming config.json, each with the key, its value, what
// is supported and the fix.
//
// Thread safety: pure functions and plain values.
#ifndef ZEROSTEP_MODELS_HF_CONFIG_H_
#define ZEROSTEP_MODELS_HF_CONFIG_H_

#include <cstdint>
#include <string>

namespace zerostep {

enum class HfArchitecture { kLlama, kQwen2, kQwen3 };

// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM".
const char* hf_architecture_name(HfArchitecture a);

struct HfDecoderConfig {
  HfArchitecture architecture = HfArchitecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // GQA: a divisor of num_attention_heads
  int64_t head_dim = 0;             // even
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double initializer_range = 0.02;  // the std of a random initialisation
  bool tie_word_embeddings = false;  // lm_head reuses embed_tokens.weight
  // Biases: q/k/v projections, the output projection, the MLP.
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over each head of q and k

  // RoPE: theta, and the "llama3" frequency scaling when llama3_rope.
  double rope_theta = 10000.0;
  bool llama3_rope = false;
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 1.0;
  int64_t rope_original_max_position_embeddings = 0;

  // "dtype" (or the older "torch_dtype") as written, "" if absent:
  // informational (the weights' dtypes are the files').
  std::string dtype;
};

// A config of architecture `a` with the flags the architecture fixes set
// (Qwen2: q/k/v biases; Qwen3: q/k norms) and transformers' defaults for
// the rest; the shapes (vocab_size ... num_key_value_heads, head_dim,
// max_position_embeddings) are 0, for the caller to fill.
HfDecoderConfig hf_config_for(HfArchitecture a);

// Empty when `config` is one the architecture allows (the fixed flags as
// hf_config_for sets them, Llama's q/k/v and o biases equal, positive
// shapes, heads grouped by num_key_value_heads, an even head_dim), else
// what is wrong: make_hf_decoder refuses it with this text.
std::string hf_config_problem(const HfDecoderConfig& config);

// Parses a config.json's text. ConfigError listing every problem (Note
// [Refused model configs]), naming `source` (the file, for messages).
HfDecoderConfig parse_hf_config(const std::string& json_text,
                                const std::string& source);

// <dir>/config.json. IoError when it cannot be read; ConfigError as above.
HfDecoderConfig read_hf_config(const std::string& dir);

// A config.json that transformers 5.24 reads back as `config` (its current
// spelling: "rope_parameters"), for folders written here.
std::string hf_config_json(const HfDecoderConfig& config);

// The number of parameters of the model the config describes (without
// LoRA adapters).
int64_t hf_parameter_count(const HfDecoderConfig& config);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_HF_CONFIG_H_
