// Stage1: optimizer state partitioned across ranks. Rank r owns elements
// [r·P, (r+1)·P) of the flat buffer (P = layout.partition_numel): at the
// boundary the window's gradients are reduce-scattered (average) to their
// owners, each rank updates its partition with its 1/W share of optimizer
// state, and the updated parameters are all-gathered back into every rank's
// full copy.
//
// Ownership and threading: see zero/stage.h.
#ifndef ZEROSTEP_ZERO_STAGE1_H_
#define ZEROSTEP_ZERO_STAGE1_H_

#include <vector>

#include "zero/stage.h"

namespace zerostep {

class Stage1 final : public FlatStage {
 public:
  Stage1(const StageOptions& options, FlatBuffers buffers, Communicator* comm);

  int stage() const override { return 1; }
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     const char* phase) override;
  void apply_update(const OptimizerHyper& hyper) override;

 private:
  void update_master(const OptimizerHyper& hyper);
  DeviceArray grad_partition_;  // the reduced gradient this rank owns
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE1_H_
