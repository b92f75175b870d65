#include "parity/model_shape.h"

#include "blocks/zero3_block.h"

namespace zerostep {

ModelShape model_shape(const torch::nn::Module& model,
                       const std::string& name) {
  const Zero3BlockMap map = map_zero3_blocks(model);
  ModelShape s;
  s.name = name;
  s.num_blocks = static_cast<int>(map.blocks.size());
  s.block = map.block_of_param;
  for (const torch::Tensor& p : trainable_parameters(model))
    s.numels.push_back(static_cast<size_t>(p.numel()));
  return s;
}

}  // namespace zerostep
