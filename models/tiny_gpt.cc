#include "models/tiny_gpt.h"

#include <cmath>
#include <string>

#include "common/errors.h"

namespace zerostep {

TinyGptBlockImpl::TinyGptBlockImpl(const TinyGptOptions& o, int64_t index)
    : n_head_(o.n_head) {
  ln1_ = register_module(
      "ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  qkv_ = register_module("qkv", torch::nn::Linear(o.d_model, 3 * o.d_model));
  proj_ = register_module("proj", torch::nn::Linear(o.d_model, o.d_model));
  ln2_ = register_module(
      "ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  fc_ = register_module("fc", torch::nn::Linear(o.d_model, 4 * o.d_model));
  fc_out_ =
      register_module("fc_out", torch::nn::Linear(4 * o.d_model, o.d_model));
  // Adapters after every base layer, from their own generators: the base
  // weights do not depend on whether adapters exist.
  const int64_t d = o.d_model;
  const uint64_t stream = static_cast<uint64_t>(index) * 8;
  if (o.lora.rank > 0 && o.lora.attn) {
    qkv_lora_ = register_module("qkv_lora", LoraAdapter(d, 3 * d, o.lora, stream));
    proj_lora_ = register_module("proj_lora", LoraAdapter(d, d, o.lora, stream + 1));
  }
  if (o.lora.rank > 0 && o.lora.mlp) {
    fc_lora_ = register_module("fc_lora", LoraAdapter(d, 4 * d, o.lora, stream + 2));
    fc_out_lora_ =
        register_module("fc_out_lora", LoraAdapter(4 * d, d, o.lora, stream + 3));
  }
}

torch::Tensor TinyGptBlockImpl::forward(torch::Tensor input) {
  return zero3_block(*this, input, [&](const torch::Tensor& in) {
    torch::Tensor x = in;
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const int64_t hd = c / n_head_;
    auto qkv = lora_linear(qkv_, qkv_lora_, ln1_->forward(x)).chunk(3, /*dim=*/-1);
    auto heads = [&](const torch::Tensor& y) {
      return y.view({b, t, n_head_, hd}).transpose(1, 2);
    };
    torch::Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    torch::Tensor att = torch::matmul(q, k.transpose(-2, -1)) /
                        std::sqrt(static_cast<double>(hd));
    torch::Tensor mask = torch::ones({t, t}, torch::kBool).tril().logical_not();
    att = att.masked_fill(mask, -1e9).softmax(-1);
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, c});
    return finish(x, y);
  });
}

torch::Tensor TinyGptBlockImpl::finish(const torch::Tensor& in,
                                       const torch::Tensor& y) {
  torch::Tensor x = in + lora_linear(proj_, proj_lora_, y);
  x = x +
      lora_linear(fc_out_, fc_out_lora_,
                  torch::gelu(lora_linear(fc_, fc_lora_, ln2_->forward(x))));
  return x;
}

torch::Tensor TinyGptBlockImpl::forward_cached(torch::Tensor input,
                                               torch::Tensor& k_cache,
                                               torch::Tensor& v_cache,
                                               int64_t past) {
  return zero3_block(*this, input, [&](const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    const int64_t hd = c / n_head_;
    auto qkv = lora_linear(qkv_, qkv_lora_, ln1_->forward(x)).chunk(3, -1);
    auto heads = [&](const torch::Tensor& y) {
      return y.view({b, t, n_head_, hd}).transpose(1, 2);
    };
    k_cache.narrow(2, past, t).copy_(heads(qkv[1]));
    v_cache.narrow(2, past, t).copy_(heads(qkv[2]));
    const torch::Tensor k = k_cache.narrow(2, 0, past + t);
    const torch::Tensor v = v_cache.narrow(2, 0, past + t);
    torch::Tensor att = torch::matmul(heads(qkv[0]), k.transpose(-2, -1)) /
                        std::sqrt(static_cast<double>(hd));
    // Query i sits at position past + i and sees keys 0 .. past + i.
    torch::Tensor mask =
        torch::ones({t, past + t}, torch::kBool).tril(past).logical_not();
    att = att.masked_fill(mask, -1e9).softmax(-1);
    torch::Tensor y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, c});
    return finish(x, y);
  });
}

TinyGptImpl::TinyGptImpl(const TinyGptOptions& o) : options_(o) {
  tok_ = register_module("tok", torch::nn::Embedding(o.vocab_size, o.d_model));
  pos_ = register_module("pos", torch::nn::Embedding(o.block_size, o.d_model));
  for (int64_t i = 0; i < o.n_layer; ++i)
    blocks_.push_back(
        register_module("block" + std::to_string(i), TinyGptBlock(o, i)));
  ln_f_ = register_module(
      "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model})));
  head_ = register_module("head", torch::nn::Linear(o.d_model, o.vocab_size));
  if (o.lora.rank > 0 && o.lora.unembed) {
    head_lora_ = register_module(
        "head_lora", LoraAdapter(o.d_model, o.vocab_size, o.lora,
                                 /*stream=*/static_cast<uint64_t>(o.n_layer) * 8));
  }
}

torch::Tensor TinyGptImpl::forward(torch::Tensor tokens) {
  const int64_t t = tokens.size(1);
  torch::Tensor positions = torch::arange(t, torch::kLong);
  torch::Tensor x = tok_->forward(tokens) + pos_->forward(positions);
  for (auto& block : blocks_) x = block->forward(x);
  return lora_linear(head_, head_lora_, ln_f_->forward(x));
}

KvCache TinyGptImpl::new_cache(int64_t batch, int64_t capacity) const {
  if (batch < 1)
    throw UsageError("KV cache batch = " + std::to_string(batch) +
                     " must be >= 1");
  if (capacity < 1 || capacity > options_.block_size)
    throw UsageError(
        "KV cache capacity = " + std::to_string(capacity) +
        " must be in [1, block_size = " + std::to_string(options_.block_size) +
        "] (the model has no positions beyond block_size)");
  KvCache cache;
  const int64_t hd = options_.d_model / options_.n_head;
  for (int64_t l = 0; l < options_.n_layer; ++l) {
    cache.keys.push_back(torch::zeros({batch, options_.n_head, capacity, hd}));
    cache.values.push_back(
        torch::zeros({batch, options_.n_head, capacity, hd}));
  }
  return cache;
}

torch::Tensor TinyGptImpl::forward_cached(torch::Tensor tokens,
                                          KvCache* cache) {
  ZS_CHECK(cache != nullptr);
  check_cached_step(tokens, *cache);
  const int64_t t = tokens.size(1), past = cache->length;
  torch::Tensor positions = torch::arange(past, past + t, torch::kLong);
  torch::Tensor x = tok_->forward(tokens) + pos_->forward(positions);
  for (size_t l = 0; l < blocks_.size(); ++l)
    x = blocks_[l]->forward_cached(x, cache->keys[l], cache->values[l], past);
  cache->length = past + t;
  return lora_linear(head_, head_lora_, ln_f_->forward(x));
}

}  // namespace zerostep
