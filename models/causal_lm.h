// CausalLm: what a sampler needs of a decoder (models/sampler.h), whatever
// its family: the full forward, and incremental decoding against a
// KvCache. TinyGptImpl (models/tiny_gpt.h) and HfCausalLmImpl
// (models/hf_decoder.h) implement it; the trainer server serves both
// through it.
//
// Thread safety: as torch::nn::Module (forward_cached writes the cache
// it is given, nothing else).
#ifndef ZEROSTEP_MODELS_CAUSAL_LM_H_
#define ZEROSTEP_MODELS_CAUSAL_LM_H_

#include <torch/torch.h>

#include <vector>

namespace zerostep {

// The keys and values of every layer for a batch of sequences, filled by
// CausalLm::forward_cached(). keys[l] and values[l] are [batch, heads,
// capacity, head_dim] (heads: the model's key/value heads); positions [0,
// length) are valid. Rows are independent sequences that share a length;
// repeat_rows() turns one prefilled prompt into several samples.
struct KvCache {
  std::vector<torch::Tensor> keys, values;
  int64_t length = 0;
  int64_t capacity() const { return keys.empty() ? 0 : keys[0].size(2); }
  int64_t batch() const { return keys.empty() ? 0 : keys[0].size(0); }
  // Each row repeated `times` times (row r becomes rows r*times ...
  // r*times + times-1): one prompt's cache for `times` samples.
  // UsageError unless times >= 1.
  void repeat_rows(int64_t times);
};

class CausalLm {
 public:
  virtual ~CausalLm() = default;
  // The number of token ids the model reads and predicts.
  virtual int64_t vocab_size() const = 0;
  // The most positions one sequence may hold (prompt and generated).
  virtual int64_t context_length() const = 0;
  // tokens [batch, t] int64 → logits [batch, t, vocab] (the module's
  // forward()).
  virtual torch::Tensor logits(const torch::Tensor& tokens) = 0;
  // An empty cache for `batch` sequences of up to `capacity` tokens.
  // UsageError unless 1 <= batch and 1 <= capacity <= context_length().
  virtual KvCache new_cache(int64_t batch, int64_t capacity) const = 0;
  // tokens: [cache->batch(), t] int64, the positions after the cached
  // ones → logits [batch, t, vocab] for them, equal to logits() of the
  // whole prefix at those positions up to float rounding (a step's
  // attention is a matmul of another shape); appends their keys and values
  // to *cache. UsageError (nothing changed) if the cache would exceed its
  // capacity, the batch differs, or t < 1. Call it under
  // torch::NoGradGuard (the cache is written in place).
  virtual torch::Tensor forward_cached(torch::Tensor tokens,
                                       KvCache* cache) = 0;
};

// The checks forward_cached() makes before it changes anything (shared by
// the implementations): UsageError naming the rule.
void check_cached_step(const torch::Tensor& tokens, const KvCache& cache);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_CAUSAL_LM_H_
