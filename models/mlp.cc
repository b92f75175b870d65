#include "models/mlp.h"

namespace zerostep {

MlpLayerImpl::MlpLayerImpl(int64_t in, int64_t out, bool activation)
    : activation_(activation) {
  fc_ = register_module("fc", torch::nn::Linear(in, out));
}

torch::Tensor MlpLayerImpl::forward(const torch::Tensor& x) {
  return zero3_block(*this, x, [&](const torch::Tensor& in) {
    torch::Tensor y = fc_->forward(in);
    return activation_ ? torch::tanh(y) : y;
  });
}

MlpImpl::MlpImpl(const MlpOptions& o) {
  const int64_t layers = std::max<int64_t>(1, o.layers);
  for (int64_t i = 0; i < layers; ++i) {
    const int64_t in = i == 0 ? o.in_features : o.hidden;
    const bool last = i == layers - 1;
    const int64_t out = last ? o.out_features : o.hidden;
    layers_.push_back(
        register_module("layer" + std::to_string(i), MlpLayer(in, out, !last)));
  }
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  for (auto& layer : layers_) x = layer->forward(x);
  return x;
}

}  // namespace zerostep
