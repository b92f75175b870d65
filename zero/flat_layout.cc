#include "zero/flat_layout.h"

#include <algorithm>
#include <string>

#include "common/errors.h"

namespace zerostep {

size_t padded_numel(size_t numel, int world_size) {
  ZS_CHECK(world_size >= 1);
  const size_t quantum = kAlignNumel * static_cast<size_t>(world_size);
  return std::max(quantum, (numel + quantum - 1) / quantum * quantum);
}

FlatLayout FlatLayout::make(const std::vector<size_t>& numels,
                            int world_size) {
  if (world_size < 1) {
    throw UsageError("FlatLayout: world_size = " + std::to_string(world_size) +
                     " must be at least 1");
  }
  FlatLayout layout;
  layout.world_size = world_size;
  layout.numels = numels;
  layout.offsets.reserve(numels.size());
  for (size_t n : numels) {
    layout.offsets.push_back(layout.numel);
    layout.numel += n;
  }
  layout.padded_numel = zerostep::padded_numel(layout.numel, world_size);
  layout.partition_numel = layout.padded_numel / world_size;
  ZS_CHECK(layout.partition_numel * world_size == layout.padded_numel);
  ZS_CHECK(layout.padded_numel >= layout.numel);
  return layout;
}

}  // namespace zerostep
