// The protocol's losses on one datum (Note [Losses] in protocol.h): the
// checks of a forward_backward request, the log-probabilities of a datum's
// target tokens and its per-token loss.
//
// Thread safety: free functions over values.
#ifndef ZEROSTEP_TOOLS_TINKER_LOSSES_H_
#define ZEROSTEP_TOOLS_TINKER_LOSSES_H_

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "tools/tinker/base_model.h"
#include "tools/tinker/protocol.h"

namespace zerostep {
namespace tinker {

// One datum's checked inputs for its loss.
struct DatumPlan {
  torch::Tensor tokens;   // [1, T] int64
  torch::Tensor targets;  // [T] int64, or [T, K] (cross_entropy soft targets)
  torch::Tensor weights;  // as targets, float32 (cross_entropy)
  torch::Tensor q;        // [T] sampling logprobs; stable_reinforce: the
                          // sampler's recorded ones (Note [Stability
                          // records] in stability.h), NaN at prompt positions
  torch::Tensor adv;      // [T] advantages
  torch::Tensor ratio_mask;  // [T] float32, gspo: nonzero = in the sequence
                             // ratio (sequence_ratio_mask, int or float)
};

// Checks everything forward_backward reads (the loss, its config, every
// datum's tokens and loss_fn_inputs against `base`'s vocabulary and
// context; for stable_reinforce that every datum has provenance whose runs
// tile its input and targets) and returns each datum's inputs as tensors
// (stable_reinforce's q is left for the trainer to fill from the sampler's
// records). Throws UsageError naming the datum and the field; reads
// nothing but its arguments.
std::vector<DatumPlan> plan_forward_backward(const ForwardBackwardIn& in,
                                             const BaseModel& base);

// A loss's loss_fn_config (Note [Losses] in protocol.h).
struct LossConfig {
  double clip_low = 0.8;   // clip_low_threshold: ppo, cispo (0), gspo
  double clip_high = 1.2;  // clip_high_threshold: ppo, cispo (4), gspo
  double beta = 0.0;       // dro
  double kl_coeff = 0.0;   // stable_reinforce
};

// `loss_fn`'s config read from `loss_fn_config`: ppo defaults the
// thresholds to 0.8 and 1.2 (Tinker's documented epsilon of 0.2), cispo to
// 0 and 4 (the cookbook's one-sided clip, docs/design/trainer_server.md);
// stable_reinforce's kl_coeff defaults to 0 (no penalty); gspo's
// thresholds and dro's beta have no documented default and are required.
// UsageError for a loss this server does not compute (custom says why and
// what to use instead), a key the loss does not read, a non-finite value,
// a missing required key, clip_low_threshold > clip_high_threshold, or a
// negative beta or kl_coeff.
LossConfig loss_config(const std::string& loss_fn,
                       const std::map<std::string, double>& loss_fn_config);

// log p(target_t | tokens_<=t) for each position: logits [T, V], targets
// [T] or [T, K] int64; returns the targets' shape.
torch::Tensor target_logprobs(const torch::Tensor& logits,
                              const torch::Tensor& targets);

// The per-token loss of one datum whose target log-probabilities are
// `logprobs` ([T]), for `loss_fn` (one of supported_losses(), checked by
// plan_forward_backward) with `config` (from loss_config); the datum's
// loss is its sum. Differentiable in `logprobs` as Note [Losses] says (the
// sg() parts carry no gradient).
torch::Tensor elementwise_loss(const std::string& loss_fn,
                               const torch::Tensor& logprobs,
                               const DatumPlan& datum,
                               const LossConfig& config);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_LOSSES_H_
