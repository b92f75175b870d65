// Stage: one ZeRO stage's data movement and update over flat buffers.
//
// The Engine owns the flat parameter and gradient buffers (LibTorch tensors
// whose storage the model's parameters and .grad views alias) and drives a
// Stage through the window protocol below; the Stage decides which
// collectives run and which part of the buffers this rank updates. Stages
// never count micro-steps: AccumulationBoundary (engine/boundary.h) decides
// when each call happens (Note [Boundary semantics]).
//
//   on_backward(phase)      after every backward's autograd pass
//                           (stages 0/1: nothing).
//   reduce_window(n, phase) once per window: agree on n across ranks, then
//                           reduce (stage 0: all-reduce; stage 1:
//                           reduce-scatter to each partition's owner).
//   finalize(divisor, clip) inside step(): divide the reduced gradient,
//                           compute the global norm, clip.
//   apply_update(hyper)     the optimizer on this rank's part, then (stage 1)
//                           all-gather of the updated parameters.
//   zero_grad()             clear the window's gradients.
//
// Note [Window agreement]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Before the first gradient collective of a window every rank all-gathers
// (backward count, global step). Ranks that ran different numbers of
// backward() calls all raise the same UsageError before any gradient is
// reduced, so nothing is updated and nothing hangs. Both accumulation modes
// issue it, so managed and unmanaged runs move the same bytes.
//
// Ownership: `comm` and the buffers must outlive the Stage.
// Thread safety: none; one Stage per rank.
#ifndef ZEROSTEP_ZERO_STAGE_H_
#define ZEROSTEP_ZERO_STAGE_H_

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "zero/flat_layout.h"
#include "zero/optimizer.h"

namespace zerostep {

struct StageOptions {
  int stage = 0;  // 0 or 1 (2 and 3: later)
  FlatLayout layout;
  OptimizerHyper optimizer;
};

// Views of the engine's flat buffers; each holds layout.padded_numel floats.
struct FlatBuffers {
  float* params = nullptr;
  float* grads = nullptr;
};

struct GradStats {
  double global_norm = 0.0;  // L2 norm over all ranks' gradients
  bool clipped = false;
};

// Bytes resident on this rank, by kind.
struct MemoryStats {
  size_t param_bytes = 0;
  size_t grad_bytes = 0;
  size_t optimizer_state_bytes = 0;
};

class Stage {
 public:
  virtual ~Stage() = default;

  virtual int stage() const = 0;
  virtual void on_backward(Phase phase) = 0;
  // Throws UsageError (Note [Window agreement]) or CommError; the gradient
  // buffers are unchanged on error.
  virtual void reduce_window(int64_t window_backwards, int64_t global_steps,
                             Phase phase) = 0;
  // `divisor` >= 1 divides the reduced gradient (per_step_count scaling);
  // `clip` > 0 clips to that global L2 norm.
  virtual GradStats finalize(double divisor, double clip) = 0;
  virtual void apply_update(const OptimizerHyper& hyper) = 0;
  virtual void zero_grad() = 0;

  virtual const FlatOptimizer& optimizer() const = 0;
  // First element (of the flat buffer) this rank's optimizer updates.
  virtual size_t optimizer_offset() const = 0;
  virtual MemoryStats memory() const = 0;
};

// What stages 0 and 1 share: the buffers, the communicator, and one
// optimizer over the span of the flat buffer this rank updates ("owned":
// the whole buffer at stage 0, the rank's partition at stage 1), whose
// reduced gradient lives at `owned_grad`.
class FlatStage : public Stage {
 public:
  // Divides the owned gradient, computes the global norm (an 8-byte
  // all-reduce when the owned span is a partition), clips.
  GradStats finalize(double divisor, double clip) override;
  void zero_grad() override;
  const FlatOptimizer& optimizer() const override { return optimizer_; }
  size_t optimizer_offset() const override { return owned_offset_; }
  MemoryStats memory() const override;

 protected:
  // `partitioned`: the owned span is this rank's partition, reduced into a
  // buffer of its own (stage 1), not the replicated whole (stage 0).
  FlatStage(const StageOptions& options, FlatBuffers buffers,
            Communicator* comm, bool partitioned, size_t owned_offset,
            size_t owned_numel);
  // Points the owned gradient at its storage (the flat gradient buffer, or
  // a partition buffer the subclass owns).
  void set_owned_grad(float* owned_grad) { owned_grad_ = owned_grad; }
  // The optimizer on the owned span of the parameters.
  void update_owned(const OptimizerHyper& hyper);
  FlatLayout layout_;
  FlatBuffers buf_;
  Communicator* comm_;
  bool partitioned_;
  size_t owned_offset_;
  size_t owned_numel_;
  float* owned_grad_ = nullptr;
  FlatOptimizer optimizer_;
};

// Throws UsageError for an unsupported stage number.
std::unique_ptr<Stage> make_stage(const StageOptions& options,
                                  FlatBuffers buffers, Communicator* comm);

namespace internal {
// Note [Window agreement]. Throws UsageError naming each disagreeing rank.
void agree_on_window(Communicator& comm, int64_t window_backwards,
                     int64_t global_steps);
// Sum of squares of x[0, n) in double.
double sum_of_squares(const float* x, size_t n);
// x[i] = x[i] / divisor (skipped for divisor == 1).
void divide(float* x, size_t n, double divisor);
// x[i] *= factor.
void scale(float* x, size_t n, float factor);
// LibTorch's clip_grad_norm_ coefficient: max_norm / (norm + 1e-6), or 1.
float clip_coefficient(double norm, double max_norm);
}  // namespace internal

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE_H_
