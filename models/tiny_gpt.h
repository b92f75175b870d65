// A tiny GPT-style decoder (token + position embeddings, pre-LayerNorm
// blocks of causal self-attention and a GELU MLP, tied-free LM head) for the
// harness's "gpt" model. Deterministic given torch's global seed at
// construction.
//
// Incremental decoding: forward_cached() runs new tokens against a KvCache
// of the earlier positions' keys and values, so generating N tokens costs N
// one-token steps instead of N recomputations of the whole prefix
// (models/sampler.h uses it). Its logits equal forward()'s for the same
// tokens up to float rounding, not bit for bit: a step multiplies a 1-token
// query against the cached keys, a matmul of another shape (and so another
// summation order) than the full [T, T] attention (tiny_gpt_test states the
// tolerance). LoRA adapters apply on both paths.
#ifndef ZEROSTEP_MODELS_TINY_GPT_H_
#define ZEROSTEP_MODELS_TINY_GPT_H_

#include <torch/torch.h>

#include <vector>

#include "blocks/zero3_block.h"
#include "models/causal_lm.h"
#include "models/lora.h"

namespace zerostep {

struct TinyGptOptions {
  int64_t vocab_size = 64;
  int64_t block_size = 16;  // maximum sequence length
  int64_t d_model = 32;
  int64_t n_head = 2;
  int64_t n_layer = 2;
  // LoRA adapters on the linear layers (lora.rank = 0: none). The base
  // weights are the same with and without adapters for a given torch seed;
  // freezing them is the caller's choice (freeze_all_but_lora).
  LoraOptions lora;
};

// One transformer block: a ZeRO stage 3 block (blocks/zero3_block.h).
class TinyGptBlockImpl : public torch::nn::Module, public Zero3Block {
 public:
  // `index` tells the block's LoRA adapters apart.
  TinyGptBlockImpl(const TinyGptOptions& o, int64_t index = 0);
  torch::Tensor forward(torch::Tensor x);
  // x: [batch, t, d_model], the next t positions after `past` cached ones.
  // Writes their keys and values into k_cache/v_cache ([batch, n_head,
  // capacity, head_dim]) at [past, past + t) and attends over [0, past + t).
  torch::Tensor forward_cached(torch::Tensor x, torch::Tensor& k_cache,
                               torch::Tensor& v_cache, int64_t past);

 private:
  // The attention projection's residual and the MLP, shared by both paths.
  torch::Tensor finish(const torch::Tensor& x, const torch::Tensor& y);

  int64_t n_head_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr},
      fc_out_{nullptr};
  LoraAdapter qkv_lora_{nullptr}, proj_lora_{nullptr}, fc_lora_{nullptr},
      fc_out_lora_{nullptr};
};
TORCH_MODULE(TinyGptBlock);

class TinyGptImpl : public torch::nn::Module, public CausalLm {
 public:
  explicit TinyGptImpl(const TinyGptOptions& options);
  // tokens: [batch, seq] int64 → logits [batch, seq, vocab].
  torch::Tensor forward(torch::Tensor tokens);
  const TinyGptOptions& options() const { return options_; }

  // An empty cache for `batch` sequences of up to `capacity` tokens.
  // UsageError unless 1 <= batch and 1 <= capacity <= block_size.
  KvCache new_cache(int64_t batch, int64_t capacity) const override;
  // tokens: [cache->batch(), t] int64, the positions after the cached ones
  // → logits [batch, t, vocab] for them; appends their keys and values to
  // *cache. UsageError (nothing changed) if the cache would exceed its
  // capacity, the batch differs, or t < 1. Call it under torch::NoGradGuard
  // for generation (the cache is written in place).
  torch::Tensor forward_cached(torch::Tensor tokens, KvCache* cache) override;

  // CausalLm (models/causal_lm.h).
  int64_t vocab_size() const override { return options_.vocab_size; }
  int64_t context_length() const override { return options_.block_size; }
  torch::Tensor logits(const torch::Tensor& tokens) override {
    return forward(tokens);
  }

 private:
  TinyGptOptions options_;
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  std::vector<TinyGptBlock> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
  LoraAdapter head_lora_{nullptr};
};
TORCH_MODULE(TinyGpt);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_TINY_GPT_H_
