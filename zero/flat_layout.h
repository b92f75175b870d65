// FlatLayout: where each trainable parameter lives in one contiguous flat
// buffer, and how that buffer is split into one partition per rank.
//
// Parameters are packed back to back in registration order. The total is
// padded with zeros to a multiple of world_size × kAlignNumel, so that every
// rank's partition has the same length and starts 64-byte aligned; padding
// elements hold zero parameters and zero gradients forever, and any
// elementwise optimizer leaves them at zero.
//
// Thread safety: immutable after make().
#ifndef ZEROSTEP_ZERO_FLAT_LAYOUT_H_
#define ZEROSTEP_ZERO_FLAT_LAYOUT_H_

#include <cstddef>
#include <vector>

namespace zerostep {

struct FlatLayout {
  static constexpr size_t kAlignNumel = 16;  // 64 bytes of float32

  std::vector<size_t> offsets;  // element offset of each parameter
  std::vector<size_t> numels;   // element count of each parameter
  size_t numel = 0;             // sum of numels
  size_t padded_numel = 0;      // numel rounded up; multiple of world × align
  size_t partition_numel = 0;   // padded_numel / world_size
  int world_size = 1;

  // Throws UsageError if world_size < 1.
  static FlatLayout make(const std::vector<size_t>& numels, int world_size);

  size_t partition_begin(int rank) const { return rank * partition_numel; }
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_FLAT_LAYOUT_H_
