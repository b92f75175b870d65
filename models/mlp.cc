#include "models/mlp.h"

namespace zerostep {

MlpImpl::MlpImpl(const MlpOptions& o) {
  const int64_t layers = std::max<int64_t>(1, o.layers);
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t in = i == 0 ? o.in_features : o.hidden;
    const int64_t out = i == layers - 1 ? o.out_features : o.hidden;
    linears_.push_back(register_module("fc" + std::to_string(i),
                                       torch::nn::Linear(in, out)));
  }
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  for (size_t i = 0; i < linears_.size(); ++i) {
    x = linears_[i]->forward(x);
    if (i + 1 < linears_.size()) x = torch::tanh(x);
  }
  return x;
}

}  // namespace zerostep
