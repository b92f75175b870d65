// model_shape(): a LibTorch model as zero/grouping.h sees it (trainable
// parameter sizes in registration order, each with its innermost
// Zero3Block), found by the same map_zero3_blocks() the engine uses.
//
// Thread safety: reads the module only.
#ifndef ZEROSTEP_PARITY_MODEL_SHAPE_H_
#define ZEROSTEP_PARITY_MODEL_SHAPE_H_

#include <torch/torch.h>

#include <string>

#include "zero/grouping.h"

namespace zerostep {

ModelShape model_shape(const torch::nn::Module& model, const std::string& name);

}  // namespace zerostep

#endif  // ZEROSTEP_PARITY_MODEL_SHAPE_H_
