// The Tinker wire formats this server speaks, decoded into plain structs
// (no LibTorch): the protobuf forward_backward request and result
// (tinker_public.proto), and the names of the protocol's losses.
//
// Every decode error is a UsageError whose message names the datum, the
// field and the rule; nothing is partially applied by a decoder.
//
// Thread safety: free functions over values.
#ifndef ZEROSTEP_TOOLS_TINKER_PROTOCOL_H_
#define ZEROSTEP_TOOLS_TINKER_PROTOCOL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zerostep {
namespace tinker {

// A loss_fn_inputs tensor, widened: int32/int64 → `ints`, float32 → `floats`.
struct TensorValue {
  bool is_float = false;
  std::vector<int64_t> shape;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  int64_t numel() const;
};

struct DatumIn {
  std::vector<int64_t> tokens;  // the model input, all chunks concatenated
  std::map<std::string, TensorValue> inputs;  // loss_fn_inputs
};

struct ForwardBackwardIn {
  std::string model_id;
  int32_t seq_id = 0;
  std::string loss_fn;
  std::map<std::string, double> loss_fn_config;
  bool forward_only = false;
  std::vector<DatumIn> data;
};

// Parses just enough of a protobuf body to route it: model_id and seq_id.
// Returns false if `body` is not a ForwardBackwardRequest.
bool peek_forward_backward(const std::string& body, std::string* model_id,
                           int32_t* seq_id);

// Parses and decodes the whole request. UsageError on malformed protobuf,
// a sparse tensor, a dtype other than float32/int32/int64, dense bytes that
// do not match dtype × shape, a chunk that is not encoded text, or a
// non-numeric loss_fn_config entry.
ForwardBackwardIn decode_forward_backward(const std::string& body);

// One datum's outputs.
struct DatumOut {
  std::vector<float> logprobs;          // per target token
  std::vector<float> elementwise_loss;  // per target token
};

// A serialized ForwardBackwardOutput: one ArrayRecord with the fields
// "logprobs" and "elementwise_loss" (float32, one row per datum) and the
// given metrics ("name:reduction").
std::string encode_forward_backward_output(
    const std::vector<DatumOut>& data,
    const std::map<std::string, double>& metrics);

// The losses this server computes, and what each reads from loss_fn_inputs.
// Note [Losses]: every loss is a sum over the datum's target tokens (not
// normalised), as Tinker's documentation defines them; p = logp (the
// model's target log-probabilities), q = the sampler's logprobs, A =
// advantages, r = exp(logp - q), sg() = no gradient:
//   cross_entropy        -sum(weights * logp)
//   importance_sampling  -sum(r * A)
//   ppo                  -sum(min(r*A, clip(r, lo, hi)*A))
//   cispo                -sum(sg(clip(r, lo, hi)) * logp * A)
//   dro                  -sum(logp*A - beta/2 * (logp - q)^2)
//   gspo                 -sum(min(s_t*A, clip(s_t, lo, hi)*A)), where
//                        s_t = exp(M + logp_t - sg(logp_t)) and M is the
//                        mean of sg(logp) - q over the tokens
//                        sequence_ratio_mask marks (nonzero)
// Inputs: target_tokens, and weights (optional) for cross_entropy;
// target_tokens, logprobs (q) and advantages for the others; gspo also
// sequence_ratio_mask (integer or float).
// loss_fn_config: lo, hi = clip_low_threshold, clip_high_threshold (ppo and
// cispo: 0.8 and 1.2 when absent; gspo: required), dro's beta (required).
// losses.h checks and computes them.
const std::vector<std::string>& supported_losses();

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_PROTOCOL_H_
