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

std::string stage3_whole_model_warning(const ModelShape& m, int64_t threshold) {
  const std::vector<Stage3Group> groups = stage3_groups(m, threshold);
  const size_t total = m.numel();
  if (groups.empty() || !groups.back().persistent || total == 0) return "";
  const Stage3Group& whole = groups.back();
  if (2 * whole.numel <= total) return "";
  size_t outside = 0, small = 0;
  for (size_t i : whole.params) (m.block[i] < 0 ? outside : small) += 1;
  std::string why;
  if (outside > 0) why = std::to_string(outside) + " outside every Zero3Block";
  if (small > 0)
    why += std::string(why.empty() ? "" : ", ") + std::to_string(small) +
           " in a block but below stage3_param_persistence_threshold = " +
           std::to_string(threshold) + " elements";
  const int percent = static_cast<int>(100.0 * whole.numel / total + 0.5);
  return "zero_optimization.stage 3: " + std::to_string(whole.params.size()) +
         " of " + std::to_string(m.numels.size()) + " trainable parameters (" +
         std::to_string(whole.numel) + " of " + std::to_string(total) +
         " elements, " + std::to_string(percent) +
         "%) stay whole on every rank (" + why +
         "): their parameters and gradients are not partitioned, so this "
         "run holds at least as much memory per rank as stage 1 would. "
         "Fix: derive each repeated layer of the model from zerostep::"
         "Zero3Block (blocks/zero3_block.h), or lower "
         "stage3_param_persistence_threshold";
}

std::vector<bool> stage3_kept_for_backward(
    const std::vector<Stage3Group>& groups, size_t reuse_distance) {
  std::vector<bool> kept(groups.size(), false);
  size_t after = 0;  // elements of the block groups after g
  for (size_t g = groups.size(); g-- > 0;) {
    if (groups[g].persistent) continue;
    kept[g] = 2 * after < reuse_distance;
    after += groups[g].numel;
  }
  return kept;
}

}  // namespace zerostep
