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

// One run of a datum's provenance (the SDK's PromptProvenanceSpan or
// SampledProvenanceSpan): positions [offset, offset + length) of the prompt
// (sampled = false) or of the sampled tokens of sequence `sequence_id`.
struct ProvenanceSpanIn {
  bool sampled = false;
  std::string sequence_id;
  int64_t offset = 0;
  int64_t length = 0;
};

struct DatumIn {
  std::vector<int64_t> tokens;  // the model input, all chunks concatenated
  std::map<std::string, TensorValue> inputs;  // loss_fn_inputs
  // Datum.with_provenance: runs tiling `tokens` and
  // inputs["target_tokens"] (checked by the loss that reads them).
  bool has_provenance = false;
  std::vector<ProvenanceSpanIn> input_spans, target_spans;
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
// do not match dtype × shape, a chunk that is not encoded text, a
// non-numeric loss_fn_config entry, or provenance that is not a pair of
// span lists of well-formed spans (a non-empty sequence_id, offset and
// length >= 0, one of the two kinds).
ForwardBackwardIn decode_forward_backward(const std::string& body);

// One datum's outputs.
struct DatumOut {
  std::vector<float> logprobs;          // per target (row-major [N, k])
  std::vector<float> elementwise_loss;  // as logprobs
  // 0: one target per position ([N]); k >= 1: k per position ([N, k], the
  // cross_entropy soft targets of distillation).
  int64_t k = 0;
};

// A serialized ForwardBackwardOutput: the fields "logprobs" and
// "elementwise_loss" (float32, one row per datum; a datum with k >= 1 has
// trailing shape [k]), one ArrayRecord per run of consecutive datums with
// the same k (the SDK joins them), and the given metrics
// ("name:reduction").
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
//   stable_reinforce     -sum(sg(min(r, 1)) * A * logp
//                             + kl_coeff * ((r - 1) - log r)) over the
//                        sampled positions, q the sampler's recorded
//                        logprobs (Note [stable_reinforce] in stability.h)
// Inputs: target_tokens, and weights (optional) for cross_entropy (both
// [T] or both [T, K]: K soft targets per position); target_tokens,
// logprobs (q) and advantages for the others; gspo also
// sequence_ratio_mask (integer or float); stable_reinforce
// target_tokens, advantages and the datum's provenance (logprobs
// accepted, unused).
// loss_fn_config: lo, hi = clip_low_threshold, clip_high_threshold (ppo:
// 0.8 and 1.2 when absent, cispo: 0 and 4; gspo: required), dro's beta
// (required),
// stable_reinforce's kl_coeff (0 when absent).
// losses.h checks and computes them.
const std::vector<std::string>& supported_losses();

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_PROTOCOL_H_
