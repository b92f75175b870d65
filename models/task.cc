#include "models/task.h"

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "engine/hf_checkpoint.h"
#include "models/hf_decoder.h"
#include "models/mlp.h"
#include "models/tiny_gpt.h"

namespace zerostep {
namespace {

torch::Generator generator(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// Regression onto a fixed random "teacher": y = sin(x · W).
class MlpTask final : public Task {
 public:
  explicit MlpTask(int scale) { o_.hidden = 64 * scale; }
  std::string name() const override { return "mlp"; }
  std::shared_ptr<torch::nn::Module> make_model(uint64_t seed) const override {
    torch::manual_seed(seed);
    return Mlp(o_).ptr();
  }
  Batch make_data(uint64_t seed, int64_t n) const override {
    torch::Generator g = generator(seed);
    Batch b;
    b.input = torch::randn({n, o_.in_features}, g);
    torch::Tensor w = torch::randn({o_.in_features, o_.out_features}, g) /
                      std::sqrt(static_cast<double>(o_.in_features));
    b.target = torch::sin(torch::matmul(b.input, w));
    return b;
  }
  torch::Tensor loss(torch::nn::Module& model,
                     const Batch& batch) const override {
    auto& mlp = dynamic_cast<MlpImpl&>(model);
    // In the model's dtype (bf16 under mixed precision); the loss in fp32.
    const auto dtype = model.parameters().front().scalar_type();
    return torch::mse_loss(mlp.forward(batch.input.to(dtype)).to(torch::kFloat),
                           batch.target);
  }

 private:
  MlpOptions o_;
};

// Next-token prediction on `n` sequences of `len` + 1 tokens below `vocab`
// from a noisy affine recurrence t[i+1] = (5·t[i] + 3) mod V, with 10% of
// tokens replaced at random: inputs are the first `len`, targets the last.
Batch recurrence_tokens(uint64_t seed, int64_t n, int64_t len, int64_t vocab) {
  torch::Generator g = generator(seed);
  torch::Tensor start = torch::randint(vocab, {n}, g, torch::kLong);
  torch::Tensor seq = torch::empty({n, len + 1}, torch::kLong);
  auto acc = seq.accessor<int64_t, 2>();
  auto st = start.accessor<int64_t, 1>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t t = st[i];
    for (int64_t j = 0; j <= len; ++j) {
      acc[i][j] = t;
      t = (5 * t + 3) % vocab;
    }
  }
  torch::Tensor noise = torch::rand({n, len + 1}, g) < 0.1;
  torch::Tensor random_tokens =
      torch::randint(vocab, {n, len + 1}, g, torch::kLong);
  seq = torch::where(noise, random_tokens, seq);
  Batch b;
  b.input = seq.narrow(1, 0, len).contiguous();
  b.target = seq.narrow(1, 1, len).contiguous();
  return b;
}

// The mean next-token cross-entropy of logits [n, t, vocab].
torch::Tensor next_token_loss(const torch::Tensor& logits,
                              const torch::Tensor& target) {
  const torch::Tensor l = logits.to(torch::kFloat);
  return torch::cross_entropy_loss(l.reshape({-1, l.size(-1)}),
                                   target.reshape({-1}));
}

class GptTask final : public Task {
 public:
  explicit GptTask(const TinyGptOptions& o) : o_(o) {}
  std::string name() const override { return "gpt"; }
  std::shared_ptr<torch::nn::Module> make_model(uint64_t seed) const override {
    torch::manual_seed(seed);
    return TinyGpt(o_).ptr();
  }
  Batch make_data(uint64_t seed, int64_t n) const override {
    return recurrence_tokens(seed, n, o_.block_size, o_.vocab_size);
  }
  torch::Tensor loss(torch::nn::Module& model,
                     const Batch& batch) const override {
    auto& gpt = dynamic_cast<TinyGptImpl&>(model);
    return next_token_loss(gpt.forward(batch.input), batch.target);
  }

 private:
  TinyGptOptions o_;
};

// A Hugging Face folder's decoder (models/hf_decoder.h) on recurrence
// tokens of its vocabulary. Every model is the folder's weights, whatever
// the seed; the folder is read once for its config and headers, and again
// for each model's values.
class HfTask final : public Task {
 public:
  HfTask(const std::string& dir, int64_t seq_len)
      : dir_(dir),
        config_(read_hf_config(dir)),
        source_(std::make_shared<HfCheckpointSource>(dir)),
        seq_len_(std::min(seq_len, config_.max_position_embeddings)) {
    // What a model load checks, now, on a model without storage: a folder
    // that does not fit fails before any rank starts.
    HfDecoderOptions meta;
    meta.device = torch::kMeta;
    check_hf_weights(*make_hf_decoder(config_, meta), *source_);
  }
  std::string name() const override { return std::string(kHfTaskPrefix) + dir_; }
  std::shared_ptr<torch::nn::Module> make_model(uint64_t) const override {
    HfCausalLm model = make_hf_decoder(config_);
    load_hf_weights(*model, *source_);
    return model.ptr();
  }
  Batch make_data(uint64_t seed, int64_t n) const override {
    return recurrence_tokens(seed, n, seq_len_, config_.vocab_size);
  }
  torch::Tensor loss(torch::nn::Module& model,
                     const Batch& batch) const override {
    auto& lm = dynamic_cast<HfCausalLmImpl&>(model);
    return next_token_loss(lm.forward(batch.input), batch.target);
  }

 private:
  std::string dir_;
  HfDecoderConfig config_;
  std::shared_ptr<const HfCheckpointSource> source_;
  int64_t seq_len_;
};

}  // namespace

std::unique_ptr<Task> make_task(const std::string& name, int scale) {
  if (scale < 1) {
    throw UsageError("model scale " + std::to_string(scale) +
                     " must be at least 1");
  }
  if (name == "mlp") return std::make_unique<MlpTask>(scale);
  if (name == "gpt") {
    TinyGptOptions o;
    o.d_model = 32 * scale;
    return make_gpt_task(o);
  }
  if (name.rfind(kHfTaskPrefix, 0) == 0) {
    const std::string dir = name.substr(std::strlen(kHfTaskPrefix));
    if (dir.empty())
      throw UsageError("model '" + name +
                       "' names no folder. Fix: hf:DIR, DIR holding a Hugging "
                       "Face model's config.json and safetensors");
    if (scale != 1)
      throw UsageError("model scale " + std::to_string(scale) + " for '" +
                       name + "': a folder's model has its own shape (scale 1)");
    return make_hf_task(dir);
  }
  throw UsageError("unknown model '" + name +
                   "': the built-in models are mlp and gpt, and hf:DIR reads "
                   "a Hugging Face folder");
}

std::unique_ptr<Task> make_gpt_task(const TinyGptOptions& options) {
  return std::make_unique<GptTask>(options);
}

std::unique_ptr<Task> make_hf_task(const std::string& dir, int64_t seq_len) {
  if (seq_len < 1)
    throw UsageError("an hf task's sequence length " + std::to_string(seq_len) +
                     " must be at least 1");
  return std::make_unique<HfTask>(dir, seq_len);
}

Batch slice(const Batch& batch, int64_t first, int64_t count) {
  return {batch.input.narrow(0, first, count),
          batch.target.narrow(0, first, count)};
}

}  // namespace zerostep
