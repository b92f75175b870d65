// Stage0: plain data parallelism (DDP). Every rank holds the whole model,
// its gradients and the whole optimizer state. The window's gradients are
// all-reduced (average) once; every rank then applies the same update.
//
// Note [Stage 0 buckets]
// ~~~~~~~~~~~~~~~~~~~~~~
// The all-reduce runs per bucket of the flat gradient (make_buckets of
// reduce_bucket_size, as stage 2's buckets; one bucket with the default
// size), each asynchronous, all waited for at the end of reduce_window().
// In managed mode with overlap_comm, the boundary backward agrees on the
// window before its autograd pass (begin_boundary_backward) and launches
// each bucket as soon as every parameter in it has its gradient, so the
// reduction overlaps the rest of the backward, as DDP's buckets do in its
// last, synchronising backward; buckets whose parameters got no gradient
// go in reduce_window(). Unmanaged mode, which cannot know the last
// backward, reduces the same buckets in step(). The same buckets on the
// same data give the same bits on every backend, so both modes stay
// bitwise equal; the sum per element is the backend's for that bucket.
//
// Ownership and threading: see zero/stage.h.
#ifndef ZEROSTEP_ZERO_STAGE0_H_
#define ZEROSTEP_ZERO_STAGE0_H_

#include <memory>
#include <vector>

#include "zero/stage.h"
#include "zero/stage2.h"

namespace zerostep {

class Stage0 final : public FlatStage {
 public:
  Stage0(const StageOptions& options, const Stage0Options& own,
         FlatBuffers buffers, Communicator* comm);

  int stage() const override { return 0; }
  void begin_boundary_backward(int64_t window_backwards,
                               int64_t global_steps) override;
  void on_grad_ready(size_t param_index) override;
  bool wants_grad_ready() const override { return overlap_comm_; }
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     const char* phase) override;
  void apply_update(const OptimizerHyper& hyper) override;

 private:
  bool overlap_comm_;
  internal::BucketLauncher launcher_;
  // This window's reduce: begun in the boundary backward (agreed, some
  // buckets launched) or not yet.
  bool begun_ = false;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE0_H_
