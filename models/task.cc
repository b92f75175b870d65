#include "models/task.h"

#include "common/errors.h"
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

// Next-token prediction on sequences from a noisy affine recurrence
// t[i+1] = (5·t[i] + 3) mod V, with 10% of tokens replaced at random.
class GptTask final : public Task {
 public:
  explicit GptTask(const TinyGptOptions& o) : o_(o) {}
  std::string name() const override { return "gpt"; }
  std::shared_ptr<torch::nn::Module> make_model(uint64_t seed) const override {
    torch::manual_seed(seed);
    return TinyGpt(o_).ptr();
  }
  Batch make_data(uint64_t seed, int64_t n) const override {
    torch::Generator g = generator(seed);
    const int64_t len = o_.block_size + 1;
    torch::Tensor start = torch::randint(o_.vocab_size, {n}, g, torch::kLong);
    torch::Tensor seq = torch::empty({n, len}, torch::kLong);
    auto acc = seq.accessor<int64_t, 2>();
    auto st = start.accessor<int64_t, 1>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t t = st[i];
      for (int64_t j = 0; j < len; ++j) {
        acc[i][j] = t;
        t = (5 * t + 3) % o_.vocab_size;
      }
    }
    torch::Tensor noise = torch::rand({n, len}, g) < 0.1;
    torch::Tensor random_tokens =
        torch::randint(o_.vocab_size, {n, len}, g, torch::kLong);
    seq = torch::where(noise, random_tokens, seq);
    Batch b;
    b.input = seq.narrow(1, 0, o_.block_size).contiguous();
    b.target = seq.narrow(1, 1, o_.block_size).contiguous();
    return b;
  }
  torch::Tensor loss(torch::nn::Module& model,
                     const Batch& batch) const override {
    auto& gpt = dynamic_cast<TinyGptImpl&>(model);
    torch::Tensor logits = gpt.forward(batch.input).to(torch::kFloat);
    return torch::cross_entropy_loss(logits.view({-1, o_.vocab_size}),
                                     batch.target.view({-1}));
  }

 private:
  TinyGptOptions o_;
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
  throw UsageError("unknown model '" + name +
                   "': the built-in models are mlp and gpt");
}

std::unique_ptr<Task> make_gpt_task(const TinyGptOptions& options) {
  return std::make_unique<GptTask>(options);
}

Batch slice(const Batch& batch, int64_t first, int64_t count) {
  return {batch.input.narrow(0, first, count),
          batch.target.narrow(0, first, count)};
}

}  // namespace zerostep
