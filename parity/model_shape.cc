#include "parity/model_shape.h"

#include <map>

#include "engine/zero3_block.h"

namespace zerostep {

ModelShape model_shape(const torch::nn::Module& model,
                       const std::string& name) {
  // As Engine::setup_stage3: blocks in named_modules() order; a later
  // (inner) block overrides an outer one.
  std::map<const void*, int> block_of;
  int blocks = 0;
  for (const auto& item : model.named_modules()) {
    const torch::nn::Module* m = item.value().get();
    if (dynamic_cast<const Zero3Block*>(m) == nullptr) continue;
    for (const torch::Tensor& p : m->parameters(/*recurse=*/true))
      block_of[p.unsafeGetTensorImpl()] = blocks;
    ++blocks;
  }
  ModelShape s;
  s.name = name;
  s.num_blocks = blocks;
  for (const torch::Tensor& p : model.parameters(/*recurse=*/true)) {
    if (!p.requires_grad()) continue;
    s.numels.push_back(static_cast<size_t>(p.numel()));
    auto it = block_of.find(p.unsafeGetTensorImpl());
    s.block.push_back(it == block_of.end() ? -1 : it->second);
  }
  return s;
}

}  // namespace zerostep
