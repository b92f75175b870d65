// Sampling the Hugging Face decoders with their KV cache (Note [Cached RoPE
// positions] in hf_decoder.h): cached steps against the full forward, for
// every family (Llama 3 with GQA and "llama3" RoPE scaling, Qwen2's
// biases, Qwen3's q/k norms), tied and untied.
//
// Tolerance-based, not bitwise: a cached step multiplies a [t, past + t]
// score matrix where the full forward multiplies [T, T], so float32 sums
// round differently. Logits here are O(10) (initializer_range 0.5 makes
// them sharp, so a wrong position changes them by O(1)); 2e-4 absolute is
// about 100 ulps at that size, orders below what a RoPE offset of one
// position changes: with the cached steps' RoPE planted at position 0
// instead of `past`, the largest difference was 13.3-17.0 for each family
// and every sample differed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "common/errors.h"
#include "models/hf_decoder.h"
#include "models/sampler.h"

namespace zerostep {
namespace {

constexpr double kLogitTolerance = 2e-4;
constexpr double kLogprobTolerance = 2e-4;

HfDecoderConfig small(HfArchitecture a, bool tied) {
  HfDecoderConfig c = hf_config_for(a);
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 40;
  c.tie_word_embeddings = tied;
  c.initializer_range = 0.5;
  c.llama3_rope = a == HfArchitecture::kLlama;
  c.rope_factor = 8.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_position_embeddings = 8;
  return c;
}

HfCausalLm random_model(const HfDecoderConfig& c) {
  HfDecoderOptions o;
  o.lora.rank = 2;
  o.lora.seed = 4;
  HfCausalLm m = make_hf_decoder(c, o);
  init_hf_decoder_weights(*m, 7);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters())  // non-zero adapters
    if (p.key().find("lora_B") != std::string::npos)
      p.value().copy_(torch::randn_like(p.value()) * 0.3);
  return m;
}

struct Family {
  HfArchitecture arch;
  bool tied;
};
const Family kFamilies[] = {{HfArchitecture::kLlama, false},
                            {HfArchitecture::kLlama, true},
                            {HfArchitecture::kQwen2, false},
                            {HfArchitecture::kQwen3, true}};

TEST(HfSampler, CachedStepsGiveTheFullForwardsLogits) {
  for (const Family& f : kFamilies) {
    HfCausalLm m = random_model(small(f.arch, f.tied));
    torch::NoGradGuard no_grad;
    torch::manual_seed(3);
    const torch::Tensor tokens = torch::randint(0, 64, {2, 30}, torch::kLong);
    const torch::Tensor full = m->forward(tokens);
    // A prefill of 7, then steps of 1, 3 and 1 token at a time.
    KvCache cache = m->new_cache(2, 30);
    std::vector<torch::Tensor> parts = {
        m->forward_cached(tokens.narrow(1, 0, 7), &cache)};
    int64_t at = 7;
    while (at < 30) {
      const int64_t t = (at % 4 == 0) ? std::min<int64_t>(3, 30 - at) : 1;
      parts.push_back(m->forward_cached(tokens.narrow(1, at, t), &cache));
      at += t;
    }
    EXPECT_EQ(cache.length, 30);
    const torch::Tensor cached = torch::cat(parts, 1);
    const double diff = (cached - full).abs().max().item<double>();
    EXPECT_LT(diff, kLogitTolerance)
        << "family " << static_cast<int>(f.arch) << " tied " << f.tied;
    EXPECT_GT(full.abs().max().item<double>(), 1.0);  // logits are not flat
  }
}

TEST(HfSampler, CachedAndRecomputedSamplesAgree) {
  for (const Family& f : kFamilies) {
    HfCausalLm m = random_model(small(f.arch, f.tied));
    SamplingOptions o;
    o.max_tokens = 30;
    o.seed = 11;
    o.prompt_logprobs = true;
    const std::vector<int64_t> prompt = {5, 9, 60, 2, 33, 17};
    const SampleOutput cached = sample(*m, prompt, 3, o);
    o.use_kv_cache = false;
    const SampleOutput recomputed = sample(*m, prompt, 3, o);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(cached.sequences[i].tokens, recomputed.sequences[i].tokens);
      for (size_t t = 0; t < cached.sequences[i].logprobs.size(); ++t)
        EXPECT_NEAR(cached.sequences[i].logprobs[t],
                    recomputed.sequences[i].logprobs[t], kLogprobTolerance);
      // The trainer's view (one forward of prompt + sample) of the sampled
      // tokens: what makes an RL loop's sampler/trainer KL about 0.
      std::vector<int64_t> seq = prompt;
      seq.insert(seq.end(), cached.sequences[i].tokens.begin(),
                 cached.sequences[i].tokens.end());
      torch::NoGradGuard no_grad;
      const torch::Tensor ids = torch::tensor(seq, torch::kLong).unsqueeze(0);
      const int64_t n = ids.size(1);
      const torch::Tensor lp =
          torch::log_softmax(m->forward(ids.narrow(1, 0, n - 1))[0], -1)
              .gather(1, ids[0].narrow(0, 1, n - 1).unsqueeze(1))
              .squeeze(1);
      const int64_t p = static_cast<int64_t>(prompt.size());
      for (size_t t = 0; t < cached.sequences[i].logprobs.size(); ++t)
        EXPECT_NEAR(cached.sequences[i].logprobs[t],
                    lp[p - 1 + static_cast<int64_t>(t)].item<float>(),
                    kLogprobTolerance);
    }
    EXPECT_EQ(cached.prompt_logprobs.size(), prompt.size());
  }
}

TEST(HfSampler, BadCachedStepsAreRefusedAndChangeNothing) {
  HfCausalLm m = random_model(small(HfArchitecture::kQwen3, false));
  EXPECT_THROW(m->new_cache(1, 41), UsageError);  // past the context
  EXPECT_THROW(m->new_cache(0, 8), UsageError);
  KvCache cache = m->new_cache(1, 4);
  torch::NoGradGuard no_grad;
  EXPECT_THROW(m->forward_cached(torch::zeros({1, 5}, torch::kLong), &cache),
               UsageError);
  EXPECT_THROW(m->forward_cached(torch::full({1, 1}, 64, torch::kLong), &cache),
               UsageError);
  EXPECT_THROW(m->forward_cached(torch::zeros({2, 1}, torch::kLong), &cache),
               UsageError);
  EXPECT_EQ(cache.length, 0);
}

}  // namespace
}  // namespace zerostep
