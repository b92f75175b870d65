// The decoder families of Hugging Face folders: LlamaForCausalLM (Llama
// 3.x: GQA, RoPE with "llama3" scaling, SwiGLU, RMSNorm, tied or untied
// embeddings), Qwen2ForCausalLM (q/k/v biases) and Qwen3ForCausalLM
// (per-head q/k RMSNorm), as transformers 5.24 computes them, loaded from a
// folder (config.json, model.safetensors or a sharded index; F32, BF16 or
// F16) and written back to one.
//
// Note [Hugging Face names]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// The modules are registered with transformers' names and in its order
// (model.embed_tokens, model.layers.<i>.self_attn.{q,k,v,o}_proj,
// q_norm/k_norm, mlp.{gate,up,down}_proj, input_layernorm,
// post_attention_layernorm, model.norm, lm_head), so named_parameters()
// gives the checkpoint's tensor names: a folder loads without a mapping,
// Engine::export_full_model writes a file transformers loads, and a
// ParameterSource (engine/hf_checkpoint.h) serves a stage 3 load by the
// same names. A tied model (tie_word_embeddings) has no lm_head parameter:
// the head multiplies by model.embed_tokens.weight, as transformers' does,
// and a file's lm_head.weight, if any, is not read.
//
// LoRA adapters (HfLoraOptions) carry PEFT's names: a target projection
// P gets P.lora_A.weight [rank, in] and P.lora_B.weight [out, rank] and
// computes P(x) + lora_B(lora_A(x)) * alpha / rank, as peft's Linear does
// (lora_dropout 0, no rsLoRA, no DoRA). write_peft_adapter() writes them as
// peft's adapter_model.safetensors and adapter_config.json.
//
// Note [The head's LoRA]
// ~~~~~~~~~~~~~~~~~~~~~~
// "lm_head" among the target modules adapts the head as peft does with
// target_modules containing "lm_head": lm_head.lora_A.weight [rank,
// hidden] and lm_head.lora_B.weight [vocab, rank], logits = x W^T +
// (x A^T) B^T * alpha / rank. Untied, W is lm_head.weight. Tied, W is
// model.embed_tokens.weight and the model gets an "lm_head" module that
// holds only the two adapters (a tied model without them has no lm_head
// module), so their names are peft's: peft 0.21 wraps a tied model's
// lm_head Linear and leaves the input embedding alone (it warns that the
// tied layer is adapted; ensure_weight_tying, which would adapt
// embed_tokens too, is off), which is what this computes. The head is a
// Zero3Block either way (Note [Hugging Face decoders at stage 3]).
//
// Note [Hugging Face decoders at stage 3]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every decoder layer is a Zero3Block (blocks/zero3_block.h), and so are
// model.embed_tokens and lm_head of an untied model: a stage 3 engine
// gathers each around its use, so a rank holds its partitions plus the
// block in use. A tied model's embedding is used twice in one forward (at
// the input and at the head), so it is not a block: it stays whole on every
// rank (stage 3's persistent group), as do the final norm and any
// parameter under stage3_param_persistence_threshold. A tied model's
// lm_head module, which holds only the head's adapters (Note [The head's
// LoRA]), is a block: lora_B [vocab, rank] is partitioned like the
// layers' adapters, and the tied weight it multiplies by stays whole.
//
// Numbers: the forward is transformers' (RMSNorm in float32, cos/sin in
// float32 cast to the activations' dtype). Attention is its default sdpa
// path in float32 on the CPU under LibTorch 2 (fused, grouped-query heads;
// Note [Fused causal attention] in hf_decoder.cc) and its eager path
// (float32 softmax) otherwise: bf16, the KV cache's steps, CUDA and
// LibTorch 1.13. A model gives transformers' logits and gradients up to
// summation order (models/hf_parity_test.sh states the tolerances), in
// float32 or, after to(torch::kBFloat16), in bf16.
//
// Thread safety: as torch::nn::Module. make_hf_decoder and
// init_hf_decoder_weights use no global random state.
#ifndef ZEROSTEP_MODELS_HF_DECODER_H_
#define ZEROSTEP_MODELS_HF_DECODER_H_

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "blocks/zero3_block.h"
#include "engine/hf_checkpoint.h"
#include "models/causal_lm.h"
#include "models/hf_config.h"

namespace zerostep {

struct HfLoraOptions {
  int64_t rank = 0;    // 0: no adapters
  double alpha = 0.0;  // PEFT's lora_alpha; 0 = rank (scale 1)
  uint64_t seed = 0;   // the A matrices' initialisation (models/lora.h)
  // The projections adapted, by their module names (PEFT's
  // target_modules); each must be one of the seven or "lm_head" (the head:
  // Note [The head's LoRA]).
  std::vector<std::string> target_modules = {
      "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
      "down_proj"};
};

struct HfDecoderOptions {
  HfLoraOptions lora;
  // Where the parameters are allocated. torch::kMeta: nowhere (shapes
  // only, for a load that fills each rank's partitions from a
  // ParameterSource); the names and order are the same on every device.
  torch::Device device = torch::kCPU;
};

// A projection: weight [out, in], an optional bias, optional LoRA.
class HfLinearImpl : public torch::nn::Module {
 public:
  // `lora_stream` tells the adapters of one model apart (lora.rank > 0).
  HfLinearImpl(int64_t in, int64_t out, bool bias, const HfLoraOptions& lora,
               bool adapted, uint64_t lora_stream, torch::Device device);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_, bias_;
  torch::Tensor lora_a_, lora_b_;  // lora_A.weight, lora_B.weight
  double lora_scale_ = 0.0;
};
TORCH_MODULE(HfLinear);

class HfRmsNormImpl : public torch::nn::Module {
 public:
  HfRmsNormImpl(int64_t dim, double eps, torch::Device device);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;
  double eps_;
};
TORCH_MODULE(HfRmsNorm);

// model.embed_tokens: a Zero3Block when the model is untied (Note [Hugging
// Face decoders at stage 3]).
class HfEmbeddingImpl : public torch::nn::Module {
 public:
  HfEmbeddingImpl(int64_t vocab, int64_t dim, torch::Device device);
  torch::Tensor forward(const torch::Tensor& tokens);
  const torch::Tensor& weight() const { return weight_; }

 private:
  torch::Tensor weight_;
};

class HfAttentionImpl : public torch::nn::Module {
 public:
  HfAttentionImpl(const HfDecoderConfig& c, const HfDecoderOptions& o,
                  int64_t layer);
  // x [batch, t, hidden]; cos and sin [t, head_dim] in x's dtype.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin);
  // x [batch, t, hidden], the t positions after `past` cached ones (cos and
  // sin are theirs): writes their rotated keys and values into k_cache and
  // v_cache ([batch, kv_heads, capacity, head_dim]) at [past, past + t) and
  // attends over [0, past + t).
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, torch::Tensor& k_cache,
                               torch::Tensor& v_cache, int64_t past);
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }

 private:
  // q [b, heads, t, d], k and v [b, kv_heads, t, d], normed and rotated.
  std::vector<torch::Tensor> rotated_qkv(const torch::Tensor& x,
                                         const torch::Tensor& cos,
                                         const torch::Tensor& sin);
  // Causal attention of q (positions past ... past + t - 1) over k and v
  // (positions 0 ... past + t - 1), then o_proj.
  torch::Tensor attend(const torch::Tensor& q, torch::Tensor k,
                       torch::Tensor v, int64_t past);

  int64_t heads_, kv_heads_, head_dim_;
  HfLinear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr},
      o_proj_{nullptr};
  HfRmsNorm q_norm_{nullptr}, k_norm_{nullptr};
};
TORCH_MODULE(HfAttention);

class HfMlpImpl : public torch::nn::Module {
 public:
  HfMlpImpl(const HfDecoderConfig& c, const HfDecoderOptions& o,
            int64_t layer);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  HfLinear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(HfMlp);

// One decoder layer: a ZeRO stage 3 block.
class HfDecoderLayerImpl : public torch::nn::Module, public Zero3Block {
 public:
  HfDecoderLayerImpl(const HfDecoderConfig& c, const HfDecoderOptions& o,
                     int64_t layer);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin);
  // forward() of the t positions after `past` cached ones
  // (HfAttentionImpl::forward_cached).
  torch::Tensor forward_cached(const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin, torch::Tensor& k_cache,
                               torch::Tensor& v_cache, int64_t past);

 private:
  HfAttention self_attn_{nullptr};
  HfMlp mlp_{nullptr};
  HfRmsNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
};
TORCH_MODULE(HfDecoderLayer);

// "model": the embedding, the layers, the final norm.
class HfModelImpl : public torch::nn::Module {
 public:
  HfModelImpl(const HfDecoderConfig& c, const HfDecoderOptions& o);
  const std::shared_ptr<HfEmbeddingImpl>& embed_tokens() const {
    return embed_tokens_;
  }

 private:
  friend class HfCausalLmImpl;
  std::shared_ptr<HfEmbeddingImpl> embed_tokens_;
  torch::nn::ModuleList layers_;
  HfRmsNorm norm_{nullptr};
};
TORCH_MODULE(HfModel);

class HfCausalLmImpl : public torch::nn::Module, public CausalLm {
 public:
  HfCausalLmImpl(const HfDecoderConfig& config,
                 const HfDecoderOptions& options = {});
  // tokens [batch, t] int64, t <= max_position_embeddings, each below
  // vocab_size → logits [batch, t, vocab] in the parameters' dtype.
  // UsageError (naming the rule) for other shapes or token ids.
  torch::Tensor forward(const torch::Tensor& tokens);

  // CausalLm (models/causal_lm.h). Note [Cached RoPE positions]: a cached
  // step rotates its queries and keys by their absolute positions (past
  // ... past + t - 1), and the cache holds keys already rotated, as
  // transformers' DynamicCache does; each layer's cache is [batch,
  // num_key_value_heads, capacity, head_dim] (the groups are expanded at
  // attention time), in the parameters' dtype.
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t context_length() const override {
    return config_.max_position_embeddings;
  }
  torch::Tensor logits(const torch::Tensor& tokens) override {
    return forward(tokens);
  }
  KvCache new_cache(int64_t batch, int64_t capacity) const override;
  torch::Tensor forward_cached(torch::Tensor tokens, KvCache* cache) override;
  const HfDecoderConfig& config() const { return config_; }
  const HfDecoderOptions& options() const { return options_; }
  // RoPE's inverse frequencies, [head_dim / 2] float32 (transformers'
  // inv_freq, "llama3" scaling applied).
  const torch::Tensor& inv_freq() const { return inv_freq_; }

 private:
  // UsageError unless every id of tokens is in [0, vocab_size).
  void check_token_ids(const torch::Tensor& tokens) const;
  // RoPE's cos and sin of positions [start, start + t), [t, head_dim], in
  // `like`'s dtype and device.
  std::pair<torch::Tensor, torch::Tensor> rope(int64_t start, int64_t t,
                                               const torch::Tensor& like) const;
  // The final norm and the head.
  torch::Tensor head(const torch::Tensor& x);

  HfDecoderConfig config_;
  HfDecoderOptions options_;
  HfModel model_{nullptr};
  // Untied, or tied with the head adapted (Note [The head's LoRA]).
  std::shared_ptr<torch::nn::Module> lm_head_;
  torch::Tensor lm_head_weight_;  // lm_head.weight or the tied embedding
  torch::Tensor inv_freq_;
};
TORCH_MODULE(HfCausalLm);

// The decoder `config` describes, with uninitialised parameters on
// options.device (on torch::kMeta: no memory) and LoRA adapters from
// options.lora (A from its seed, B zero; on kMeta, uninitialised too).
// UsageError naming an unknown LoRA target module or a negative rank.
// A tied model's "lm_head" adapters add an lm_head module (Note [The
// head's LoRA]).
HfCausalLm make_hf_decoder(const HfDecoderConfig& config,
                           const HfDecoderOptions& options = {});

// transformers' random initialisation, from `seed`: linear and embedding
// weights from N(0, initializer_range), biases 0, norms 1. LoRA adapters are
// left as they are. For models built here without a checkpoint (tests,
// benchmarks). CPU parameters only.
void init_hf_decoder_weights(HfCausalLmImpl& model, uint64_t seed);

// Every parameter of `model` but its LoRA adapters, from `source` (by Note
// [Hugging Face names]), widened exactly to float32. Checks everything
// before it changes anything: UsageError listing every parameter the
// folder lacks, every shape that differs and every dtype that is not F32,
// BF16 or F16; IoError if a file cannot be read. CPU parameters only.
void load_hf_weights(HfCausalLmImpl& model, const HfCheckpointSource& source);

// The checks of load_hf_weights alone (names, shapes, dtypes), on a model
// on any device (e.g. a meta-device build): UsageError listing every
// mismatch.
void check_hf_weights(const HfCausalLmImpl& model,
                      const HfCheckpointSource& source);

// read_hf_config(dir), make_hf_decoder, load_hf_weights.
HfCausalLm load_hf_decoder(const std::string& dir,
                           const HfDecoderOptions& options = {});

// How save_hf_folder and the exports store values.
enum class HfDtype { kF32, kBF16 };

// Writes `model` as a Hugging Face folder transformers loads:
// <dir>/config.json (hf_config_json; "dtype" as stored) and
// <dir>/model.safetensors with every parameter but the LoRA adapters, by
// their names, in registration order (bf16: rounded to nearest even).
// Creates `dir`. IoError if it cannot write.
void save_hf_folder(const HfCausalLmImpl& model, const std::string& dir,
                    HfDtype dtype = HfDtype::kF32);

// PEFT's adapter folder from the LoRA tensors in the safetensors file
// `lora_file` (as Engine::export_full_model writes when only the adapters
// are trainable, or save_lora_tensors below): <dir>/adapter_model.safetensors
// with each name prefixed "base_model.model." (as peft saves it) and
// <dir>/adapter_config.json (peft_type LORA, r, lora_alpha, target_modules,
// task_type CAUSAL_LM, base_model_name_or_path = `base_model`). UsageError
// if the file holds a tensor that is not a LoRA adapter's; IoError if a
// file cannot be read or written.
void write_peft_adapter(const std::string& lora_file,
                        const HfLoraOptions& lora,
                        const std::string& base_model, const std::string& dir);

// The adapters of `model` (a model no engine partitions) as a safetensors
// file, F32, by their names: what write_peft_adapter reads.
void save_lora_tensors(const HfCausalLmImpl& model, const std::string& path);

// Copies every file of the folder `from` but its weights
// (model.safetensors, its index and shards) into `to`: config.json, the
// tokenizer's files, generation_config.json. With Engine::export_full_model
// writing <to>/model.safetensors, `to` is a folder transformers loads.
// Creates `to`. IoError if a file cannot be copied.
void copy_hf_folder_metadata(const std::string& from, const std::string& to);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_HF_DECODER_H_
