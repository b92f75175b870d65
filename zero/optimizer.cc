#include "zero/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/errors.h"
#include "offload/fused_adam.h"
#include "offload/swap_store.h"

namespace zerostep {

FlatOptimizer::FlatOptimizer(const OptimizerHyper& hyper, size_t numel,
                             AdamKernel kernel, const OptimizerSwap& swap,
                             Kernels* kernels)
    : kind_(hyper.kind),
      kernel_(kernel),
      numel_(numel),
      kernels_(kernels != nullptr ? kernels : &host_kernels()) {
  num_arrays_ = kind_ != OptimizerKind::kSGD ? 2 : hyper.momentum != 0.0 ? 1 : 0;
  if (!kernels_->host_addressable() &&
      (kernel_ != AdamKernel::kFused || swap.device != nullptr))
    throw UsageError(
        "FlatOptimizer: the reference kernel and a swapped state run on "
        "the host; this optimizer's state is on " + kernels_->device() +
        ". Fix: keep the ZeRO state on the host (offload_optimizer.device "
        "\"cpu\" or \"nvme\") or use the fused kernel in memory");
  if (swap.device == nullptr || num_arrays_ == 0 || numel == 0) {
    if (num_arrays_ >= 1) exp_avg_ = kernels_->allocate(numel);
    if (num_arrays_ == 2) exp_avg_sq_ = kernels_->allocate(numel);
    return;
  }
  if (kernel_ != AdamKernel::kFused)
    throw UsageError("FlatOptimizer: a swapped state runs the fused kernel");
  SwapStoreOptions o;
  o.num_arrays = num_arrays_;
  o.numel = numel;
  o.subgroup_numel = std::min(swap.sub_group_numel, numel);
  o.buffer_count = std::max<size_t>(3, swap.buffer_count / num_arrays_);
  store_ = std::make_unique<SwapStore>(swap.device, o);
  // Whatever a previous run left on the device is not this run's state.
  store_->write_all([](const SwapSubgroup&) {});
}

FlatOptimizer::~FlatOptimizer() = default;
FlatOptimizer::FlatOptimizer(FlatOptimizer&&) noexcept = default;

std::vector<float> FlatOptimizer::read_array(size_t i) const {
  require_settled("exp_avg");
  if (i >= num_arrays_) return {};
  std::vector<float> out(numel_, 0.0f);
  if (store_) {
    // The store reads every array at once; the other is read and dropped.
    std::vector<float> other(num_arrays_ == 2 ? numel_ : 0, 0.0f);
    float* arrays[2] = {i == 0 ? out.data() : other.data(),
                        i == 0 ? other.data() : out.data()};
    store_->read_arrays(arrays);
    return out;
  }
  const DeviceArray& a = i == 0 ? exp_avg_ : exp_avg_sq_;
  kernels_->download(out.data(), a.data(), numel_);
  return out;
}

std::vector<float> FlatOptimizer::exp_avg() const { return read_array(0); }

std::vector<float> FlatOptimizer::exp_avg_sq() const { return read_array(1); }

void FlatOptimizer::load_state(int64_t step_count, std::vector<float> exp_avg,
                               std::vector<float> exp_avg_sq) {
  require_settled("load_state");
  const size_t want_m = num_arrays_ >= 1 ? numel_ : 0;
  const size_t want_v = num_arrays_ == 2 ? numel_ : 0;
  if (step_count < 0 || exp_avg.size() != want_m ||
      exp_avg_sq.size() != want_v)
    throw UsageError("optimizer state does not fit this optimizer: step " +
                     std::to_string(step_count) + ", " +
                     std::to_string(exp_avg.size()) + " and " +
                     std::to_string(exp_avg_sq.size()) +
                     " moment elements where it holds " +
                     std::to_string(want_m) + " and " + std::to_string(want_v));
  if (store_) {
    const float* arrays[2] = {exp_avg.data(), exp_avg_sq.data()};
    store_->write_arrays(arrays);  // atomic: old or new state on IoError
    step_count_ = step_count;
    return;
  }
  step_count_ = step_count;
  kernels_->upload(exp_avg_.data(), exp_avg.data(), exp_avg.size());
  kernels_->upload(exp_avg_sq_.data(), exp_avg_sq.data(), exp_avg_sq.size());
}

void FlatOptimizer::save(Snapshot* out) {
  out->step_count = step_count_;
  if (store_) return;  // the device keeps the committed moments
  // Note [Moments written at commit]: from now on steps defer the moments.
  deferred_ = true;
  fit_scratch(num_arrays_);
}

void FlatOptimizer::fit_scratch(size_t arrays) {
  const size_t want = arrays * std::min(numel_, kCommitChunk);
  if (scratch_.size() >= want) return;
  scratch_ = kernels_->allocate(want);
}

void FlatOptimizer::require_settled(const char* what) const {
  if (pending_ == nullptr && !(store_ && store_->has_prepared())) return;
  throw UsageError(std::string("FlatOptimizer::") + what +
                   ": the last step() is neither committed nor restored. "
                   "Fix: call commit() once the update has succeeded "
                   "everywhere, or restore() to undo it");
}

void FlatOptimizer::restore(const Snapshot& snapshot) {
  step_count_ = snapshot.step_count;
  if (store_) {
    if (store_->has_prepared()) store_->discard_prepared();
    return;
  }
  // Note [Moments written at commit]: the moments were never written.
  pending_.reset();
}

void FlatOptimizer::commit() {
  if (store_) {
    if (store_->has_prepared()) store_->commit_prepared();
    return;
  }
  if (pending_ == nullptr) return;
  // Note [Moments written at commit]: the step's update again, the
  // moments in place, the parameters to the scratch.
  const Pending& q = *pending_;
  if (q.hyper.kind == OptimizerKind::kSGD && q.hyper.momentum != 0.0 &&
      exp_avg_.size() != numel_) {
    exp_avg_ = kernels_->allocate(numel_);  // appears: zeros, as in step()
    num_arrays_ = 1;
  }
  // As in step(): SGD's momentum buffer only while the momentum is on.
  const bool sgd = q.hyper.kind == OptimizerKind::kSGD;
  const bool moments = !sgd || q.hyper.momentum != 0.0;
  float* m = moments ? exp_avg_.data() : nullptr;
  float* v = moments && !sgd ? exp_avg_sq_.data() : nullptr;
  for (const Piece& piece : q.pieces) {
    if (piece.at_commit) {
      // Its parameters too, in the same pass.
      const size_t o = piece.state_offset;
      update(piece.in, piece.out, q.grads + o, m ? m + o : nullptr,
             m ? m + o : nullptr, v ? v + o : nullptr, v ? v + o : nullptr,
             piece.numel, q.hyper);
      continue;
    }
    for (size_t c = 0; c < piece.numel && moments; c += kCommitChunk) {
      const size_t o = piece.state_offset + c;
      update(piece.in + c, scratch_.data(), q.grads + o, m + o, m + o,
             v ? v + o : nullptr, v ? v + o : nullptr,
             std::min(kCommitChunk, piece.numel - c), q.hyper);
    }
  }
  pending_.reset();
}

size_t FlatOptimizer::state_bytes() const {
  if (store_) return static_cast<size_t>(store_->buffer_bytes());
  return exp_avg_.bytes() + exp_avg_sq_.bytes();
}

size_t FlatOptimizer::rollback_bytes() const { return scratch_.bytes(); }

AdamStepParams FlatOptimizer::adam_params(const OptimizerHyper& hyper,
                                          int64_t step) const {
  AdamStepParams p;
  p.lr = hyper.lr;
  p.beta1 = hyper.beta1;
  p.beta2 = hyper.beta2;
  p.eps = hyper.eps;
  p.weight_decay = hyper.weight_decay;
  p.step = step;
  p.decoupled = kind_ == OptimizerKind::kAdamW;
  p.bias_correction = hyper.bias_correction;
  p.threads = hyper.threads;
  return p;
}

void FlatOptimizer::step_swapped(float* params, const float* grads,
                                 const OptimizerHyper& hyper) {
  const int64_t step = step_count_ + 1;
  const bool first = step == 1;
  const AdamStepParams ap = adam_params(hyper, step);
  // Parameters are updated in place, sub-group by sub-group, as the
  // moments stream through: a failed pass leaves some updated, and the
  // caller's transaction restores them (Note [NVMe optimizer state]).
  store_->prepare_update([&](const SwapSubgroup& s) {
    float* p = params + s.first;
    const float* g = grads + s.first;
    if (kind_ != OptimizerKind::kSGD) {
      fused_adam_step(p, g, s.arrays[0], s.arrays[1], s.count, ap);
      return;
    }
    host_kernels().sgd(p, g, s.arrays[0], s.count,
                       {hyper.lr, hyper.weight_decay, hyper.momentum, first});
  });
  step_count_ = step;
}

void FlatOptimizer::step(float* params, const float* grads,
                         const OptimizerHyper& hyper) {
  step(params, params, grads, hyper);
}

void FlatOptimizer::step(const float* params_in, float* params_out,
                         const float* grads, const OptimizerHyper& hyper) {
  step({Piece{params_in, params_out, 0, numel_}}, grads, hyper);
}

void FlatOptimizer::step(const std::vector<Piece>& pieces, const float* grads,
                         const OptimizerHyper& hyper) {
  if (hyper.kind != kind_) {
    throw UsageError("FlatOptimizer: the optimizer type cannot change "
                     "between steps");
  }
  require_settled("step");
  const size_t n = numel_;
  {
    size_t at = 0;  // the pieces cover the state in order
    for (const Piece& q : pieces) {
      ZS_CHECK(q.state_offset == at);
      at += q.numel;
    }
    ZS_CHECK(at == n);
  }
  if (store_) {
    // The swapped state streams over one contiguous span (steps_pieces()).
    ZS_CHECK(pieces.size() == 1);
    const Piece& q = pieces[0];
    if (q.out != q.in) kernels_->copy(q.out, q.in, n);
    step_swapped(q.out, grads, hyper);
    return;
  }
  // SGD's momentum scheduled up from 0 gets its buffer (zeros) when it
  // first appears; a scheduled 0 runs without it.
  const bool momentum = kind_ == OptimizerKind::kSGD && hyper.momentum != 0.0;
  const bool appears = momentum && exp_avg_.size() != n;
  ++step_count_;
  if (!deferred_) {
    if (appears) {
      exp_avg_ = kernels_->allocate(n);
      num_arrays_ = 1;
    }
    float* m = kind_ != OptimizerKind::kSGD || momentum ? exp_avg_.data()
                                                         : nullptr;
    float* v = kind_ != OptimizerKind::kSGD ? exp_avg_sq_.data() : nullptr;
    for (const Piece& q : pieces) {
      const size_t o = q.state_offset;
      update(q.in, q.out, grads + o, m ? m + o : nullptr, m ? m + o : nullptr,
             v ? v + o : nullptr, v ? v + o : nullptr, q.numel, hyper);
    }
    return;
  }
  // Note [Moments written at commit]: the new moments of each chunk go to
  // the scratch and are dropped; commit() writes them.
  const size_t arrays = kind_ != OptimizerKind::kSGD ? 2 : momentum ? 1 : 0;
  fit_scratch(arrays);
  float* sm = arrays >= 1 ? scratch_.data() : nullptr;
  float* sv = arrays == 2 ? scratch_.data() + std::min(n, kCommitChunk)
                          : nullptr;
  const float* m = appears || arrays == 0 ? nullptr : exp_avg_.data();
  const float* v = arrays == 2 ? exp_avg_sq_.data() : nullptr;
  for (const Piece& q : pieces)
    for (size_t c = 0; c < q.numel && !q.at_commit; c += kCommitChunk) {
      const size_t o = q.state_offset + c;
      update(q.in + c, q.out + c, grads + o, m ? m + o : nullptr, sm,
             v ? v + o : nullptr, sv, std::min(kCommitChunk, q.numel - c),
             hyper);
    }
  pending_ = std::make_unique<Pending>(Pending{pieces, grads, hyper});
}

void FlatOptimizer::update(const float* p_in, float* p_out, const float* g,
                           const float* m_in, float* m_out, const float* v_in,
                           float* v_out, size_t n,
                           const OptimizerHyper& hyper) {
  if (kind_ != OptimizerKind::kSGD && kernel_ == AdamKernel::kFused) {
    kernels_->adam_into(AdamArrays{p_in, p_out, g, m_in, m_out, v_in, v_out},
                        n, adam_params(hyper, step_count_));
    return;
  }
  // SGD and the reference loop update in place: on copies where the
  // outputs are apart.
  if (p_out != p_in) kernels_->copy(p_out, p_in, n);
  if (m_out != nullptr && m_out != m_in) {
    if (m_in != nullptr)
      kernels_->copy(m_out, m_in, n);
    else
      kernels_->zero(m_out, n);
  }
  if (v_out != nullptr && v_out != v_in) kernels_->copy(v_out, v_in, n);
  if (kind_ == OptimizerKind::kSGD) {
    kernels_->sgd(p_out, g, m_out, n,
                  {hyper.lr, hyper.weight_decay, hyper.momentum,
                   step_count_ == 1});
    return;
  }
  reference_adam(p_out, g, m_out, v_out, n, hyper);
}

void FlatOptimizer::reference_adam(float* params, const float* grads,
                                   float* m, float* v, size_t n,
                                   const OptimizerHyper& hyper) {
  // Adam / AdamW, in LibTorch's operation order.
  const double t = static_cast<double>(step_count_);
  const double bias1 =
      hyper.bias_correction ? 1.0 - std::pow(hyper.beta1, t) : 1.0;
  const double bias2 =
      hyper.bias_correction ? 1.0 - std::pow(hyper.beta2, t) : 1.0;
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
