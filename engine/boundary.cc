#include "engine/boundary.h"

#include <string>

#include "common/errors.h"

namespace zerostep {

AccumulationBoundary::AccumulationBoundary(const BoundaryOptions& options)
    : options_(options) {
  auto require_positive = [](const char* name, int64_t v) {
    if (v < 1) {
      throw UsageError(std::string("AccumulationBoundary: ") + name + " = " +
                       std::to_string(v) + " must be at least 1");
    }
  };
  require_positive("gradient_accumulation_steps",
                   options.gradient_accumulation_steps);
  require_positive("train_batch_size", options.train_batch_size);
  require_positive("micro_batch_size", options.micro_batch_size);
  require_positive("world_size", options.world_size);
}

bool AccumulationBoundary::is_gradient_accumulation_boundary() const {
  if (!options_.managed) return in_step_;
  if (boundary_override_.has_value()) return *boundary_override_;
  return (micro_steps_ + 1) % options_.gradient_accumulation_steps == 0;
}

void AccumulationBoundary::set_gradient_accumulation_boundary(
    bool is_boundary) {
  if (!options_.managed) {
    throw UsageError(
        "set_gradient_accumulation_boundary() is not allowed with "
        "managed_gradient_accumulation = false: in unmanaged mode step() is "
        "the boundary, every call. Fix: call step() when the window ends, or "
        "set managed_gradient_accumulation to true to drive the boundary "
        "yourself");
  }
  boundary_override_ = is_boundary;
}

BackwardPlan AccumulationBoundary::plan_backward() const {
  if (in_step_) {
    throw UsageError("backward() called while step() is running");
  }
  BackwardPlan plan;
  if (!options_.managed) return plan;  // unmanaged: never reduce in backward
  if (window_reduced_) {
    throw UsageError(
        "backward() called after the boundary backward of this accumulation "
        "window and before step() (micro_steps = " +
        std::to_string(micro_steps_) +
        "): the window's gradients were already reduced, so this backward "
        "would be lost. Fix: call step() after every backward() in managed "
        "mode, or use managed_gradient_accumulation = false to call "
        "backward() several times before one step()");
  }
  plan.is_boundary = is_gradient_accumulation_boundary();
  plan.reduce_window = plan.is_boundary;
  return plan;
}

void AccumulationBoundary::commit_backward(const BackwardPlan& plan) {
  ++window_backwards_;
  if (plan.reduce_window) window_reduced_ = true;
  if (!options_.managed) ++micro_steps_;
}

StepPlan AccumulationBoundary::plan_step() const {
  if (in_step_) throw UsageError("step() called while step() is running");
  StepPlan plan;
  plan.window_backwards = window_backwards_;
  const bool boundary = options_.managed ? is_gradient_accumulation_boundary()
                                         : true;
  if (!boundary) return plan;  // managed, mid-window: micro_steps only
  if (window_backwards_ == 0) {
    if (options_.managed) {
      throw UsageError(
          "step() on an accumulation boundary (micro_steps = " +
          std::to_string(micro_steps_) +
          ") with no backward() in the window: there is no gradient to "
          "apply; nothing was changed. Fix: call backward() before step()");
    }
    throw UsageError(
        "step() called with no backward() since the last step: with "
        "managed_gradient_accumulation = false every step() applies one "
        "update to the gradients of the backward() calls since the previous "
        "step(), and there are none; nothing was changed. Fix: call "
        "backward() at least once before each step()");
  }
  plan.apply_update = true;
  plan.reduce_window_first = !window_reduced_;
  return plan;
}

void AccumulationBoundary::restore(const Counters& c) {
  if (in_step_ || window_backwards_ != 0)
    throw UsageError("counters can only be restored between windows");
  micro_steps_ = c.micro_steps;
  global_steps_ = c.global_steps;
  global_samples_ = c.global_samples;
  skipped_steps_ = c.skipped_steps;
  boundary_override_.reset();
}

void AccumulationBoundary::enter_step() {
  ZS_CHECK(!in_step_);
  in_step_ = true;
}

void AccumulationBoundary::abort_step() { in_step_ = false; }

void AccumulationBoundary::finish_step(const StepPlan& plan, bool applied) {
  ZS_CHECK(in_step_);
  ZS_CHECK(applied ? plan.apply_update : true);
  in_step_ = false;
  if (plan.apply_update) {
    if (applied) {
      ++global_steps_;
      global_samples_ += options_.managed
                             ? options_.train_batch_size
                             : options_.micro_batch_size *
                                   options_.world_size * plan.window_backwards;
    } else {
      ++skipped_steps_;
    }
    window_backwards_ = 0;
    window_reduced_ = false;
  }
  if (options_.managed) ++micro_steps_;
}

}  // namespace zerostep
