// FlatOptimizer: Adam, AdamW and SGD over one flat float32 span (a rank's
// partition, or the whole model at stage 0), with the semantics of LibTorch's
// torch::optim::Adam / AdamW / SGD (bias correction from the step count;
// Adam adds weight_decay·p to the gradient, AdamW decays p by lr·wd before
// the Adam update; SGD momentum with dampening 0, no Nesterov).
//
// State (exp_avg, exp_avg_sq or the momentum buffer) is allocated once, at
// construction, for exactly the span's length.
//
// Thread safety: none; one optimizer per rank.
#ifndef ZEROSTEP_ZERO_OPTIMIZER_H_
#define ZEROSTEP_ZERO_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zerostep {

enum class OptimizerKind { kAdam, kAdamW, kSGD };

struct OptimizerHyper {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // SGD only
};

// How Adam/AdamW updates are computed. Both give the same bits (no FMA in
// either; offload/fused_adam.h): kFused is the vectorized single-pass
// kernel, kReference the plain scalar loop the kernel is tested against.
enum class AdamKernel { kFused, kReference };

class FlatOptimizer {
 public:
  FlatOptimizer(const OptimizerHyper& hyper, size_t numel,
                AdamKernel kernel = AdamKernel::kFused);

  // One update of params[0, numel) from grads[0, numel) with `hyper`
  // (which may differ from the constructor's, e.g. a scheduled lr; the kind
  // must not change: UsageError).
  void step(float* params, const float* grads, const OptimizerHyper& hyper);

  int64_t step_count() const { return step_count_; }
  size_t numel() const { return numel_; }
  // Adam/AdamW: first and second moments. SGD: exp_avg is the momentum
  // buffer, exp_avg_sq is empty.
  const std::vector<float>& exp_avg() const { return exp_avg_; }
  const std::vector<float>& exp_avg_sq() const { return exp_avg_sq_; }
  // Bytes of optimizer state held.
  size_t state_bytes() const;
  // Restores a checkpointed state: `exp_avg` / `exp_avg_sq` must be as long
  // as exp_avg() / exp_avg_sq() are. UsageError on a mismatch (nothing
  // changes then).
  void load_state(int64_t step_count, std::vector<float> exp_avg,
                  std::vector<float> exp_avg_sq);

  // Everything step() changes besides the parameters: the step count and
  // the moments. save() copies them into `*out` (reusing its buffers, so a
  // snapshot kept across steps allocates once); restore() puts them back.
  // Used to undo an update whose collective failed (Note [Transactional
  // update] in zero/stage.h).
  struct Snapshot {
    int64_t step_count = 0;
    std::vector<float> exp_avg;
    std::vector<float> exp_avg_sq;
    size_t bytes() const {
      return (exp_avg.capacity() + exp_avg_sq.capacity()) * sizeof(float);
    }
  };
  void save(Snapshot* out) const;
  void restore(const Snapshot& snapshot);

 private:
  OptimizerKind kind_;
  AdamKernel kernel_;
  size_t numel_;
  int64_t step_count_ = 0;
  std::vector<float> exp_avg_;
  std::vector<float> exp_avg_sq_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_OPTIMIZER_H_
