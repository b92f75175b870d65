// A tiny GPT-style decoder (token + position embeddings, pre-LayerNorm
// blocks of causal self-attention and a GELU MLP, tied-free LM head) for the
// harness's "gpt" model. Deterministic given torch's global seed at
// construction.
#ifndef ZEROSTEP_MODELS_TINY_GPT_H_
#define ZEROSTEP_MODELS_TINY_GPT_H_

#include <torch/torch.h>

#include <vector>

#include "blocks/zero3_block.h"
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

 private:
  int64_t n_head_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr},
      fc_out_{nullptr};
  LoraAdapter qkv_lora_{nullptr}, proj_lora_{nullptr}, fc_lora_{nullptr},
      fc_out_lora_{nullptr};
};
TORCH_MODULE(TinyGptBlock);

class TinyGptImpl : public torch::nn::Module {
 public:
  explicit TinyGptImpl(const TinyGptOptions& options);
  // tokens: [batch, seq] int64 → logits [batch, seq, vocab].
  torch::Tensor forward(torch::Tensor tokens);
  const TinyGptOptions& options() const { return options_; }

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
