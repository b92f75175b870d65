// Stability records: what the sampler keeps of every sequence sampled with
// record_stability_info, and how a stable_reinforce datum's provenance is
// resolved against them. Torch-free.
//
// Note [Stability records]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// Tinker's StableReinforce page (tinker-docs.thinkingmachines.ai, losses/
// stable-reinforce) and the SDK (0.38.0: SampleRequest.record_stability_info,
// SampledSequence.sequence_id, Datum.with_provenance) define the contract:
//   - a sampling client made with record_stability_info=True records every
//     sequence it samples; each returned sequence carries a sequence_id
//     (here "<request id>:<i>", fixed when the request is accepted);
//   - a training datum names, run by run, the sequence behind each of its
//     input and target positions (PromptProvenanceSpan: positions of that
//     request's prompt; SampledProvenanceSpan: of its sampled tokens);
//   - recorded sequences belong to the session that sampled them and can
//     be trained on for one day after sampling; each training request that
//     uses a sequence restarts that day.
// What is recorded is the server's to choose ("minimal additional
// information captured at sampling time"); here, per sequence: the
// prompt, the sampled tokens and the sampler's float32 logprob of each
// sampled token (Note [Sampled logprobs] in models/sampler.h), on rank 0.
// A datum's runs are checked against the record (a model_input run must
// repeat the recorded tokens; a sampled target run must name the recorded
// sampled tokens; a prompt target run only its range, since clients put
// placeholder targets there) and yield q: the recorded logprob at each
// sampled target position, NaN at prompt positions, whose advantage must
// be 0 (nothing was sampled there). A sequence of another session or
// tenant, an expired one and one never recorded are answered alike.
//
// Note [stable_reinforce]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Tinker publishes the contract above but not the objective (neither the
// SDK 0.38.0 nor the cookbook 0.6.1 contains it), so zerostep defines it,
// from published pieces, per sampled target position t with learner
// logprob logp_t, recorded sampler logprob q_t, advantage A_t and
// r_t = exp(logp_t - q_t):
//   loss_t = -sg(min(r_t, 1)) * A_t * logp_t
//            + kl_coeff * ((r_t - 1) - log r_t)
// The first term is REINFORCE (Williams, 1992) with the importance weight
// truncated at 1, V-trace's rho-bar (Espeholt et al., 2018, IMPALA): on
// policy (r = 1) it is importance_sampling's gradient; off policy a token
// the learner now favours more than the sampler did is not pushed further
// than on-policy, and one it disfavours is down-weighted. q_t is the
// sampler's own record, so a client cannot misalign it. The second is the
// k3 estimator of KL(sampler || learner) (Schulman, 2020, "Approximating
// KL divergence"), weighted by loss_fn_config kl_coeff (named by the SDK's
// ForwardBackwardInput docstring; default 0: off).
//
// Thread safety: not synchronized (rank 0's command thread only).
#ifndef ZEROSTEP_TOOLS_TINKER_STABILITY_H_
#define ZEROSTEP_TOOLS_TINKER_STABILITY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tools/tinker/protocol.h"

namespace zerostep {
namespace tinker {

// How long a recorded sequence stays trainable after sampling or after the
// last training request that used it (Tinker: one day).
inline constexpr double kStabilityTtlS = 24 * 3600.0;

// The session an id belongs to: a session id itself, the session of a
// model id "<session>:train:<n>" or of a sampling session id
// "<owner>:sample:<n>" (recursively); an id with no session part (a model
// "model-<instance>-<n>" made without one) is its own.
std::string session_of(const std::string& id);

struct StabilityRecord {
  std::string tenant;
  std::string session;  // session_of(the sampling session)
  std::vector<int64_t> prompt;
  std::vector<int64_t> tokens;   // sampled
  std::vector<float> logprobs;   // the sampler's, one per sampled token
};

class StabilityRecords {
 public:
  // `now_s`: a monotonic clock in seconds (default: steady_clock).
  explicit StabilityRecords(std::function<double()> now_s = nullptr,
                            double ttl_s = kStabilityTtlS);

  // Keeps `record` under `sequence_id` for ttl_s (replacing any record of
  // that id: a retried request records the same sequences again).
  void record(const std::string& sequence_id, StabilityRecord record);

  // Datum `index` (for messages) of a stable_reinforce request by
  // `tenant` training in `session`: q for each target position (Note
  // [Stability records]). Its spans' lengths tile the input and targets
  // (plan_forward_backward checked). UsageError naming the datum, the
  // span and the rule for an unknown (or other session's, or expired)
  // sequence, a run outside the sequence, tokens that differ from the
  // record, or a nonzero advantage at a prompt position. Nothing changes
  // on error; on success every sequence named restarts its day.
  std::vector<float> resolve(const std::string& tenant,
                             const std::string& session, const DatumIn& d,
                             size_t index);

  // Drops the records whose day has passed; returns how many are left.
  size_t expire();

 private:
  struct Entry {
    StabilityRecord record;
    double expires_s = 0;
  };
  const Entry* find(const std::string& tenant, const std::string& session,
                    const std::string& id) const;

  std::function<double()> now_s_;
  double ttl_s_;
  std::map<std::string, Entry> entries_;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_STABILITY_H_
