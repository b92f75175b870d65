#include "zero/averaging.h"

#include "common/errors.h"

namespace zerostep {
namespace {

// DeepSpeed's tensor.mul_(x) for a Python float x: x rounded to float.
float mul_by(double x) { return static_cast<float>(x); }
// Its tensor.div_(x) on a GPU: a multiplication by 1 / x, in float.
float div_by(double x) { return 1.0f / static_cast<float>(x); }

}  // namespace

AveragingSteps averaging_steps(const GradAveraging& a, int stage,
                               int world_size) {
  ZS_CHECK(world_size >= 1);
  ZS_CHECK(stage >= 0 && stage <= 3);
  ZS_CHECK(a.gradient_predivide_factor > 0);
  AveragingSteps s;
  if (a.is_default()) return s;
  s.scaled = true;
  const double w = world_size;
  const double f = a.gradient_predivide_factor;
  if (a.prescale_gradients) {
    // engine.allreduce_bucket: mul_(1. / W); ZeRO 1-3: div_(W).
    s.before = {stage == 0 ? mul_by(1.0 / w) : div_by(w)};
    return s;
  }
  if (stage < 3) {
    s.before = {mul_by(1.0 / f)};
    if (f != w) s.after = mul_by(f / w);
    return s;
  }
  s.before = {div_by(f), div_by(w)};
  if (f != w) s.after = mul_by(f);
  return s;
}

void scale_before_sum(Kernels& k, const AveragingSteps& steps, float* x,
                      size_t n) {
  for (float factor : steps.before) k.scale(x, n, factor);
}

}  // namespace zerostep
