// How the stages make a window's gradient the average over the ranks, and
// DeepSpeed's two switches that change it: prescale_gradients and
// gradient_predivide_factor.
//
// Note [Gradient averaging]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// By default every stage sums the ranks' gradients (in the communicator's
// fixed order) and divides the sum by the world size W once: stages 0/1 in
// the collective (ReduceOp::kAvg), stages 2/3 in finalize(). DeepSpeed's
// prescale_gradients and gradient_predivide_factor move scaling before the
// sum. zerostep then runs the operations of DeepSpeed's code for the stage,
// one for one, as multiplications by float scalars (DeepSpeed's div_ by a
// Python number is, on a GPU, a multiplication by the float reciprocal;
// its mul_ by a Python number one by that number rounded to float):
//
//   prescale_gradients, every stage (engine.allreduce_bucket,
//   gradient_reduction_w_predivide, __avg_scatter_contiguous_grads):
//       g *= 1/W; sum; nothing after (the factor is unused).
//   gradient_predivide_factor f, stages 0-2 (engine.allreduce_bucket,
//   stage_1_and_2's gradient_reduction_w_predivide):
//       g *= 1/f; sum; sum *= f/W, unless f == W.
//   gradient_predivide_factor f, stage 3 (stage3's
//   __avg_scatter_contiguous_grads):
//       g *= 1/f; g *= 1/W; sum; sum *= f, unless f == W.
//
// "g" is each rank's part of one reduction: at stages 0/1 the window's
// accumulated gradient (reduced once per window, as DeepSpeed's stages 0/1
// do at the boundary), at stages 2/3 each backward's gradient, bucket by
// bucket or group by group as it is reduce-scattered (with
// reduce_once_per_step the window's). The scaling after the sum is applied
// once, in finalize(), to the window's summed gradient or partition, just
// where the default divides by W (DeepSpeed's stages 2/3 scale each
// micro-batch's reduction before adding it up; for a window of one
// backward the two are the same operations). Both accumulation modes run
// exactly these operations, so managed and unmanaged stay bitwise equal.
//
// DeepSpeed honours the switches where it reduces without reduce-scatter:
// stage 0 always, stages 1-3 with zero_optimization.reduce_scatter false;
// with its default (true) its stage 1 ignores them and its stages 2/3 assert
// that they are off. zerostep has no reduce_scatter switch and honours them
// at every stage.
//
// Thread safety: values and pure functions.
#ifndef ZEROSTEP_ZERO_AVERAGING_H_
#define ZEROSTEP_ZERO_AVERAGING_H_

#include <cstddef>
#include <vector>

#include "zero/kernels.h"

namespace zerostep {

// ds_config's prescale_gradients and gradient_predivide_factor (Note
// [Gradient averaging]); the defaults are zerostep's sum-then-divide.
struct GradAveraging {
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;  // finite, > 0
  bool is_default() const {
    return !prescale_gradients && gradient_predivide_factor == 1.0;
  }
};

// The scalings of Note [Gradient averaging] for one stage and world size.
struct AveragingSteps {
  // false: the default (the sum divided by W). true: `before` and `after`.
  bool scaled = false;
  // Multiplies each rank's gradient before the sum, in this order.
  std::vector<float> before;
  // Multiplies the sum (1: nothing).
  float after = 1.0f;
};

AveragingSteps averaging_steps(const GradAveraging& averaging, int stage,
                               int world_size);

// x[0, n) *= each of steps.before, in order, with `k` (whose memory x is
// in); nothing for the default.
void scale_before_sum(Kernels& k, const AveragingSteps& steps, float* x,
                      size_t n);

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_AVERAGING_H_
