#include "tools/tinker/stability.h"

#include <chrono>
#include <limits>
#include <set>
#include <utility>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

double steady_seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string span_name(const std::string& at, const char* field, size_t k) {
  return at + "." + field + "[" + std::to_string(k) + "]";
}

}  // namespace

std::string session_of(const std::string& id) {
  // Session ids ("session-<instance>-<n>") and model ids made without a
  // session ("model-<instance>-<n>") hold no ':'; everything derived from
  // them appends ":train:<n>" or ":sample:<n>".
  return id.substr(0, id.find(':'));
}

StabilityRecords::StabilityRecords(std::function<double()> now_s,
                                   double ttl_s)
    : now_s_(now_s ? std::move(now_s) : steady_seconds), ttl_s_(ttl_s) {}

void StabilityRecords::record(const std::string& sequence_id,
                              StabilityRecord record) {
  Entry& e = entries_[sequence_id];
  e.record = std::move(record);
  e.expires_s = now_s_() + ttl_s_;
}

const StabilityRecords::Entry* StabilityRecords::find(
    const std::string& tenant, const std::string& session,
    const std::string& id) const {
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.record.tenant != tenant ||
      it->second.record.session != session ||
      it->second.expires_s <= now_s_())
    return nullptr;
  return &it->second;
}

std::vector<float> StabilityRecords::resolve(const std::string& tenant,
                                             const std::string& session,
                                             const DatumIn& d, size_t index) {
  const std::string at = "data[" + std::to_string(index) + "]";
  std::set<std::string> used;
  auto lookup = [&](const ProvenanceSpanIn& s,
                    const std::string& where) -> const StabilityRecord& {
    const Entry* e = find(tenant, session, s.sequence_id);
    if (e == nullptr)
      throw UsageError(
          where + " names sequence_id '" + elide(s.sequence_id, 120) +
          "', which this session has no record of: stable_reinforce trains "
          "on sequences sampled in the same session with "
          "record_stability_info=True, within a day of sampling or of the "
          "last training request that used them");
    used.insert(s.sequence_id);
    const StabilityRecord& r = e->record;
    const std::vector<int64_t>& part = s.sampled ? r.tokens : r.prompt;
    if (s.offset + s.length > static_cast<int64_t>(part.size()))
      throw UsageError(where + " covers " +
                       (s.sampled ? "sampled tokens" : "prompt positions") +
                       " [" + std::to_string(s.offset) + ", " +
                       std::to_string(s.offset + s.length) + ") of sequence '" +
                       elide(s.sequence_id, 120) + "', which has " +
                       std::to_string(part.size()));
    return r;
  };

  // The input runs repeat the recorded tokens.
  int64_t pos = 0;
  for (size_t k = 0; k < d.input_spans.size(); ++k) {
    const ProvenanceSpanIn& s = d.input_spans[k];
    const std::string where = span_name(at, "model_input_spans", k);
    const StabilityRecord& r = lookup(s, where);
    const std::vector<int64_t>& part = s.sampled ? r.tokens : r.prompt;
    for (int64_t j = 0; j < s.length; ++j)
      if (d.tokens[pos + j] != part[s.offset + j])
        throw UsageError(where + ": model_input[" + std::to_string(pos + j) +
                         "] = " + std::to_string(d.tokens[pos + j]) +
                         " but the sequence's " +
                         (s.sampled ? "sampled token " : "prompt token ") +
                         std::to_string(s.offset + j) + " is " +
                         std::to_string(part[s.offset + j]));
    pos += s.length;
  }

  // The target runs: sampled tokens give q; prompt positions give NaN.
  const std::vector<int64_t>& targets = d.inputs.at("target_tokens").ints;
  const std::vector<float>& adv = d.inputs.at("advantages").floats;
  std::vector<float> q(targets.size(), std::numeric_limits<float>::quiet_NaN());
  pos = 0;
  for (size_t k = 0; k < d.target_spans.size(); ++k) {
    const ProvenanceSpanIn& s = d.target_spans[k];
    const std::string where = span_name(at, "loss_fn_input_spans", k);
    const StabilityRecord& r = lookup(s, where);
    for (int64_t j = 0; j < s.length; ++j) {
      const int64_t t = pos + j;
      if (!s.sampled) {
        if (adv[t] != 0.0f)
          throw UsageError(
              at + ".loss_fn_inputs['advantages'][" + std::to_string(t) +
              "] = " + std::to_string(adv[t]) + " at a prompt position (" +
              where + "): stable_reinforce trains on sampled tokens only. "
              "Fix: advantage 0 at prompt positions");
        continue;
      }
      if (targets[t] != r.tokens[s.offset + j])
        throw UsageError(where + ": loss_fn_inputs['target_tokens'][" +
                         std::to_string(t) + "] = " +
                         std::to_string(targets[t]) +
                         " but the sequence's sampled token " +
                         std::to_string(s.offset + j) + " is " +
                         std::to_string(r.tokens[s.offset + j]));
      q[t] = r.logprobs[s.offset + j];
    }
    pos += s.length;
  }
  const double until = now_s_() + ttl_s_;
  for (const std::string& id : used) entries_.at(id).expires_s = until;
  return q;
}

size_t StabilityRecords::expire() {
  const double now = now_s_();
  for (auto it = entries_.begin(); it != entries_.end();)
    it = it->second.expires_s <= now ? entries_.erase(it) : std::next(it);
  return entries_.size();
}

}  // namespace tinker
}  // namespace zerostep
