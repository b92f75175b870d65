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

class Stage1 final : public Stage {
 public:
  Stage1(const StageOptions& options, FlatBuffers buffers, Communicator* comm);

  int stage() const override { return 1; }
  void on_backward(Phase) override {}
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     Phase phase) override;
  GradStats finalize(double divisor, double clip) override;
  void apply_update(const OptimizerHyper& hyper) override;
  void zero_grad() override;
  const FlatOptimizer& optimizer() const override { return optimizer_; }
  size_t optimizer_offset() const override {
    return layout_.partition_begin(comm_->rank());
  }
  MemoryStats memory() const override;

 private:
  FlatLayout layout_;
  FlatBuffers buf_;
  Communicator* comm_;
  FlatOptimizer optimizer_;
  std::vector<float> grad_partition_;  // the reduced gradient this rank owns
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE1_H_
