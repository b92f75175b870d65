// A small multilayer perceptron (Linear-tanh blocks) for regression tests
// and the harness. Deterministic given torch's global seed at construction.
#ifndef ZEROSTEP_MODELS_MLP_H_
#define ZEROSTEP_MODELS_MLP_H_

#include <torch/torch.h>

#include <vector>

namespace zerostep {

struct MlpOptions {
  int64_t in_features = 32;
  int64_t hidden = 64;
  int64_t layers = 3;  // Linear layers, >= 1
  int64_t out_features = 8;
};

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const MlpOptions& options);
  torch::Tensor forward(torch::Tensor x);

 private:
  std::vector<torch::nn::Linear> linears_;
};
TORCH_MODULE(Mlp);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_MLP_H_
