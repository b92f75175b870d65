// A small multilayer perceptron (Linear-tanh blocks) for regression tests
// and the harness. Deterministic given torch's global seed at construction.
// Each layer is a Zero3Block (blocks/zero3_block.h).
#ifndef ZEROSTEP_MODELS_MLP_H_
#define ZEROSTEP_MODELS_MLP_H_

#include <torch/torch.h>

#include <vector>

#include "blocks/zero3_block.h"

namespace zerostep {

struct MlpOptions {
  int64_t in_features = 32;
  int64_t hidden = 64;
  int64_t layers = 3;  // Linear layers, >= 1
  int64_t out_features = 8;
};

// One Linear layer (and tanh, except for the last): a ZeRO stage 3 block.
class MlpLayerImpl : public torch::nn::Module, public Zero3Block {
 public:
  MlpLayerImpl(int64_t in, int64_t out, bool activation);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Linear fc_{nullptr};
  bool activation_;
};
TORCH_MODULE(MlpLayer);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const MlpOptions& options);
  torch::Tensor forward(torch::Tensor x);

 private:
  std::vector<MlpLayer> layers_;
};
TORCH_MODULE(Mlp);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_MLP_H_
