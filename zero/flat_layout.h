// FlatLayout: where each trainable parameter lives in one contiguous flat
// buffer, and how that buffer is split into one partition per rank.
//
// Note [Padding rule]
// ~~~~~~~~~~~~~~~~~~~
// A flat range of n elements that W ranks partition (the whole model at
// stages 0-2, one stage 3 group) is padded with zeros to
// padded_numel(n, W): the next multiple of W × kAlignNumel, and at least
// one such quantum, so that every rank's partition has the same length and
// starts 64-byte aligned. Padding elements hold zero parameters and zero
// gradients forever, and any elementwise optimizer leaves them at zero.
// Every user of the rule (FlatLayout, Stage3, the shape-only schedule)
// calls padded_numel().
//
// Parameters are packed back to back in registration order.
//
// Thread safety: immutable after make().
#ifndef ZEROSTEP_ZERO_FLAT_LAYOUT_H_
#define ZEROSTEP_ZERO_FLAT_LAYOUT_H_

#include <cstddef>
#include <vector>

namespace zerostep {

inline constexpr size_t kAlignNumel = 16;  // 64 bytes of float32

// Note [Padding rule]. world_size >= 1.
size_t padded_numel(size_t numel, int world_size);

struct FlatLayout {
  static constexpr size_t kAlignNumel = zerostep::kAlignNumel;

  std::vector<size_t> offsets;  // element offset of each parameter
  std::vector<size_t> numels;   // element count of each parameter
  size_t numel = 0;             // sum of numels
  size_t padded_numel = 0;      // Note [Padding rule]
  size_t partition_numel = 0;   // padded_numel / world_size
  int world_size = 1;

  // Throws UsageError if world_size < 1.
  static FlatLayout make(const std::vector<size_t>& numels, int world_size);

  size_t partition_begin(int rank) const { return rank * partition_numel; }
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_FLAT_LAYOUT_H_
