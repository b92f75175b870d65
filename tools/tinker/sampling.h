// SamplerStore: the sampling side of the trainer server — sampler weights,
// sampling sessions and the sample requests (asample; the SDK's
// compute_logprobs is a sample request with prompt_logprobs and
// max_tokens = 1).
//
// Weights: a sampler is a snapshot, a decoder (base plus LoRA) whose
// parameters are copied from a training model's at save_weights_for_sampler
// time, so later training never changes what a sampling client sees (the
// SDK's "snapshot" contract; an "inflight" save is served as a snapshot,
// which its contract allows: the weights saved when the client was made).
//   - save_weights_for_sampler(name): the snapshot is also written to
//     <state_dir>/tenants/<tenant>/<model folder>/sampler_weights/<name>/
//     (weights.pt and tinker_meta.json; tenancy.h) and named
//     tinker://<model id>/sampler_weights/<name>, so
//     create_sampling_client(model_path=...) finds it after a restart. The
//     caller's max_bytes is checked first (sampler_bytes_bound).
//   - save_weights_and_get_sampling_client(): the snapshot only lives in
//     memory, in the sampling session "<model id>:sample:<n>".
//   - create_sampling_session(model_path | base_model): a session over a
//     saved snapshot, or over a base model's initial weights.
//
// Ranks: every rank executes save_weights_for_sampler, because gathering
// the full parameters is a collective at ZeRO stage 3
// (Engine::full_parameters); only rank 0 keeps the snapshot. Sessions and
// sampling live on rank 0 alone and run no collective (the other ranks
// execute those commands as no-ops; Note [One command stream] in
// command.h), on the snapshot, never on the partitioned training model.
//
// Sampling itself is models/sampler.h: batched over num_samples, KV cache,
// seeded (Note [Sampled logprobs] there says which logprobs are returned).
// A request without sampling_params.seed gets one derived from its
// sampling session id and seq_id, so a retried request repeats itself.
//
// Note [Prompt and top-k logprobs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The SDK's (0.38.0) SampleRequest fields beyond prompt_logprobs, each
// computed from one full forward (TinyGptImpl::forward, no cache) of the
// tokens concerned, log_softmax of the raw logits (as Note [Sampled
// logprobs]), so each equals a full forward's log-softmax bit for bit
// (sampling_test):
//   - topk_prompt_logprobs = k: SampleResponse.topk_prompt_logprobs, a
//     [len(prompt), k] TopkLogprobs; row p holds the k most likely tokens
//     at prompt position p (row 0, and the rows before
//     prompt_logprobs_last_n when given, empty: token 0, logprob -99999).
//   - topk_sample_logprobs = k: each sequence's topk_sampled_logprobs, one
//     row per sampled token (a forward over the prompt and the sample).
//   - target_prompt_logprobs: an int64 [len(prompt) - 1, K] tensor, dense
//     or CSR; the response's float32 tensor of the same shape and layout
//     holds, at [i, j], the logprob of id [i, j] at prompt position i + 1,
//     0.0 where the id is -1 (nothing asked).
//   - prompt_alt_tokens_k = k: k draws with replacement at every prompt
//     position after the first, from softmax(logits / temperature)
//     (temperature 0: the argmax; top_k and top_p do not apply), seeded
//     from the request's seed; two [len(prompt) - 1, k] tensors, the ids
//     (int64) and their logprobs under the model.
// Top-k rows are sorted by logprob, descending, ties by lower token id. k
// must be in [0, vocabulary size], and len(prompt) times k (or the number
// of distinct target ids) at most kMaxLogprobCells.
//
// record_stability_info: every sequence of the request is recorded
// (Note [Stability records] in stability.h) under its sequence id
// "<request id>:<i>", which the Service puts in the command
// ("zerostep_request_id") and in the asample promise.
//
// Tenants: every path is located in the caller's folder (Note [One tenant
// check] in tenancy.h), so another tenant's sampler weights read as
// missing; sampling sessions are checked by the Service before a command
// names one.
//
// Thread safety: one rank's thread only.
#ifndef ZEROSTEP_TOOLS_TINKER_SAMPLING_H_
#define ZEROSTEP_TOOLS_TINKER_SAMPLING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/sampler.h"
#include "tools/tinker/model_registry.h"
#include "tools/tinker/stability.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

// The most logprobs one request may ask for beyond the sampled tokens'
// (Note [Prompt and top-k logprobs]).
inline constexpr int64_t kMaxLogprobCells = int64_t{1} << 20;

// A [rows, cols] int64 tensor of the SDK's JSON TensorData, dense or CSR.
struct IdTable {
  int64_t rows = 0, cols = 0;
  bool sparse = false;
  std::vector<int64_t> values;  // dense: rows * cols; CSR: the listed cells
  std::vector<int64_t> crow;    // CSR: rows + 1 row pointers
  std::vector<int64_t> col;     // CSR: one column per value
};

// A SampleRequest's fields, checked.
struct SampleRequestIn {
  std::vector<int64_t> prompt;
  int64_t num_samples = 1;
  SamplingOptions options;
  // false: sampling_params.max_tokens was absent or null, and generation
  // may run to the end of the model's context.
  bool max_tokens_given = false;
  // When prompt logprobs are asked for with prompt_logprobs_last_n: only
  // the last n are scored, the rest NaN (0: all).
  int64_t prompt_logprobs_last_n = 0;
  // Note [Prompt and top-k logprobs]; 0 / false / nullopt: not asked.
  int64_t topk_prompt = 0;
  int64_t topk_sample = 0;
  int64_t alt_tokens_k = 0;
  std::optional<IdTable> target_prompt;
  bool record_stability_info = false;
};

// What a request returns beyond models/sampler.h's SampleOutput (Note
// [Prompt and top-k logprobs]).
struct TopkRows {
  int64_t length = 0, k = 0;
  std::vector<int32_t> ids;      // length * k, row-major
  std::vector<float> logprobs;   // length * k
};
struct SampleExtras {
  std::optional<TopkRows> topk_prompt;
  std::vector<TopkRows> topk_sample;  // per sequence, when asked
  std::optional<IdTable> target_ids;  // the request's, for the layout
  std::vector<float> target_logprobs;  // one per value of target_ids
  int64_t alt_k = 0;
  std::vector<int64_t> alt_tokens;  // (len(prompt) - 1) * alt_k
  std::vector<float> alt_logprobs;
};

// Reads a SampleRequest JSON body (the SDK's field names). UsageError
// naming the field, its value and the rule for a missing or malformed
// prompt, a non-text chunk, a bad stop, a null/NaN/inf number, a negative
// top-k or prompt_alt_tokens_k, or a target_prompt_logprobs that is not an
// int64 [len(prompt) - 1, K] tensor (dense or consistent CSR) naming at
// least one id. Values are range-checked later, against the model
// (validate_sampling, check_logprob_requests). `default_seed` is used when
// sampling_params.seed is absent or null.
SampleRequestIn parse_sample_request(const nlohmann::json& args,
                                     uint64_t default_seed);

// Checks the request's top-k widths and target ids against a vocabulary
// of `vocab` tokens (Note [Prompt and top-k logprobs]). UsageError naming
// the field, the value and the bound.
void check_logprob_requests(const SampleRequestIn& in, int64_t vocab);

// The extras `in` asks for, of `out` sampled from `net` (Note [Prompt and
// top-k logprobs]); empty when none is asked.
SampleExtras compute_sample_extras(CausalLm& net, const SampleRequestIn& in,
                                   const SampleOutput& out);

// A serialized tinker_public.SampleResponse.
std::string encode_sample_response(const SampleOutput& out,
                                   const SampleExtras& extras = {});

// An upper bound on the bytes save_weights_for_sampler writes for `m`:
// torch::save of every parameter (float32) with its archive entry, and
// tinker_meta.json. trainer_test checks it against real files.
uint64_t sampler_bytes_bound(Model& m);

class SamplerStore {
 public:
  // `*comm` must outlive the store.
  SamplerStore(Communicator* comm, std::string state_dir);

  // save_weights_for_sampler, on every rank (a collective): snapshots model
  // args.model_id. With args.path (a name): saves it as sampler weights and
  // returns {"path"}; with args.sampling_session_seq_id: opens the session
  // "<model id>:sample:<n>" and returns {"sampling_session_id"}.
  // UsageError on every rank, before the gather, for an unknown model, a
  // bad or existing name, or neither field.
  nlohmann::json save_for_sampler(ModelRegistry& models, const Caller& caller,
                                  const nlohmann::json& args);

  // Rank 0 only. create_sampling_session {session_id,
  // sampling_session_seq_id, model_path?, base_model?}: the session
  // "<session_id>:sample:<seq>". UsageError for an unknown path or base
  // model, a base_model that differs from the path's, or neither given.
  nlohmann::json create_session(ModelRegistry& models, const Caller& caller,
                                const nlohmann::json& args);
  // Rank 0 only. GET samplers/<id>: {sampler_id, base_model, model_path?}.
  nlohmann::json get_sampler(const nlohmann::json& args);
  // Rank 0 only. asample: a serialized SampleResponse. UsageError for an
  // unknown session or any bad field (nothing else happens).
  std::string sample(ModelRegistry& models, const Caller& caller,
                     const nlohmann::json& args);
  // Rank 0 only. Drops the in-memory copy of the caller's sampler weights
  // `path` (after a delete); sessions opened over them keep them.
  void forget(const Caller& caller, const std::string& path);

  // Rank 0's records of the sequences sampled with record_stability_info.
  StabilityRecords& stability() { return stability_; }

 private:
  // A base model's token texts (models/token_text.h): a preset's bytes, a
  // folder's tokenizer.json; `problem` says why a folder's cannot be read.
  struct TokenTable {
    std::vector<std::string> bytes;
    std::string problem;
  };
  struct Sampler {
    Net net;
    std::shared_ptr<const TokenTable> text;
    std::string base_model;
    std::string model_path;  // empty: a base model or an unnamed snapshot
    std::optional<int64_t> expires_at;  // named weights' TTL (retention.h)
  };

  bool agree(bool mine);
  // `base`'s table, read once (rank 0).
  std::shared_ptr<const TokenTable> token_text(const BaseModel& base);
  // The caller's sampler weights `path` names, loaded from disk if need
  // be; UsageError for one that is not the caller's.
  std::shared_ptr<Sampler> by_path(const Caller& caller,
                                   const std::string& path);
  std::shared_ptr<Sampler> by_base(ModelRegistry& models,
                                   const std::string& base_model);
  std::shared_ptr<Sampler> session(const std::string& id) const;

  Communicator* comm_;
  std::string state_dir_;
  // By folder (unique per tenant and path).
  std::map<std::string, std::shared_ptr<Sampler>> paths_;     // rank 0
  std::map<std::string, std::shared_ptr<Sampler>> sessions_;  // rank 0
  std::map<std::string, std::shared_ptr<Sampler>> bases_;     // rank 0
  std::map<std::string, std::shared_ptr<const TokenTable>> token_texts_;
  StabilityRecords stability_;                                 // rank 0
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_SAMPLING_H_
