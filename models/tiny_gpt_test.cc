#include "models/tiny_gpt.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/errors.h"

namespace zerostep {
namespace {

// Parity of forward_cached with forward() is tolerance-based, not bitwise:
// a cached step multiplies a [1, head_dim] query by the cached keys, a
// matmul of another shape (another summation order) than forward()'s full
// [T, T] attention. Logits here are O(1); float32 rounding differences are
// ~1e-7, so 1e-5 is tight yet safe.
constexpr double kLogitTolerance = 1e-5;

TinyGptOptions options_with_lora() {
  TinyGptOptions o;
  o.vocab_size = 50;
  o.block_size = 24;
  o.d_model = 16;
  o.n_head = 2;
  o.n_layer = 2;
  o.lora.rank = 4;
  o.lora.seed = 7;
  return o;
}

// A model whose adapters are non-zero (a fresh adapter's B is zero, which
// would hide a path that forgets them).
TinyGpt trained_like_model(uint64_t seed, bool zero_adapters = false) {
  torch::manual_seed(seed);
  TinyGpt m(options_with_lora());
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters())
    if (p.key().find("lora_b") != std::string::npos)
      p.value().copy_(zero_adapters ? torch::zeros_like(p.value())
                                    : torch::randn_like(p.value()) * 0.5);
  return m;
}

// Prefill `prefill` tokens, then one token at a time.
torch::Tensor cached_logits(TinyGpt& m, const torch::Tensor& tokens,
                            int64_t prefill) {
  torch::NoGradGuard no_grad;
  KvCache cache = m->new_cache(tokens.size(0), tokens.size(1));
  std::vector<torch::Tensor> parts = {
      m->forward_cached(tokens.narrow(1, 0, prefill), &cache)};
  for (int64_t t = prefill; t < tokens.size(1); ++t)
    parts.push_back(m->forward_cached(tokens.narrow(1, t, 1), &cache));
  EXPECT_EQ(cache.length, tokens.size(1));
  return torch::cat(parts, 1);
}

TEST(TinyGptCache, CachedLogitsEqualFullRecomputeWithinTolerance) {
  TinyGpt m = trained_like_model(3);
  torch::manual_seed(11);
  torch::Tensor tokens = torch::randint(0, 50, {3, 20}, torch::kLong);
  torch::Tensor full;
  {
    torch::NoGradGuard no_grad;
    full = m->forward(tokens);
  }
  for (int64_t prefill : {1, 7, 20}) {
    torch::Tensor cached = cached_logits(m, tokens, prefill);
    ASSERT_EQ(cached.sizes(), full.sizes());
    const double diff = (cached - full).abs().max().item<double>();
    EXPECT_LT(diff, kLogitTolerance) << "prefill " << prefill;
  }
}

TEST(TinyGptCache, AdaptersApplyOnTheCachedPath) {
  TinyGpt with = trained_like_model(3);
  TinyGpt without = trained_like_model(3, /*zero_adapters=*/true);
  torch::manual_seed(11);
  torch::Tensor tokens = torch::randint(0, 50, {2, 12}, torch::kLong);
  const double diff =
      (cached_logits(with, tokens, 4) - cached_logits(without, tokens, 4))
          .abs()
          .max()
          .item<double>();
  EXPECT_GT(diff, 1e-2);  // the adapters change the logits materially
}

TEST(TinyGptCache, RepeatRowsGivesEachSampleThePromptsCache) {
  TinyGpt m = trained_like_model(5);
  torch::NoGradGuard no_grad;
  torch::Tensor prompt = torch::randint(0, 50, {1, 6}, torch::kLong);
  KvCache one = m->new_cache(1, 8);
  m->forward_cached(prompt, &one);
  one.repeat_rows(3);
  EXPECT_EQ(one.batch(), 3);
  torch::Tensor next = torch::tensor({1, 2, 3}, torch::kLong).unsqueeze(1);
  torch::Tensor cached = m->forward_cached(next, &one).select(1, 0);
  torch::Tensor full =
      m->forward(torch::cat({prompt.expand({3, 6}), next}, 1)).select(1, 6);
  EXPECT_LT((cached - full).abs().max().item<double>(), kLogitTolerance);
}

TEST(TinyGptCache, BadUseIsAUsageErrorAndChangesNothing) {
  TinyGpt m = trained_like_model(5);
  torch::NoGradGuard no_grad;
  EXPECT_THROW(m->new_cache(1, 25), UsageError);  // beyond block_size 24
  EXPECT_THROW(m->new_cache(0, 4), UsageError);
  KvCache cache = m->new_cache(2, 4);
  EXPECT_THROW(m->forward_cached(torch::zeros({2, 5}, torch::kLong), &cache),
               UsageError);
  EXPECT_EQ(cache.length, 0);
  EXPECT_THROW(m->forward_cached(torch::zeros({3, 1}, torch::kLong), &cache),
               UsageError);
  m->forward_cached(torch::zeros({2, 4}, torch::kLong), &cache);
  EXPECT_THROW(m->forward_cached(torch::zeros({2, 1}, torch::kLong), &cache),
               UsageError);
  EXPECT_EQ(cache.length, 4);
}

}  // namespace
}  // namespace zerostep
