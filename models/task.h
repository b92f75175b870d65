// Task: a model, its deterministic synthetic data and its loss: what the
// harness, the property tests and the benchmarks train.
//
// Data is a pure function of (seed, sample index), generated up front for a
// whole run, so rank r's micro-batch i of window k and the single-rank
// full-batch reference see exactly the same samples.
//
// Thread safety: a Task is immutable; make_model() uses torch's global seed
// and must be called from one thread at a time.
#ifndef ZEROSTEP_MODELS_TASK_H_
#define ZEROSTEP_MODELS_TASK_H_

#include <torch/torch.h>

#include <memory>
#include <string>

#include "models/tiny_gpt.h"

namespace zerostep {

// Samples [first, first + count) of a dataset.
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // A freshly initialised model; the same seed gives the same weights.
  virtual std::shared_ptr<torch::nn::Module> make_model(uint64_t seed) const = 0;
  // `num_samples` samples drawn from `seed`.
  virtual Batch make_data(uint64_t seed, int64_t num_samples) const = 0;
  // Mean loss of `model` over the batch's samples.
  virtual torch::Tensor loss(torch::nn::Module& model,
                             const Batch& batch) const = 0;
};

// The prefix of a task over a Hugging Face folder: "hf:DIR".
inline constexpr const char* kHfTaskPrefix = "hf:";

// "mlp" or "gpt"; `scale` multiplies the hidden width (1 = the default
// small model); or "hf:DIR", make_hf_task(DIR) (scale must be 1). Throws
// UsageError naming the valid names; for a folder, what make_hf_task
// throws.
std::unique_ptr<Task> make_task(const std::string& name, int scale = 1);

// The "gpt" task at any shape (make_task("gpt", scale) is the default
// TinyGptOptions with d_model = 32 * scale); data are block_size-token
// sequences over vocab_size tokens. The shapes are not checked here:
// TinyGpt's own checks apply when a model is made.
std::unique_ptr<Task> make_gpt_task(const TinyGptOptions& options);

// The decoder of the Hugging Face folder `dir` (models/hf_decoder.h)
// trained on next-token prediction over the gpt task's recurrence tokens
// (its vocabulary, sequences of min(seq_len, max_position_embeddings)
// tokens). make_model(seed) is the folder's weights for every seed. Reads
// config.json and the safetensors headers now: IoError or ConfigError for
// a folder that cannot be used.
std::unique_ptr<Task> make_hf_task(const std::string& dir, int64_t seq_len = 16);

// Rows [first, first + count) of a batch.
Batch slice(const Batch& batch, int64_t first, int64_t count);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_TASK_H_
