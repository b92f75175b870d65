#include "zero/grouping.h"

#include "common/errors.h"

namespace zerostep {

size_t ModelShape::numel() const {
  size_t n = 0;
  for (size_t x : numels) n += x;
  return n;
}

std::vector<Stage3Group> stage3_groups(const ModelShape& m, int64_t threshold) {
  if (m.numels.size() != m.block.size())
    throw UsageError(
        "model shape '" + m.name + "': " + std::to_string(m.numels.size()) +
        " parameters but " + std::to_string(m.block.size()) + " block entries");
  std::vector<Stage3Group> blocks(static_cast<size_t>(m.num_blocks));
  for (size_t b = 0; b < blocks.size(); ++b)
    blocks[b].block = static_cast<int>(b);
  Stage3Group persistent;
  persistent.persistent = true;
  for (size_t i = 0; i < m.numels.size(); ++i) {
    if (m.block[i] < -1 || m.block[i] >= m.num_blocks)
      throw UsageError("model shape '" + m.name + "': parameter " +
                       std::to_string(i) + " is in block " +
                       std::to_string(m.block[i]) + " of " +
                       std::to_string(m.num_blocks));
    const bool in_block =
        m.block[i] >= 0 && static_cast<int64_t>(m.numels[i]) >= threshold;
    Stage3Group& g =
        in_block ? blocks[static_cast<size_t>(m.block[i])] : persistent;
    g.params.push_back(i);
    g.numel += m.numels[i];
  }
  std::vector<Stage3Group> used;
  for (const Stage3Group& g : blocks)
    if (!g.params.empty()) used.push_back(g);
  if (!persistent.params.empty()) used.push_back(persistent);
  return used;
}

}  // namespace zerostep
