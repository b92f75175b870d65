// AccumulationBoundary: the one place that decides what a backward() and a
// step() mean. A small value type: no tensors, no communicator, no clock.
// The Engine asks it, before acting, what to do (plan_*), then tells it what
// happened (commit_* / finish_step), so a call that fails half way changes no
// counter.
//
// Note [Boundary semantics]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Managed mode (managed_gradient_accumulation = true, DeepSpeed's behaviour):
//   - micro_steps counts step() calls; the k-th micro-batch runs with
//     micro_steps == k, and advances it at the end of its step().
//   - is_gradient_accumulation_boundary() is the value set by
//     set_gradient_accumulation_boundary() if any, else
//     (micro_steps + 1) % gradient_accumulation_steps == 0.
//   - backward() on a boundary reduces the window's gradients (stage 0/1);
//     another backward() before step() is then rejected.
//   - step() on a boundary applies one update (reducing first if no boundary
//     backward did); off the boundary it only advances micro_steps.
//   - global_samples += train_batch_size per applied update.
// Unmanaged mode (false): step() is the boundary, every call.
//   - micro_steps counts backward() calls.
//   - is_gradient_accumulation_boundary() is true only while step() runs.
//   - backward() never reduces for stage 0/1 (stages 2/3 reduce-scatter on
//     every backward in both modes; that is the stage's business).
//   - step() reduces, finalizes and applies exactly one update; with no
//     backward() since the last step it is a UsageError and changes nothing.
//   - set_gradient_accumulation_boundary() is a UsageError.
//   - global_samples += micro_batch × world × (backward calls in the window).
// In both modes a step() that applies an update closes the window.
//
// Thread safety: none; owned by one Engine.
#ifndef ZEROSTEP_ENGINE_BOUNDARY_H_
#define ZEROSTEP_ENGINE_BOUNDARY_H_

#include <cstdint>
#include <optional>

namespace zerostep {

struct BoundaryOptions {
  bool managed = true;                      // managed_gradient_accumulation
  int64_t gradient_accumulation_steps = 1;  // >= 1
  int64_t train_batch_size = 1;             // samples per managed update
  int64_t micro_batch_size = 1;             // train_micro_batch_size_per_gpu
  int64_t world_size = 1;
};

// What backward() must do.
struct BackwardPlan {
  bool is_boundary = false;    // this backward ends a managed window
  bool reduce_window = false;  // stage 0/1: reduce gradients after autograd
};

// What step() must do.
struct StepPlan {
  bool apply_update = false;         // false: managed, off the boundary
  bool reduce_window_first = false;  // gradients not yet reduced this window
  int64_t window_backwards = 0;      // backward() calls in the window
};

class AccumulationBoundary {
 public:
  // Throws UsageError if an option is out of range.
  explicit AccumulationBoundary(const BoundaryOptions& options);

  // Throws UsageError (managed: backward after the window's boundary
  // backward and before step()). Changes nothing.
  BackwardPlan plan_backward() const;
  // Records a backward that completed.
  void commit_backward(const BackwardPlan& plan);

  // Throws UsageError if the step would apply an update to an empty window.
  // Changes nothing.
  StepPlan plan_step() const;
  // Marks step() as running (unmanaged: the boundary flag turns true).
  void enter_step();
  // Records the end of a step that ran to completion. `applied` is false
  // when an update was planned but skipped (fp16 overflow): the window still
  // closes, global_steps does not advance.
  void finish_step(const StepPlan& plan, bool applied);
  // Leaves step() after a failure: every counter is as before enter_step().
  void abort_step();

  bool is_gradient_accumulation_boundary() const;
  // Managed mode only; UsageError in unmanaged mode.
  void set_gradient_accumulation_boundary(bool is_boundary);

  // Counters a checkpoint carries (taken between windows).
  struct Counters {
    int64_t micro_steps = 0;
    int64_t global_steps = 0;
    int64_t global_samples = 0;
    int64_t skipped_steps = 0;
  };
  Counters counters() const {
    return {micro_steps_, global_steps_, global_samples_, skipped_steps_};
  }
  // Restores them; UsageError inside a step or with a window open.
  void restore(const Counters& c);

  bool managed() const { return options_.managed; }
  bool in_step() const { return in_step_; }
  int64_t micro_steps() const { return micro_steps_; }
  int64_t global_steps() const { return global_steps_; }
  int64_t global_samples() const { return global_samples_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t window_backwards() const { return window_backwards_; }
  bool window_reduced() const { return window_reduced_; }
  const BoundaryOptions& options() const { return options_; }

 private:
  BoundaryOptions options_;
  std::optional<bool> boundary_override_;
  bool in_step_ = false;
  bool window_reduced_ = false;
  int64_t micro_steps_ = 0;
  int64_t global_steps_ = 0;
  int64_t global_samples_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t window_backwards_ = 0;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_BOUNDARY_H_
