// Stage0: plain data parallelism (DDP). Every rank holds the whole model,
// its gradients and the whole optimizer state. The window's gradients are
// all-reduced (average) once; every rank then applies the same update.
//
// Ownership and threading: see zero/stage.h.
#ifndef ZEROSTEP_ZERO_STAGE0_H_
#define ZEROSTEP_ZERO_STAGE0_H_

#include "zero/stage.h"

namespace zerostep {

class Stage0 final : public FlatStage {
 public:
  Stage0(const StageOptions& options, FlatBuffers buffers, Communicator* comm);

  int stage() const override { return 0; }
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     const char* phase) override;
  void apply_update(const OptimizerHyper& hyper) override;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE0_H_
