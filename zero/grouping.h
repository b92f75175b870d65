// Stage 3 grouping: which trainable parameters form which stage 3 group,
// stated once over sizes and block indices, without LibTorch.
//
// Note [Stage 3 grouping rule]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The parameters of each Zero3Block (blocks/zero3_block.h) that have at
// least `persistence_threshold` elements form one group, in block order
// (blocks numbered in module order; a parameter belongs to the innermost
// block holding it). Every other trainable parameter (outside every block,
// or below the threshold) joins one persistent group, placed last when it
// is not empty. A block left without such a parameter forms no group.
// The engine's stage 3 binding, the shape-only schedule (zero/schedule.h)
// and the parity harness's model shapes all call stage3_groups(); the
// padding of each group follows Note [Padding rule] (zero/flat_layout.h).
//
// Thread safety: pure functions of their arguments.
#ifndef ZEROSTEP_ZERO_GROUPING_H_
#define ZEROSTEP_ZERO_GROUPING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zerostep {

// A model as the grouping rule and the shape-only schedule see it.
struct ModelShape {
  std::string name;
  std::vector<size_t> numels;  // trainable parameters, registration order
  // Per parameter: the index of the innermost Zero3Block holding it (blocks
  // numbered in module order), or -1.
  std::vector<int> block;
  int num_blocks = 0;
  size_t numel() const;
};

struct Stage3Group {
  std::vector<size_t> params;  // engine parameter indices, in order
  size_t numel = 0;            // sum of the parameters' numels
  bool persistent = false;     // stays whole on every rank
  int block = -1;              // the block it came from; -1 if persistent
};

// Note [Stage 3 grouping rule]. UsageError if model.numels and model.block
// differ in length or a block index is outside [-1, num_blocks).
std::vector<Stage3Group> stage3_groups(const ModelShape& model,
                                       int64_t persistence_threshold);

// Note [Stage 3 reuse distance] (zero/stage3.h): per group, whether it
// stays gathered from its forward to its backward: a block group g is kept
// when twice the elements of the block groups after it is below
// `reuse_distance` (zero_optimization.stage3_max_reuse_distance); never a
// persistent one (always whole). The kept groups are a suffix of the block
// groups. The stage and the shape-only schedule both call it.
std::vector<bool> stage3_kept_for_backward(
    const std::vector<Stage3Group>& groups, size_t reuse_distance);

// What a user should be told when most of the model stays whole at stage
// 3: "" when the persistent group (Note [Stage 3 grouping rule]) holds at
// most half of the trainable elements, else one line naming how many
// parameters and elements stay whole on every rank, why (outside every
// Zero3Block, or below stage3_param_persistence_threshold = `threshold`),
// what that costs (stage 3 then partitions little beyond what stage 1
// does, and holds more), and the fix. The Engine logs it on rank 0
// (common/log.h).
std::string stage3_whole_model_warning(const ModelShape& model,
                                       int64_t threshold);

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_GROUPING_H_
