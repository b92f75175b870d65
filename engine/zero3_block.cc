#include "engine/zero3_block.h"

namespace zerostep {

torch::Tensor zero3_block(
    torch::nn::Module& block, const torch::Tensor& input,
    const std::function<torch::Tensor(const torch::Tensor&)>& body) {
  auto* marked = dynamic_cast<Zero3Block*>(&block);
  internal::Zero3Hooks* hooks = marked ? marked->zero3_hooks() : nullptr;
  if (hooks == nullptr || !hooks->enter(block)) return body(input);
  torch::Tensor output;
  try {
    output = body(input);
  } catch (...) {
    hooks->abandon(block);
    throw;
  }
  return hooks->exit(block, output);
}

}  // namespace zerostep
