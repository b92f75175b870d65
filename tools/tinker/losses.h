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
  torch::Tensor targets;  // [T] int64
  torch::Tensor weights;  // [T] float32 (cross_entropy)
  torch::Tensor q;        // [T] sampling logprobs
  torch::Tensor adv;      // [T] advantages
};

// Checks everything forward_backward reads (the loss, its config, every
// datum's tokens and loss_fn_inputs against `base`'s vocabulary and
// context) and returns each datum's inputs as tensors. Throws UsageError
// naming the datum and the field; reads nothing but its arguments.
std::vector<DatumPlan> plan_forward_backward(const ForwardBackwardIn& in,
                                             const BaseModel& base);

// ppo's clip thresholds: loss_fn_config's clip_low_threshold and
// clip_high_threshold, 0.8 and 1.2 when absent.
struct PpoClip {
  double low = 0.8;
  double high = 1.2;
};
PpoClip ppo_clip(const std::map<std::string, double>& loss_fn_config);

// log p(target_t | tokens_<=t) for each position: logits [T, V], targets
// [T] int64; returns [T].
torch::Tensor target_logprobs(const torch::Tensor& logits,
                              const torch::Tensor& targets);

// The per-token loss of one datum whose target log-probabilities are
// `logprobs` ([T]), for `loss_fn` (one of supported_losses(), checked by
// plan_forward_backward); the datum's loss is its sum.
torch::Tensor elementwise_loss(const std::string& loss_fn,
                               const torch::Tensor& logprobs,
                               const DatumPlan& datum, const PpoClip& clip);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_LOSSES_H_
