#include "models/hf_decoder.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
#include "engine/safetensors.h"
#include "models/lora.h"

namespace zerostep {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kProjections = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
    "down_proj"};

// Note [bf16 products on LibTorch 1.13's CPU]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch 2.x's bf16 matrix products (CPU and CUDA) accumulate in float32
// and round once; Debian's LibTorch 1.13 accumulates bf16 products on the
// CPU in bf16, which measured 7x the rounding error of one rounding on a
// 64x48x96 product, and 3-4x transformers' gradient error on the parity
// models (models/hf_parity_check.cc). There, and only there, a bf16
// product runs in float32 and rounds once: torch 2's numbers, at float32's
// speed. Autograd follows the casts, so gradients round once too.
//
// Projections call torch::linear (aten::linear, what Python's F.linear and
// so transformers call), which adds the bias before that one rounding.
// The C++ frontend's torch::nn::functional::linear does not: for an input
// of more than 2 dims it rounds the product to bf16 and then adds the bias
// in bf16, a second rounding (measured on LibTorch 2.11: 1374 of 4608
// outputs differ from one rounding; hf_decoder_test's
// Bf16ProjectionsRoundOnce fails that way).
constexpr bool kWidenCpuBf16Products = TORCH_VERSION_MAJOR < 2;

bool widen(const torch::Tensor& x) {
  return kWidenCpuBf16Products && x.scalar_type() == torch::kBFloat16 &&
         x.device().is_cpu();
}

torch::Tensor product(const torch::Tensor& a, const torch::Tensor& b) {
  if (!widen(a)) return torch::matmul(a, b);
  return torch::matmul(a.to(torch::kFloat), b.to(torch::kFloat))
      .to(torch::kBFloat16);
}

torch::Tensor project(const torch::Tensor& x, const torch::Tensor& w,
                          const torch::Tensor& bias = {}) {
  if (!widen(x)) return torch::linear(x, w, bias);
  return torch::linear(x.to(torch::kFloat), w.to(torch::kFloat),
                       bias.defined() ? bias.to(torch::kFloat) : bias)
      .to(torch::kBFloat16);
}

torch::TensorOptions on(torch::Device device) {
  return torch::TensorOptions().dtype(torch::kFloat32).device(device);
}

// The LoRA target module of the head (PEFT's name for it).
constexpr const char* kLmHead = "lm_head";

bool adapted(const HfLoraOptions& lora, const std::string& module) {
  return lora.rank > 0 &&
         std::find(lora.target_modules.begin(), lora.target_modules.end(),
                   module) != lora.target_modules.end();
}

// The LoRA stream of projection `p` of layer `layer` (distinct A's). The
// head's is the first after the last layer's: num_hidden_layers * 7.
uint64_t stream_of(int64_t layer, const std::string& p) {
  const auto at = std::find(kProjections.begin(), kProjections.end(), p);
  return static_cast<uint64_t>(layer) * kProjections.size() +
         static_cast<uint64_t>(at - kProjections.begin());
}

// PEFT's adapters of one projection [in -> out], registered under `owner`
// as lora_A.weight [rank, in] and lora_B.weight [out, rank]: A from the
// seed's stream `stream`, B zero (on kMeta: both uninitialised).
struct LoraPair {
  torch::Tensor a, b;
  double scale = 0.0;  // alpha / rank
};

LoraPair register_lora(torch::nn::Module& owner, int64_t in, int64_t out,
                       const HfLoraOptions& lora, uint64_t stream,
                       torch::Device device) {
  LoraPair pair;
  pair.scale =
      (lora.alpha > 0 ? lora.alpha : static_cast<double>(lora.rank)) /
      static_cast<double>(lora.rank);
  torch::Tensor a = device.is_meta()
                        ? torch::empty({lora.rank, in}, on(device))
                        : lora_initial_a(lora.rank, in, lora.seed, stream)
                              .to(device);
  auto lora_a = owner.register_module("lora_A", std::make_shared<torch::nn::Module>());
  auto lora_b = owner.register_module("lora_B", std::make_shared<torch::nn::Module>());
  pair.a = lora_a->register_parameter("weight", a);
  pair.b = lora_b->register_parameter(
      "weight", device.is_meta() ? torch::empty({out, lora.rank}, on(device))
                                 : torch::zeros({out, lora.rank}, on(device)));
  return pair;
}

// peft's Linear: base(x) + lora_B(lora_A(x)) * scale (no dropout); `y` is
// base(x). Without adapters, y.
torch::Tensor add_lora(const torch::Tensor& y, const torch::Tensor& x,
                       const torch::Tensor& a, const torch::Tensor& b,
                       double scale) {
  if (!a.defined()) return y;
  return y + project(project(x, a), b) * scale;
}

// transformers' rotate_half: [-x2, x1] for the two halves of the last dim.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// RoPE inverse frequencies as transformers computes them, in float32 and
// in the same order of operations.
torch::Tensor rope_inv_freq(const HfDecoderConfig& c) {
  const int64_t dim = c.head_dim;
  torch::Tensor exponent =
      torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) /
      static_cast<double>(dim);
  torch::Tensor inv_freq = torch::pow(c.rope_theta, exponent).reciprocal();
  if (!c.llama3_rope) return inv_freq;
  const double factor = c.rope_factor;
  const double low = c.rope_low_freq_factor, high = c.rope_high_freq_factor;
  const double old_context =
      static_cast<double>(c.rope_original_max_position_embeddings);
  const double low_freq_wavelen = old_context / low;
  const double high_freq_wavelen = old_context / high;
  torch::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  torch::Tensor scaled =
      torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  torch::Tensor smooth =
      (wavelen.reciprocal() * old_context - low) / (high - low);
  torch::Tensor smoothed =
      (1 - smooth) * scaled / factor + smooth * scaled;
  torch::Tensor medium = (wavelen < high_freq_wavelen).logical_not() *
                         (wavelen > low_freq_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

// model.embed_tokens of an untied model: its own stage 3 group.
class HfEmbeddingBlockImpl : public HfEmbeddingImpl, public Zero3Block {
 public:
  using HfEmbeddingImpl::HfEmbeddingImpl;
};

// lm_head: its own stage 3 group (Note [The head's LoRA]). Untied, it
// holds lm_head.weight; tied, it projects with model.embed_tokens.weight
// (`tied`, not its parameter) and holds only the adapters, so that they
// carry PEFT's names.
class HfLmHeadImpl : public torch::nn::Module, public Zero3Block {
 public:
  HfLmHeadImpl(const HfDecoderConfig& c, const HfDecoderOptions& o,
               const torch::Tensor& tied) {
    const int64_t vocab = c.vocab_size, dim = c.hidden_size;
    weight_ = tied.defined()
                  ? tied
                  : register_parameter("weight",
                                       torch::empty({vocab, dim}, on(o.device)));
    if (!adapted(o.lora, kLmHead)) return;
    lora_ = register_lora(*this, dim, vocab, o.lora,
                          stream_of(c.num_hidden_layers, kProjections[0]),
                          o.device);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return zero3_block(*this, x, [&](const torch::Tensor& in) {
      return add_lora(project(in, weight_), in, lora_.a, lora_.b, lora_.scale);
    });
  }
  const torch::Tensor& weight() const { return weight_; }

 private:
  torch::Tensor weight_;
  LoraPair lora_;
};

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw IoError("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IoError("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

void make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError("cannot create the folder '" + dir + "': " + ec.message());
}

SafetensorsTensor tensor_entry(const std::string& name, const torch::Tensor& p,
                               HfDtype dtype) {
  torch::Tensor v = p.detach().to(torch::kCPU, torch::kFloat).contiguous();
  SafetensorsTensor t;
  t.name = name;
  for (int64_t d : v.sizes()) t.shape.push_back(static_cast<uint64_t>(d));
  const float* data = v.data_ptr<float>();
  const size_t n = static_cast<size_t>(v.numel());
  if (dtype == HfDtype::kF32) {
    t.dtype = "F32";
    t.data.assign(reinterpret_cast<const char*>(data), n * 4);
  } else {
    t.dtype = "BF16";
    t.data.resize(n * 2);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t b = float_to_bf16(data[i]);
      std::memcpy(&t.data[2 * i], &b, 2);
    }
  }
  return t;
}

}  // namespace

HfLinearImpl::HfLinearImpl(int64_t in, int64_t out, bool bias,
                           const HfLoraOptions& lora, bool adapt,
                           uint64_t lora_stream, torch::Device device) {
  weight_ = register_parameter("weight", torch::empty({out, in}, on(device)));
  if (bias) bias_ = register_parameter("bias", torch::empty({out}, on(device)));
  if (!adapt) return;
  const LoraPair pair = register_lora(*this, in, out, lora, lora_stream, device);
  lora_a_ = pair.a;
  lora_b_ = pair.b;
  lora_scale_ = pair.scale;
}

torch::Tensor HfLinearImpl::forward(const torch::Tensor& x) {
  return add_lora(project(x, weight_, bias_), x, lora_a_, lora_b_, lora_scale_);
}

HfRmsNormImpl::HfRmsNormImpl(int64_t dim, double eps, torch::Device device)
    : eps_(eps) {
  weight_ = register_parameter(
      "weight", device.is_meta() ? torch::empty({dim}, on(device))
                                 : torch::ones({dim}, on(device)));
}

torch::Tensor HfRmsNormImpl::forward(const torch::Tensor& x) {
  // transformers' LlamaRMSNorm: in float32, then back to the input's dtype
  // before the weight.
  torch::Tensor h = x.to(torch::kFloat);
  torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight_ * h.to(x.scalar_type());
}

HfEmbeddingImpl::HfEmbeddingImpl(int64_t vocab, int64_t dim,
                                 torch::Device device) {
  weight_ = register_parameter("weight", torch::empty({vocab, dim}, on(device)));
}

torch::Tensor HfEmbeddingImpl::forward(const torch::Tensor& tokens) {
  // A block only when the model is untied (HfEmbeddingBlockImpl);
  // zero3_block runs the body directly otherwise.
  return zero3_block(*this, tokens, [&](const torch::Tensor& t) {
    return torch::nn::functional::embedding(t, weight_);
  });
}

HfAttentionImpl::HfAttentionImpl(const HfDecoderConfig& c,
                                 const HfDecoderOptions& o, int64_t layer)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim) {
  const int64_t h = c.hidden_size, q = heads_ * head_dim_,
                kv = kv_heads_ * head_dim_;
  auto proj = [&](const char* name, int64_t in, int64_t out, bool bias) {
    return register_module(
        name, HfLinear(in, out, bias, o.lora, adapted(o.lora, name),
                       stream_of(layer, name), o.device));
  };
  q_proj_ = proj("q_proj", h, q, c.qkv_bias);
  k_proj_ = proj("k_proj", h, kv, c.qkv_bias);
  v_proj_ = proj("v_proj", h, kv, c.qkv_bias);
  o_proj_ = proj("o_proj", q, h, c.o_bias);
  if (c.qk_norm) {
    q_norm_ = register_module("q_norm", HfRmsNorm(head_dim_, c.rms_norm_eps, o.device));
    k_norm_ = register_module("k_norm", HfRmsNorm(head_dim_, c.rms_norm_eps, o.device));
  }
}

std::vector<torch::Tensor> HfAttentionImpl::rotated_qkv(
    const torch::Tensor& x, const torch::Tensor& cos,
    const torch::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  torch::Tensor q = q_proj_(x).view({b, t, heads_, head_dim_});
  torch::Tensor k = k_proj_(x).view({b, t, kv_heads_, head_dim_});
  torch::Tensor v = v_proj_(x).view({b, t, kv_heads_, head_dim_});
  if (!q_norm_.is_empty()) {
    q = q_norm_(q);
    k = k_norm_(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  return {q, k, v};
}

namespace {

// transformers' eager attention: scores, causal mask, float32 softmax
// rounded to the activations' dtype, product; q [b, heads, t, head_dim],
// k and v [b, kv_heads, past + t, head_dim] (repeat_kv copies each of
// those per query head). Returns [b, heads, t, head_dim].
torch::Tensor eager_attention(const torch::Tensor& q, torch::Tensor k,
                              torch::Tensor v, int64_t past) {
  const int64_t b = q.size(0), heads = q.size(1), t = q.size(2),
                head_dim = q.size(3), kv_heads = k.size(1), total = k.size(2);
  if (kv_heads != heads) {  // transformers' repeat_kv
    const int64_t rep = heads / kv_heads;
    k = k.unsqueeze(2).expand({b, kv_heads, rep, total, head_dim})
            .reshape({b, heads, total, head_dim});
    v = v.unsqueeze(2).expand({b, kv_heads, rep, total, head_dim})
            .reshape({b, heads, total, head_dim});
  }
  torch::Tensor scores = product(q, k.transpose(2, 3)) *
                         std::pow(static_cast<double>(head_dim), -0.5);
  // Query i sits at position past + i and sees keys 0 ... past + i.
  torch::Tensor future =
      torch::ones({t, total}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
          .triu(past + 1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  torch::Tensor probs = scores.softmax(-1, torch::kFloat).to(q.scalar_type());
  return product(probs, v);
}

#if TORCH_VERSION_MAJOR >= 2
// Note [Fused causal attention]: the square causal case, [b, heads, t,
// head_dim] from the same shapes as eager_attention's with past = 0.
torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v) {
  return at::scaled_dot_product_attention(
      q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
      /*scale=*/std::nullopt, /*enable_gqa=*/k.size(1) != q.size(1));
}
#endif

}  // namespace

torch::Tensor HfAttentionImpl::attend(const torch::Tensor& q, torch::Tensor k,
                                      torch::Tensor v, int64_t past) {
  const int64_t b = q.size(0), t = q.size(2);
#if TORCH_VERSION_MAJOR >= 2
  // Note [Fused causal attention]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A float32 forward over the whole sequence on the CPU (training, and a
  // sample's prefill) takes LibTorch's fused attention, as transformers'
  // default "sdpa" attention does, grouped-query heads included (no copy of
  // the shared keys and values per query head). Its backward does not keep
  // the [t, t] probabilities per head; with it the 20M Llama's window went
  // from 0.97 to 1.03 of transformers' (docs/benchmarks.md, "Hugging Face
  // Llama against transformers", with the benchmark's own fix there).
  // Its results differ from the eager form's in the last bits (float32
  // sums taken in another order) and equal transformers' logits bit for
  // bit (hf_parity_test requires it on LibTorch 2: Note [Parity
  // tolerances]); the CPU kernel is deterministic, so unmanaged and managed
  // runs stay bitwise (harness_hf_test). bf16 keeps the eager form (the
  // parity yardstick is transformers' eager attention, bitwise on torch
  // 2.11), and so do the KV cache's steps (past > 0: the mask is not the
  // square causal one) and CUDA (its fused backward may be
  // nondeterministic).
  const bool fused = past == 0 && t == k.size(2) && q.device().is_cpu() &&
                     q.scalar_type() == torch::kFloat;
  torch::Tensor y = fused ? fused_attention(q, k, v)
                          : eager_attention(q, k, v, past);
#else
  torch::Tensor y = eager_attention(q, k, v, past);
#endif
  return o_proj_(y.transpose(1, 2).reshape({b, t, heads_ * head_dim_}));
}

torch::Tensor HfAttentionImpl::forward(const torch::Tensor& x,
                                       const torch::Tensor& cos,
                                       const torch::Tensor& sin) {
  const std::vector<torch::Tensor> qkv = rotated_qkv(x, cos, sin);
  return attend(qkv[0], qkv[1], qkv[2], /*past=*/0);
}

torch::Tensor HfAttentionImpl::forward_cached(
    const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
    torch::Tensor& k_cache, torch::Tensor& v_cache, int64_t past) {
  const int64_t t = x.size(1);
  const std::vector<torch::Tensor> qkv = rotated_qkv(x, cos, sin);
  k_cache.narrow(2, past, t).copy_(qkv[1]);
  v_cache.narrow(2, past, t).copy_(qkv[2]);
  return attend(qkv[0], k_cache.narrow(2, 0, past + t),
                v_cache.narrow(2, 0, past + t), past);
}

HfMlpImpl::HfMlpImpl(const HfDecoderConfig& c, const HfDecoderOptions& o,
                     int64_t layer) {
  const int64_t h = c.hidden_size, ff = c.intermediate_size;
  auto proj = [&](const char* name, int64_t in, int64_t out) {
    return register_module(
        name, HfLinear(in, out, c.mlp_bias, o.lora, adapted(o.lora, name),
                       stream_of(layer, name), o.device));
  };
  gate_proj_ = proj("gate_proj", h, ff);
  up_proj_ = proj("up_proj", h, ff);
  down_proj_ = proj("down_proj", ff, h);
}

torch::Tensor HfMlpImpl::forward(const torch::Tensor& x) {
  return down_proj_(torch::silu(gate_proj_(x)) * up_proj_(x));
}

HfDecoderLayerImpl::HfDecoderLayerImpl(const HfDecoderConfig& c,
                                       const HfDecoderOptions& o,
                                       int64_t layer) {
  self_attn_ = register_module("self_attn", HfAttention(c, o, layer));
  mlp_ = register_module("mlp", HfMlp(c, o, layer));
  input_layernorm_ = register_module(
      "input_layernorm", HfRmsNorm(c.hidden_size, c.rms_norm_eps, o.device));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm",
                      HfRmsNorm(c.hidden_size, c.rms_norm_eps, o.device));
}

torch::Tensor HfDecoderLayerImpl::forward(const torch::Tensor& x,
                                          const torch::Tensor& cos,
                                          const torch::Tensor& sin) {
  return zero3_block(*this, x, [&](const torch::Tensor& in) {
    torch::Tensor h = in + self_attn_(input_layernorm_(in), cos, sin);
    return h + mlp_(post_attention_layernorm_(h));
  });
}

torch::Tensor HfDecoderLayerImpl::forward_cached(
    const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
    torch::Tensor& k_cache, torch::Tensor& v_cache, int64_t past) {
  return zero3_block(*this, x, [&](const torch::Tensor& in) {
    torch::Tensor h = in + self_attn_->forward_cached(input_layernorm_(in), cos,
                                                      sin, k_cache, v_cache,
                                                      past);
    return h + mlp_(post_attention_layernorm_(h));
  });
}

HfModelImpl::HfModelImpl(const HfDecoderConfig& c, const HfDecoderOptions& o) {
  embed_tokens_ =
      c.tie_word_embeddings
          ? std::make_shared<HfEmbeddingImpl>(c.vocab_size, c.hidden_size, o.device)
          : std::make_shared<HfEmbeddingBlockImpl>(c.vocab_size, c.hidden_size,
                                                   o.device);
  register_module("embed_tokens", embed_tokens_);
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers_->push_back(HfDecoderLayer(c, o, i));
  norm_ = register_module("norm", HfRmsNorm(c.hidden_size, c.rms_norm_eps, o.device));
}

HfCausalLmImpl::HfCausalLmImpl(const HfDecoderConfig& config,
                               const HfDecoderOptions& options)
    : config_(config), options_(options) {
  if (const std::string why = hf_config_problem(config); !why.empty())
    throw UsageError("an HF decoder's config: " + why);
  if (options.lora.rank < 0)
    throw UsageError("LoRA rank = " + std::to_string(options.lora.rank) +
                     " must be >= 0 (0: no adapters)");
  for (const std::string& m : options.lora.target_modules)
    if (m != kLmHead && std::find(kProjections.begin(), kProjections.end(),
                                  m) == kProjections.end())
      throw UsageError("LoRA target module '" + m +
                       "' is not one of q_proj, k_proj, v_proj, o_proj, "
                       "gate_proj, up_proj, down_proj, lm_head (PEFT's names "
                       "of the decoder's projections). Fix: name those");
  model_ = register_module("model", HfModel(config, options));
  // Note [The head's LoRA]: a tied model gets an lm_head module only to
  // hold the head's adapters.
  const torch::Tensor tied = config.tie_word_embeddings
                                 ? model_->embed_tokens()->weight()
                                 : torch::Tensor();
  if (!config.tie_word_embeddings || adapted(options.lora, kLmHead)) {
    auto head = std::make_shared<HfLmHeadImpl>(config, options, tied);
    lm_head_weight_ = head->weight();
    lm_head_ = register_module(kLmHead, head);
  } else {
    lm_head_weight_ = tied;
  }
  inv_freq_ = rope_inv_freq(config);
}

void HfCausalLmImpl::check_token_ids(const torch::Tensor& tokens) const {
  if (tokens.is_meta() || tokens.numel() == 0) return;
  const int64_t low = tokens.min().item<int64_t>();
  const int64_t high = tokens.max().item<int64_t>();
  if (low < 0 || high >= config_.vocab_size)
    throw UsageError("token id " + std::to_string(low < 0 ? low : high) +
                     " is outside the vocabulary [0, " +
                     std::to_string(config_.vocab_size) + ")");
}

std::pair<torch::Tensor, torch::Tensor> HfCausalLmImpl::rope(
    int64_t start, int64_t t, const torch::Tensor& like) const {
  // transformers' rotary embedding: float32 angles, cos/sin cast to the
  // activations' dtype.
  torch::Tensor positions = torch::arange(
      start, start + t,
      torch::TensorOptions().dtype(torch::kFloat).device(like.device()));
  torch::Tensor freqs =
      positions.unsqueeze(1) * inv_freq_.to(like.device()).unsqueeze(0);
  torch::Tensor angles = torch::cat({freqs, freqs}, -1);
  return {angles.cos().to(like.scalar_type()),
          angles.sin().to(like.scalar_type())};
}

torch::Tensor HfCausalLmImpl::head(const torch::Tensor& hidden) {
  torch::Tensor x = model_->norm_(hidden);
  if (lm_head_) return static_cast<HfLmHeadImpl&>(*lm_head_).forward(x);
  return project(x, lm_head_weight_);
}

torch::Tensor HfCausalLmImpl::forward(const torch::Tensor& tokens) {
  if (tokens.dim() != 2 || tokens.scalar_type() != torch::kLong)
    throw UsageError("an HF decoder's tokens must be a [batch, t] int64 tensor");
  const int64_t t = tokens.size(1);
  if (t < 1 || t > config_.max_position_embeddings)
    throw UsageError("a sequence of " + std::to_string(t) +
                     " tokens: must be 1 to max_position_embeddings = " +
                     std::to_string(config_.max_position_embeddings));
  check_token_ids(tokens);
  torch::Tensor x = model_->embed_tokens_->forward(tokens);
  const auto [cos, sin] = rope(0, t, x);
  for (const auto& layer : *model_->layers_)
    x = layer->as<HfDecoderLayerImpl>()->forward(x, cos, sin);
  return head(x);
}

KvCache HfCausalLmImpl::new_cache(int64_t batch, int64_t capacity) const {
  if (batch < 1)
    throw UsageError("KV cache batch = " + std::to_string(batch) +
                     " must be >= 1");
  if (capacity < 1 || capacity > config_.max_position_embeddings)
    throw UsageError("KV cache capacity = " + std::to_string(capacity) +
                     " must be in [1, max_position_embeddings = " +
                     std::to_string(config_.max_position_embeddings) + "]");
  const torch::Tensor& w = model_->embed_tokens()->weight();
  const auto like = torch::TensorOptions().dtype(w.scalar_type()).device(w.device());
  KvCache cache;
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    cache.keys.push_back(torch::zeros(
        {batch, config_.num_key_value_heads, capacity, config_.head_dim}, like));
    cache.values.push_back(torch::zeros(
        {batch, config_.num_key_value_heads, capacity, config_.head_dim}, like));
  }
  return cache;
}

torch::Tensor HfCausalLmImpl::forward_cached(torch::Tensor tokens,
                                             KvCache* cache) {
  ZS_CHECK(cache != nullptr);
  check_cached_step(tokens, *cache);
  ZS_CHECK(static_cast<int64_t>(cache->keys.size()) ==
           config_.num_hidden_layers);
  check_token_ids(tokens);
  const int64_t t = tokens.size(1), past = cache->length;
  torch::Tensor x = model_->embed_tokens_->forward(tokens);
  const auto [cos, sin] = rope(past, t, x);  // Note [Cached RoPE positions]
  int64_t l = 0;
  for (const auto& layer : *model_->layers_) {
    x = layer->as<HfDecoderLayerImpl>()->forward_cached(
        x, cos, sin, cache->keys[l], cache->values[l], past);
    ++l;
  }
  cache->length = past + t;
  return head(x);
}

HfCausalLm make_hf_decoder(const HfDecoderConfig& config,
                           const HfDecoderOptions& options) {
  return HfCausalLm(config, options);
}

void init_hf_decoder_weights(HfCausalLmImpl& model, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std = model.config().initializer_range;
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    if (is_lora_parameter_name(name)) continue;
    if (!p.device().is_cpu())
      throw UsageError("init_hf_decoder_weights: parameter '" + name +
                       "' is on " + p.device().str() + ", not the CPU");
    const bool norm = name.size() >= 11 &&
                      name.compare(name.size() - 11, 11, "norm.weight") == 0;
    const bool bias = name.size() >= 5 &&
                      name.compare(name.size() - 5, 5, ".bias") == 0;
    if (norm)
      p.fill_(1.0);
    else if (bias)
      p.zero_();
    else
      p.normal_(0.0, std, gen);
  }
}

namespace {

// Names, shapes and dtypes of every non-LoRA parameter against the folder;
// with `cpu_float`, also that each parameter is CPU float32 (a load target).
void check_weights(const HfCausalLmImpl& model, const HfCheckpointSource& source,
                   bool cpu_float) {
  std::vector<std::string> problems;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    if (is_lora_parameter_name(name)) continue;
    if (cpu_float && (!p.device().is_cpu() || p.scalar_type() != torch::kFloat)) {
      problems.push_back("'" + name + "' is " + p.device().str() + " " +
                         std::string(c10::toString(p.scalar_type())) +
                         ", not a CPU float32 parameter");
      continue;
    }
    if (!source.contains(name)) {
      problems.push_back("'" + name + "' is missing");
      continue;
    }
    const HfTensorInfo& info = source.tensor(name);
    if (info.shape != p.sizes().vec()) {
      std::ostringstream os;
      os << "'" << name << "' has shape " << torch::IntArrayRef(info.shape)
         << " in the folder, " << p.sizes() << " in the model";
      problems.push_back(os.str());
      continue;
    }
    if (!hf_float_dtype(info.dtype))
      problems.push_back("'" + name + "' is " + info.dtype +
                         " (F32, BF16 or F16 load)");
  }
  if (problems.empty()) return;
  std::string msg = "the checkpoint in '" + source.dir() + "' does not fit " +
                    hf_architecture_name(model.config().architecture) +
                    " as its config.json describes it (" +
                    std::to_string(problems.size()) + " problem" +
                    (problems.size() == 1 ? "" : "s") + "):";
  for (size_t i = 0; i < problems.size() && i < 20; ++i)
    msg += "\n  - " + problems[i];
  if (problems.size() > 20)
    msg += "\n  ... and " + std::to_string(problems.size() - 20) + " more";
  throw UsageError(msg + "\nFix: load the folder the config.json came with");
}

}  // namespace

void check_hf_weights(const HfCausalLmImpl& model,
                      const HfCheckpointSource& source) {
  check_weights(model, source, /*cpu_float=*/false);
}

void load_hf_weights(HfCausalLmImpl& model, const HfCheckpointSource& source) {
  check_weights(model, source, /*cpu_float=*/true);
  // Read everything before changing anything.
  std::vector<torch::Tensor> targets, values;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    if (is_lora_parameter_name(item.key())) continue;
    torch::Tensor v = torch::empty(item.value().sizes(), torch::kFloat);
    source.read(item.key(), 0, v.numel(), v.data_ptr<float>());
    targets.push_back(item.value());
    values.push_back(v);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < targets.size(); ++i) targets[i].copy_(values[i]);
}

HfCausalLm load_hf_decoder(const std::string& dir,
                           const HfDecoderOptions& options) {
  const HfDecoderConfig config = read_hf_config(dir);
  const HfCheckpointSource source(dir);
  HfDecoderOptions cpu = options;
  cpu.device = torch::kCPU;
  HfCausalLm model = make_hf_decoder(config, cpu);
  load_hf_weights(*model, source);
  if (!options.device.is_cpu()) model->to(options.device);
  return model;
}

void save_hf_folder(const HfCausalLmImpl& model, const std::string& dir,
                    HfDtype dtype) {
  make_dir(dir);
  HfDecoderConfig config = model.config();
  config.dtype = dtype == HfDtype::kF32 ? "float32" : "bfloat16";
  SafetensorsFile file;
  file.metadata["format"] = "pt";
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (!is_lora_parameter_name(item.key()))
      file.tensors.push_back(tensor_entry(item.key(), item.value(), dtype));
  const std::string weights = (fs::path(dir) / kHfWeightsFile).string();
  write_file_atomically(weights, encode_safetensors(file, weights));
  write_file_atomically((fs::path(dir) / "config.json").string(),
                        hf_config_json(config));
}

void save_lora_tensors(const HfCausalLmImpl& model, const std::string& path) {
  SafetensorsFile file;
  file.metadata["format"] = "pt";
  for (const auto& item : model.named_parameters(/*recurse=*/true))
    if (is_lora_parameter_name(item.key()))
      file.tensors.push_back(tensor_entry(item.key(), item.value(), HfDtype::kF32));
  write_file_atomically(path, encode_safetensors(file, path));
}

void write_peft_adapter(const std::string& lora_file, const HfLoraOptions& lora,
                        const std::string& base_model, const std::string& dir) {
  SafetensorsFile file = read_safetensors_file(lora_file);
  std::vector<std::string> others;
  for (SafetensorsTensor& t : file.tensors) {
    const auto ends = [&](const std::string& suffix) {
      return t.name.size() > suffix.size() &&
             t.name.compare(t.name.size() - suffix.size(), suffix.size(),
                            suffix) == 0;
    };
    if (!ends(".lora_A.weight") && !ends(".lora_B.weight")) {
      others.push_back(t.name);
      continue;
    }
    t.name = "base_model.model." + t.name;
  }
  if (!others.empty()) {
    std::string list;
    for (size_t i = 0; i < others.size() && i < 5; ++i)
      list += (i ? ", '" : "'") + others[i] + "'";
    throw UsageError("'" + lora_file + "' holds " + std::to_string(others.size()) +
                     " tensors that are not PEFT-named LoRA adapters (" + list +
                     (others.size() > 5 ? ", ..." : "") +
                     "). Fix: export with only the adapters trainable "
                     "(freeze_all_but_lora) or use save_lora_tensors");
  }
  if (file.tensors.empty())
    throw UsageError("'" + lora_file + "' holds no LoRA adapter tensors");
  nlohmann::ordered_json config;
  config["peft_type"] = "LORA";
  config["task_type"] = "CAUSAL_LM";
  config["base_model_name_or_path"] = base_model;
  config["r"] = lora.rank;
  config["lora_alpha"] = lora.alpha > 0 ? lora.alpha : static_cast<double>(lora.rank);
  config["lora_dropout"] = 0.0;
  config["target_modules"] = lora.target_modules;
  config["bias"] = "none";
  config["fan_in_fan_out"] = false;
  config["use_rslora"] = false;
  config["use_dora"] = false;
  config["inference_mode"] = true;
  config["init_lora_weights"] = true;
  config["modules_to_save"] = nullptr;
  make_dir(dir);
  const std::string weights = (fs::path(dir) / "adapter_model.safetensors").string();
  file.metadata["format"] = "pt";
  write_file_atomically(weights, encode_safetensors(file, weights));
  write_file_atomically((fs::path(dir) / "adapter_config.json").string(),
                        config.dump(2) + "\n");
}

void copy_hf_folder_metadata(const std::string& from, const std::string& to) {
  make_dir(to);
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(from, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    auto ends = [&](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends(".safetensors") || ends(".index.json") || ends(".bin") ||
        ends(".pt") || ends(".pth"))
      continue;  // weights: the export writes its own
    fs::copy_file(e.path(), fs::path(to) / name,
                  fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw IoError("cannot copy '" + e.path().string() + "' to '" + to +
                    "': " + ec.message());
  }
  if (ec) throw IoError("cannot list the folder '" + from + "': " + ec.message());
}

}  // namespace zerostep
