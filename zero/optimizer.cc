#include "zero/optimizer.h"

#include <cmath>

#include "common/errors.h"
#include "offload/fused_adam.h"

namespace zerostep {

FlatOptimizer::FlatOptimizer(const OptimizerHyper& hyper, size_t numel,
                             AdamKernel kernel)
    : kind_(hyper.kind), kernel_(kernel), numel_(numel) {
  if (kind_ == OptimizerKind::kSGD) {
    if (hyper.momentum != 0.0) exp_avg_.assign(numel, 0.0f);
  } else {
    exp_avg_.assign(numel, 0.0f);
    exp_avg_sq_.assign(numel, 0.0f);
  }
}

void FlatOptimizer::load_state(int64_t step_count, std::vector<float> exp_avg,
                               std::vector<float> exp_avg_sq) {
  if (step_count < 0 || exp_avg.size() != exp_avg_.size() ||
      exp_avg_sq.size() != exp_avg_sq_.size())
    throw UsageError("optimizer state does not fit this optimizer: step " +
                     std::to_string(step_count) + ", " +
                     std::to_string(exp_avg.size()) + " and " +
                     std::to_string(exp_avg_sq.size()) +
                     " moment elements where it holds " +
                     std::to_string(exp_avg_.size()) + " and " +
                     std::to_string(exp_avg_sq_.size()));
  step_count_ = step_count;
  exp_avg_ = std::move(exp_avg);
  exp_avg_sq_ = std::move(exp_avg_sq);
}

void FlatOptimizer::save(Snapshot* out) const {
  out->step_count = step_count_;
  out->exp_avg.assign(exp_avg_.begin(), exp_avg_.end());
  out->exp_avg_sq.assign(exp_avg_sq_.begin(), exp_avg_sq_.end());
}

void FlatOptimizer::restore(const Snapshot& snapshot) {
  step_count_ = snapshot.step_count;
  exp_avg_.assign(snapshot.exp_avg.begin(), snapshot.exp_avg.end());
  exp_avg_sq_.assign(snapshot.exp_avg_sq.begin(), snapshot.exp_avg_sq.end());
}

size_t FlatOptimizer::state_bytes() const {
  return (exp_avg_.size() + exp_avg_sq_.size()) * sizeof(float);
}

void FlatOptimizer::step(float* params, const float* grads,
                         const OptimizerHyper& hyper) {
  if (hyper.kind != kind_) {
    throw UsageError("FlatOptimizer: the optimizer type cannot change "
                     "between steps");
  }
  ++step_count_;
  const size_t n = numel_;
  if (kind_ == OptimizerKind::kSGD) {
    const float lr = static_cast<float>(hyper.lr);
    const float wd = static_cast<float>(hyper.weight_decay);
    const float mom = static_cast<float>(hyper.momentum);
    const bool use_momentum = hyper.momentum != 0.0;
    if (use_momentum && exp_avg_.size() != n) exp_avg_.assign(n, 0.0f);
    float* buf = exp_avg_.data();
    const bool first = step_count_ == 1;
    for (size_t i = 0; i < n; ++i) {
      float d = grads[i];
      if (wd != 0.0f) d += wd * params[i];
      if (use_momentum) {
        buf[i] = first ? d : mom * buf[i] + d;
        d = buf[i];
      }
      params[i] -= lr * d;
    }
    return;
  }
  if (kernel_ == AdamKernel::kFused) {
    AdamStepParams p;
    p.lr = hyper.lr;
    p.beta1 = hyper.beta1;
    p.beta2 = hyper.beta2;
    p.eps = hyper.eps;
    p.weight_decay = hyper.weight_decay;
    p.step = step_count_;
    p.decoupled = kind_ == OptimizerKind::kAdamW;
    fused_adam_step(params, grads, exp_avg_.data(), exp_avg_sq_.data(), n, p);
    return;
  }
  // Adam / AdamW, in LibTorch's operation order.
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step_count_));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step_count_));
  const float step_size = static_cast<float>(hyper.lr / bias1);
  const float inv_sqrt_bias2 = static_cast<float>(1.0 / std::sqrt(bias2));
  const float b1 = static_cast<float>(hyper.beta1);
  const float b2 = static_cast<float>(hyper.beta2);
  const float one_minus_b1 = static_cast<float>(1.0 - hyper.beta1);
  const float one_minus_b2 = static_cast<float>(1.0 - hyper.beta2);
  const float eps = static_cast<float>(hyper.eps);
  const float wd = static_cast<float>(hyper.weight_decay);
  const bool decoupled = kind_ == OptimizerKind::kAdamW;
  const float decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  float* m = exp_avg_.data();
  float* v = exp_avg_sq_.data();
  for (size_t i = 0; i < n; ++i) {
    float p = params[i];
    float g = grads[i];
    if (decoupled) {
      p *= decay;
    } else if (wd != 0.0f) {
      g += wd * p;
    }
    m[i] = b1 * m[i] + one_minus_b1 * g;
    v[i] = b2 * v[i] + one_minus_b2 * g * g;
    const float denom = std::sqrt(v[i]) * inv_sqrt_bias2 + eps;
    params[i] = p - step_size * (m[i] / denom);
  }
}

}  // namespace zerostep
