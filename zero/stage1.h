// Stage1: optimizer state partitioned across ranks. Rank r owns elements
// [r·P, (r+1)·P) of the flat buffer (P = layout.partition_numel): at the
// boundary the window's gradients are reduce-scattered (average) to their
// owners, each rank updates its partition with its 1/W share of optimizer
// state, and the updated parameters are all-gathered back into every rank's
// full copy.
//
// Note [Stage 1 reduce buckets]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model larger than reduce_bucket_size (all ranks' chunks together) is
// reduce-scattered piece by piece: each piece's W slices of the flat
// gradient (one per partition, reduce_bucket_size / W elements each,
// aligned) are copied into a staging buffer of one bucket and
// reduce-scattered from there into the owned partition. Every element is
// the same fold over the ranks as in one reduce-scatter of the whole
// buffer, so the bits do not change; what changes is the memory a backend
// needs beside it: Gloo receives the other ranks' chunks into a scratch of
// (W - 1) chunks (Note [Gloo reduce-scatter and all-gather] in
// comm/gloo_world.cc), which for one whole-model reduce-scatter was (W -
// 1)/W of the gradient (101 MB per rank for the 33.6M GPT at 4 ranks,
// issue 46) and is now (W - 1)/W of one bucket. Cost: the staging buffer
// (planned: "reduce staging") and one copy of the gradient per window.
// At DeepSpeed's default bucket (5e8 elements) every model below that
// size is still one reduce-scatter straight from the gradient buffer.
//
// Ownership and threading: see zero/stage.h.
#ifndef ZEROSTEP_ZERO_STAGE1_H_
#define ZEROSTEP_ZERO_STAGE1_H_

#include <vector>

#include "zero/stage.h"

namespace zerostep {

namespace internal {
// Note [Stage 1 reduce buckets]: elements per rank of each reduce-scatter
// (the partition itself when one bucket holds the whole model). Shared
// with zero/schedule.h, which plans the same collectives.
size_t stage1_reduce_piece(const FlatLayout& layout, int64_t bucket_size);
}  // namespace internal

class Stage1 final : public FlatStage {
 public:
  Stage1(const StageOptions& options, const Stage1Options& own,
         FlatBuffers buffers, Communicator* comm);

  int stage() const override { return 1; }
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     const char* phase) override;
  void apply_update(const OptimizerHyper& hyper) override;
  MemoryStats memory() const override;

 private:
  void update_master(const OptimizerHyper& hyper);
  DeviceArray grad_partition_;  // the reduced gradient this rank owns
  // Note [Stage 1 reduce buckets]: elements per rank per reduce-scatter,
  // and the staging of one bucket (empty when one reduce-scatter).
  size_t piece_;
  DeviceArray reduce_staging_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE1_H_
