#include "models/sampler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace {

// Logprob parity with forward() is tolerance-based (see tiny_gpt_test): the
// cached path's matmuls have other shapes, so float32 sums round
// differently. Logprobs here are O(5); 1e-5 absolute is a few ulps' worth
// of accumulated rounding.
constexpr double kLogprobTolerance = 1e-5;

TinyGpt make_model() {
  TinyGptOptions o;
  o.vocab_size = 40;
  o.block_size = 32;
  o.d_model = 16;
  o.n_head = 2;
  o.n_layer = 2;
  o.lora.rank = 2;
  torch::manual_seed(21);
  TinyGpt m(o);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters())  // non-zero adapters, sharper logits
    if (p.key().find("lora_b") != std::string::npos)
      p.value().copy_(torch::randn_like(p.value()));
  m->named_parameters()["head.weight"].mul_(4.0);
  return m;
}

const std::vector<int64_t> kPrompt = {3, 14, 15, 9, 2, 6};

// forward()'s logprob of each token of `seq` given the ones before it.
std::vector<float> forward_logprobs(TinyGpt& m,
                                    const std::vector<int64_t>& seq) {
  torch::NoGradGuard no_grad;
  torch::Tensor ids = torch::tensor(seq, torch::kLong).unsqueeze(0);
  const int64_t n = ids.size(1);
  torch::Tensor lp =
      torch::log_softmax(m->forward(ids.narrow(1, 0, n - 1))[0], -1)
          .gather(1, ids[0].narrow(0, 1, n - 1).unsqueeze(1))
          .squeeze(1)
          .contiguous();
  return std::vector<float>(lp.data_ptr<float>(),
                            lp.data_ptr<float>() + (n - 1));
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  TinyGpt m = make_model();
  SamplingOptions o;
  o.max_tokens = 20;
  o.seed = 5;
  SampleOutput a = sample(m, kPrompt, 4, o), b = sample(m, kPrompt, 4, o);
  o.seed = 6;
  SampleOutput c = sample(m, kPrompt, 4, o);
  ASSERT_EQ(a.sequences.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a.sequences[i].tokens, b.sequences[i].tokens);
    EXPECT_EQ(a.sequences[i].logprobs, b.sequences[i].logprobs);
    EXPECT_EQ(a.sequences[i].tokens.size(), 20u);
    EXPECT_FALSE(a.sequences[i].stopped);
  }
  EXPECT_NE(a.sequences[0].tokens, c.sequences[0].tokens);
  EXPECT_NE(a.sequences[0].tokens, a.sequences[1].tokens);  // own streams
}

TEST(Sampler, ASampleDoesNotDependOnTheBatchItIsIn) {
  TinyGpt m = make_model();
  SamplingOptions o;
  o.max_tokens = 12;
  o.seed = 77;
  SampleOutput two = sample(m, kPrompt, 2, o), five = sample(m, kPrompt, 5, o);
  EXPECT_EQ(two.sequences[0].tokens, five.sequences[0].tokens);
  EXPECT_EQ(two.sequences[1].tokens, five.sequences[1].tokens);
}

TEST(Sampler, LogprobsEqualForwardLogprobsWithinTolerance) {
  TinyGpt m = make_model();
  SamplingOptions o;
  o.max_tokens = 16;
  o.seed = 9;
  o.temperature = 0.7;  // logprobs stay the model's (Note [Sampled logprobs])
  o.prompt_logprobs = true;
  SampleOutput out = sample(m, kPrompt, 3, o);
  for (const SampledSequence& s : out.sequences) {
    std::vector<int64_t> seq = kPrompt;
    seq.insert(seq.end(), s.tokens.begin(), s.tokens.end());
    const std::vector<float> ref = forward_logprobs(m, seq);
    ASSERT_EQ(s.logprobs.size(), s.tokens.size());
    for (size_t i = 0; i < s.tokens.size(); ++i)
      EXPECT_NEAR(s.logprobs[i], ref[kPrompt.size() - 1 + i], kLogprobTolerance)
          << "token " << i;
  }
  const std::vector<float> ref = forward_logprobs(m, kPrompt);
  ASSERT_EQ(out.prompt_logprobs.size(), kPrompt.size());
  EXPECT_TRUE(std::isnan(out.prompt_logprobs[0]));
  for (size_t i = 1; i < kPrompt.size(); ++i)
    EXPECT_NEAR(out.prompt_logprobs[i], ref[i - 1], kLogprobTolerance);
}

TEST(Sampler, KvCacheAndRecomputeGiveTheSameSamples) {
  TinyGpt m = make_model();
  SamplingOptions o;
  o.max_tokens = 24;
  o.seed = 3;
  o.top_k = 10;
  o.top_p = 0.9;
  SampleOutput cached = sample(m, kPrompt, 4, o);
  o.use_kv_cache = false;
  SampleOutput recomputed = sample(m, kPrompt, 4, o);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(cached.sequences[i].tokens, recomputed.sequences[i].tokens);
    for (size_t t = 0; t < cached.sequences[i].logprobs.size(); ++t)
      EXPECT_NEAR(cached.sequences[i].logprobs[t],
                  recomputed.sequences[i].logprobs[t], kLogprobTolerance);
  }
}

TEST(Sampler, TemperatureZeroIsGreedy) {
  TinyGpt m = make_model();
  SamplingOptions o;
  o.max_tokens = 10;
  o.temperature = 0.0;
  SampleOutput out = sample(m, kPrompt, 3, o);
  std::vector<int64_t> seq = kPrompt;
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 10; ++i) {
    torch::Tensor logits =
        m->forward(torch::tensor(seq, torch::kLong).unsqueeze(0))[0][-1];
    seq.push_back(logits.argmax().item<int64_t>());
  }
  const std::vector<int64_t> greedy(seq.begin() + kPrompt.size(), seq.end());
  for (const SampledSequence& s : out.sequences) EXPECT_EQ(s.tokens, greedy);
}

TEST(Sampler, StopSequencesEndGenerationAndAreKept) {
  TinyGpt m = make_model();
  SamplingOptions o;
  o.max_tokens = 10;
  o.temperature = 0.0;
  const std::vector<int64_t> greedy =
      sample(m, kPrompt, 1, o).sequences[0].tokens;
  o.stop = {{greedy[2], greedy[3]}, {39, 39, 39}};
  // The greedy tokens up to the first occurrence of the pair.
  size_t end = 2;
  while (greedy[end - 2] != greedy[2] || greedy[end - 1] != greedy[3]) ++end;
  SampleOutput out = sample(m, kPrompt, 2, o);
  for (const SampledSequence& s : out.sequences) {
    EXPECT_TRUE(s.stopped);
    EXPECT_EQ(s.tokens,
              std::vector<int64_t>(greedy.begin(), greedy.begin() + end));
    EXPECT_EQ(s.logprobs.size(), end);
  }
  o.stop = {{39, 39, 39}};  // never generated: runs to max_tokens
  EXPECT_FALSE(sample(m, kPrompt, 1, o).sequences[0].stopped);
}

TEST(ChooseToken, TopKTopPAndTemperatureShapeTheDraw) {
  const float logits[4] = {0.0f, std::log(3.0f), -50.0f, -50.0f};
  SamplingOptions o;  // temperature 1: p = {0.25, 0.75, ~0, ~0}
  EXPECT_EQ(choose_token(logits, 4, o, 0.0), 1);  // most likely first
  EXPECT_EQ(choose_token(logits, 4, o, 0.74), 1);
  EXPECT_EQ(choose_token(logits, 4, o, 0.76), 0);
  o.top_k = 1;
  EXPECT_EQ(choose_token(logits, 4, o, 0.999), 1);
  o.top_k = -1;
  o.top_p = 0.5;  // the top token alone reaches 0.5
  EXPECT_EQ(choose_token(logits, 4, o, 0.999), 1);
  o.top_p = 1.0;
  o.temperature = 2.0;  // p ∝ {1, sqrt(3)}: 1 covers [0, 0.634)
  EXPECT_EQ(choose_token(logits, 4, o, 0.62), 1);
  EXPECT_EQ(choose_token(logits, 4, o, 0.65), 0);
  o.temperature = 0.0;
  EXPECT_EQ(choose_token(logits, 4, o, 0.99), 1);
}

void expect_usage_error(TinyGpt& m, int64_t num_samples,
                        const SamplingOptions& o, const std::string& names,
                        std::vector<int64_t> prompt = kPrompt) {
  try {
    sample(m, prompt, num_samples, o);
    ADD_FAILURE() << "no error; expected one naming " << names;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

TEST(Sampler, BadInputIsAUsageErrorNamingTheField) {
  TinyGpt m = make_model();
  SamplingOptions ok;
  ok.max_tokens = 4;
  SamplingOptions o = ok;
  o.max_tokens = 0;
  expect_usage_error(m, 1, o, "max_tokens = 0 must be >= 1");
  o.max_tokens = 27;  // 6 + 27 > 32
  expect_usage_error(m, 1, o, "lower max_tokens to at most 26");
  // The prompt's length + INT64_MAX wrapped to a negative sum, which passed,
  // and LibTorch then failed on a negative size (found by
  // //tools/tinker:request_property_test).
  o.max_tokens = std::numeric_limits<int64_t>::max();
  expect_usage_error(m, 1, o, "lower max_tokens to at most 26");
  o = ok;
  o.temperature = -0.5;
  expect_usage_error(m, 1, o, "temperature = -0.5");
  o.temperature = std::nan("");
  expect_usage_error(m, 1, o, "temperature = nan");
  o = ok;
  o.top_p = 0.0;
  expect_usage_error(m, 1, o, "top_p = 0 must be in (0, 1]");
  o.top_p = 1.5;
  expect_usage_error(m, 1, o, "top_p = 1.5");
  o = ok;
  o.top_k = -2;
  expect_usage_error(m, 1, o, "top_k = -2");
  o = ok;
  o.stop = {{}};
  expect_usage_error(m, 1, o, "stop sequence 0 is empty");
  o.stop = {{40}};
  expect_usage_error(m, 1, o, "holds token 40, outside the vocabulary");
  expect_usage_error(m, 0, ok, "num_samples = 0");
  expect_usage_error(m, kMaxSamplesPerRequest + 1, ok, "num_samples = 129");
  expect_usage_error(m, 1, ok, "the prompt is empty", {});
  expect_usage_error(m, 1, ok, "prompt token 1 = 40", {1, 40});
}

}  // namespace
}  // namespace zerostep
