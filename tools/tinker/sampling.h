// SamplerStore: the sampling side of the trainer server — sampler weights,
// sampling sessions and the sample requests (asample; the SDK's
// compute_logprobs is a sample request with prompt_logprobs and
// max_tokens = 1).
//
// Weights: a sampler is a snapshot, a TinyGpt (base plus LoRA) whose
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
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "models/sampler.h"
#include "tools/tinker/model_registry.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

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
};

// Reads a SampleRequest JSON body (the SDK's field names). UsageError
// naming the field, its value and the rule for a missing or malformed
// prompt, a non-text chunk, a bad stop, a null/NaN/inf number, or a
// feature this server does not serve (top-k logprobs, target prompt
// logprobs, prompt alternatives, stability info). Values are range-checked
// later, against the model (validate_sampling). `default_seed` is used when
// sampling_params.seed is absent or null.
SampleRequestIn parse_sample_request(const nlohmann::json& args,
                                     uint64_t default_seed);

// A serialized tinker_public.SampleResponse.
std::string encode_sample_response(const SampleOutput& out);

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

 private:
  struct Sampler {
    TinyGpt net{nullptr};
    std::string base_model;
    std::string model_path;  // empty: a base model or an unnamed snapshot
  };

  bool agree(bool mine);
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
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_SAMPLING_H_
