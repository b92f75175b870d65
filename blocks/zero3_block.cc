#include "blocks/zero3_block.h"

#include <map>

namespace zerostep {

std::vector<torch::Tensor> trainable_parameters(
    const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : model.parameters(/*recurse=*/true))
    if (p.requires_grad()) out.push_back(p);
  return out;
}

Zero3BlockMap map_zero3_blocks(const torch::nn::Module& model) {
  // Blocks in named_modules() order; a later (inner) block overrides an
  // outer one.
  Zero3BlockMap map;
  std::map<const void*, int> block_of;  // TensorImpl* -> block index
  for (const auto& item : model.named_modules()) {
    torch::nn::Module* m = item.value().get();
    if (dynamic_cast<Zero3Block*>(m) == nullptr) continue;
    for (const torch::Tensor& p : m->parameters(/*recurse=*/true))
      block_of[p.unsafeGetTensorImpl()] = static_cast<int>(map.blocks.size());
    map.blocks.push_back(m);
  }
  for (const torch::Tensor& p : trainable_parameters(model)) {
    auto it = block_of.find(p.unsafeGetTensorImpl());
    map.block_of_param.push_back(it == block_of.end() ? -1 : it->second);
  }
  return map;
}

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
