// Sampling from a decoder (a CausalLm: TinyGpt or a Hugging Face decoder):
// batched generation with a KV cache, seeded, with temperature, top-k,
// top-p, stop token sequences, stop strings and per-token logprobs.
//
// One call generates `num_samples` continuations of one prompt as one
// batch: the prompt runs once (prefill), its cache is repeated for every
// sample, then each step runs one token per sample (TinyGptImpl::
// forward_cached). With options.use_kv_cache = false every step instead
// recomputes the whole prefix with forward() (the baseline of
// benchmarks/sampling_bench.cc); the two give the same tokens for the same
// seed up to float rounding of the logits.
//
// Note [Sampled logprobs]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every logprob returned (of a sampled token, and of a prompt token) is
// under the model's own next-token distribution: log_softmax of the raw
// logits, before temperature, top-k and top-p. Tinker's documentation does
// not define it otherwise, and this is the quantity forward() reports for
// the same tokens (the RL losses' "sampling logprobs"), so the two can be
// compared; it is the behaviour policy's logprob exactly when temperature
// is 1 and no top-k/top-p filter applies.
//
// Determinism: sample i of a request draws from its own generator, seeded
// from (seed, i) alone (SplitMix64; no torch or std distribution whose
// output could differ between builds), so the same model, prompt, params
// and seed give the same tokens, whatever the batch or thread count.
//
// Thread safety: sample() reads the model only; concurrent calls on one
// model are safe if nothing trains it meanwhile.
#ifndef ZEROSTEP_MODELS_SAMPLER_H_
#define ZEROSTEP_MODELS_SAMPLER_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "models/causal_lm.h"
#include "models/tiny_gpt.h"

namespace zerostep {

struct SamplingOptions {
  // Tokens to generate at most; >= 1, and prompt + max_tokens must fit the
  // model's block_size.
  int64_t max_tokens = 16;
  // 0: greedy (the lowest-index argmax); > 0: logits / temperature.
  double temperature = 1.0;
  // Keep the k most likely tokens; -1 or 0: no limit.
  int64_t top_k = -1;
  // Keep the smallest set of most likely tokens whose probability reaches
  // top_p (at least one); in (0, 1], 1: no filter.
  double top_p = 1.0;
  // Generation stops after a sample's generated tokens end with one of
  // these (each non-empty); the stop tokens are part of the output.
  std::vector<std::vector<int64_t>> stop;
  // Note [Stop strings]: generation stops once a sample's generated text
  // (its tokens' bytes, token_text[id] each, concatenated) contains one of
  // these (each non-empty), as vLLM's stop strings do; the token that
  // completes it is the last of the output. Needs token_text.
  std::vector<std::string> stop_strings;
  // Every token id's bytes as the tokenizer decodes it (models/
  // token_text.h); must outlive the call and hold vocab entries when
  // stop_strings is not empty, else unused.
  const std::vector<std::string>* token_text = nullptr;
  // Seed of every sample's generator (see "Determinism").
  uint64_t seed = 0;
  // Also return the prompt's logprobs.
  bool prompt_logprobs = false;
  // false: recompute the whole prefix each step (benchmark baseline).
  bool use_kv_cache = true;
};

struct SampledSequence {
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;  // one per token (Note [Sampled logprobs])
  bool stopped = false;  // true: a stop sequence or string; false: max_tokens
};

struct SampleOutput {
  std::vector<SampledSequence> sequences;  // num_samples of them
  // When options.prompt_logprobs: one per prompt token, NaN for the first
  // (it has no context).
  std::vector<float> prompt_logprobs;
};

// The largest num_samples one call accepts.
inline constexpr int64_t kMaxSamplesPerRequest = 128;

// Checks `options` against `model` and the prompt length: UsageError
// naming the field, its value, the rule and the fix. Called by sample().
void validate_sampling(const CausalLm& model, int64_t prompt_length,
                       int64_t num_samples, const SamplingOptions& options);

// num_samples continuations of `prompt` (token ids in [0, vocab)).
// UsageError (validate_sampling, or a token out of range) before any
// compute.
SampleOutput sample(CausalLm& model, const std::vector<int64_t>& prompt,
                    int64_t num_samples, const SamplingOptions& options);
inline SampleOutput sample(TinyGpt& model, const std::vector<int64_t>& prompt,
                           int64_t num_samples,
                           const SamplingOptions& options) {
  return sample(*model, prompt, num_samples, options);
}

// The token a sampler with these options draws from one row of logits,
// given a uniform draw u in [0, 1). Exposed for tests.
int64_t choose_token(const float* logits, int64_t vocab,
                     const SamplingOptions& options, double u);

// SplitMix64: the per-sample generator.
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform() {  // [0, 1), 53 bits
    return static_cast<double>(next() >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t state_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_SAMPLER_H_
