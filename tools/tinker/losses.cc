#include "tools/tinker/losses.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

torch::Tensor as_tensor(const TensorValue& v) {
  if (v.is_float)
    return torch::from_blob(const_cast<float*>(v.floats.data()),
                            {static_cast<int64_t>(v.floats.size())},
                            torch::kFloat32)
        .clone();
  return torch::from_blob(const_cast<int64_t*>(v.ints.data()),
                          {static_cast<int64_t>(v.ints.size())}, torch::kInt64)
      .clone();
}

// What a loss reads: its loss_fn_inputs and its loss_fn_config keys.
struct LossSpec {
  const char* name;
  std::vector<std::string> needed;    // loss_fn_inputs
  std::vector<std::string> optional;  // loss_fn_inputs
  std::vector<std::string> config;    // loss_fn_config keys
  std::vector<std::string> required;  // of `config`: no documented default
  // Of `config`: documented defaults other than LossConfig's own.
  std::map<std::string, double> defaults = {};
};

const std::vector<LossSpec>& loss_specs() {
  static const std::vector<LossSpec> kSpecs = {
      {"cross_entropy", {"target_tokens"}, {"weights"}, {}, {}},
      {"importance_sampling",
       {"target_tokens", "logprobs", "advantages"},
       {},
       {},
       {}},
      {"ppo",
       {"target_tokens", "logprobs", "advantages"},
       {},
       {"clip_low_threshold", "clip_high_threshold"},
       {}},
      // One-sided by default: the lower bound off, the upper at 4 (the
      // cookbook's tutorials/202_loss_functions.py, "CISPO defaults to a
      // one-sided clip"; docs/design/trainer_server.md, Losses).
      {"cispo",
       {"target_tokens", "logprobs", "advantages"},
       {},
       {"clip_low_threshold", "clip_high_threshold"},
       {},
       {{"clip_low_threshold", 0.0}, {"clip_high_threshold", 4.0}}},
      {"dro",
       {"target_tokens", "logprobs", "advantages"},
       {},
       {"beta"},
       {"beta"}},
      {"gspo",
       {"target_tokens", "logprobs", "advantages", "sequence_ratio_mask"},
       {},
       {"clip_low_threshold", "clip_high_threshold"},
       {"clip_low_threshold", "clip_high_threshold"}},
      // Note [Stability records] in stability.h: q comes from the
      // sampler's records; a client's logprobs are accepted and unused.
      {"stable_reinforce",
       {"target_tokens", "advantages"},
       {"logprobs"},
       {"kl_coeff"},
       {}},
  };
  return kSpecs;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k)
    s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

// stable_reinforce's datums name the sampled sequence behind every
// position: runs that tile the input and the targets (T of each).
void check_provenance(const DatumIn& d, const std::string& at, int64_t t) {
  if (!d.has_provenance)
    throw UsageError(
        at + " has no provenance: stable_reinforce trains on sequences the "
             "sampler recorded. Fix: sample with record_stability_info=True "
             "and attach Datum.with_provenance(model_input=..., "
             "loss_fn_inputs=...) naming each token's sequence_id");
  auto tiles = [&](const std::vector<ProvenanceSpanIn>& spans,
                   const char* field, const char* covers) {
    int64_t total = 0;
    for (const ProvenanceSpanIn& s : spans) total += s.length;
    if (total != t)
      throw UsageError(at + "." + field + " cover " + std::to_string(total) +
                       " positions but " + covers + " has " +
                       std::to_string(t) + "; the runs must tile it exactly");
  };
  tiles(d.input_spans, "model_input_spans", "model_input");
  tiles(d.target_spans, "loss_fn_input_spans",
        "loss_fn_inputs['target_tokens']");
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// The spec of `loss_fn`; UsageError naming the served losses (and, for a
// loss the SDK lists but this server does not compute, why and what to use).
const LossSpec& spec_of(const std::string& loss_fn) {
  for (const LossSpec& s : loss_specs())
    if (loss_fn == s.name) return s;
  if (loss_fn == "custom")
    throw UsageError(
        "loss_fn 'custom' names a loss stored by create_custom_loss, which "
        "this server does not serve (client/config says "
        "custom_loss_server_side: false). Use forward_backward_custom, which "
        "computes the custom loss in the SDK, or one of " +
        joined(supported_losses()));
  throw UsageError("loss_fn '" + loss_fn +
                   "' is not served (this server computes " +
                   joined(supported_losses()) + ")");
}

}  // namespace

LossConfig loss_config(const std::string& loss_fn,
                       const std::map<std::string, double>& loss_fn_config) {
  const LossSpec& spec = spec_of(loss_fn);
  for (const auto& kv : loss_fn_config) {
    if (!contains(spec.config, kv.first))
      throw UsageError(
          "loss_fn_config key '" + kv.first + "' is not used by " + loss_fn +
          (spec.config.empty() ? std::string(" (it takes no config)")
                               : " (it reads " + joined(spec.config) + ")"));
    if (!std::isfinite(kv.second))
      throw UsageError("loss_fn_config['" + kv.first + "'] is not finite");
  }
  for (const std::string& key : spec.required)
    if (!loss_fn_config.count(key))
      throw UsageError(loss_fn + " needs loss_fn_config['" + key +
                       "']: Tinker documents no default for it. Fix: pass "
                       "loss_fn_config={" +
                       [&] {
                         std::string s;
                         for (const std::string& k : spec.required)
                           s += (s.empty() ? "'" : ", '") + k + "': ...";
                         return s;
                       }() +
                       "}");
  LossConfig c;
  auto read = [&](const char* key, double* out) {
    auto it = loss_fn_config.find(key);
    if (it != loss_fn_config.end()) {
      *out = it->second;
    } else if (auto d = spec.defaults.find(key); d != spec.defaults.end()) {
      *out = d->second;
    }
  };
  read("clip_low_threshold", &c.clip_low);
  read("clip_high_threshold", &c.clip_high);
  read("beta", &c.beta);
  read("kl_coeff", &c.kl_coeff);
  if (contains(spec.config, "clip_low_threshold") &&
      !(c.clip_low <= c.clip_high))
    throw UsageError(
        loss_fn + ": clip_low_threshold " + std::to_string(c.clip_low) +
        " must not exceed clip_high_threshold " + std::to_string(c.clip_high));
  if (c.beta < 0)
    throw UsageError("dro: beta " + std::to_string(c.beta) +
                     " must be >= 0 (it weighs a penalty on logp - q)");
  if (c.kl_coeff < 0)
    throw UsageError("stable_reinforce: kl_coeff " +
                     std::to_string(c.kl_coeff) +
                     " must be >= 0 (it weighs a KL penalty towards the "
                     "sampler)");
  return c;
}

std::vector<DatumPlan> plan_forward_backward(const ForwardBackwardIn& in,
                                             const BaseModel& base) {
  const LossSpec& spec = spec_of(in.loss_fn);
  loss_config(in.loss_fn, in.loss_fn_config);
  if (in.data.empty()) throw UsageError("forward_backward with no data");
  const std::vector<std::string>& needed = spec.needed;
  const std::vector<std::string>& optional = spec.optional;
  std::vector<DatumPlan> out;
  for (size_t i = 0; i < in.data.size(); ++i) {
    const DatumIn& d = in.data[i];
    const std::string at = "data[" + std::to_string(i) + "]";
    const int64_t t = static_cast<int64_t>(d.tokens.size());
    if (t < 1) throw UsageError(at + ".model_input has no tokens");
    if (t > base.max_context)
      throw UsageError(at + ".model_input has " + std::to_string(t) +
                       " tokens; " + base.name + " takes at most " +
                       std::to_string(base.max_context));
    auto check_ids = [&](const std::vector<int64_t>& ids,
                         const std::string& what) {
      for (size_t k = 0; k < ids.size(); ++k)
        if (ids[k] < 0 || ids[k] >= base.vocab_size)
          throw UsageError(at + "." + what + "[" + std::to_string(k) +
                           "] = " + std::to_string(ids[k]) +
                           " is outside the vocabulary [0, " +
                           std::to_string(base.vocab_size) + ") of " +
                           base.name);
    };
    check_ids(d.tokens, "model_input");
    for (const auto& kv : d.inputs) {
      const bool known =
          std::find(needed.begin(), needed.end(), kv.first) != needed.end() ||
          std::find(optional.begin(), optional.end(), kv.first) !=
              optional.end();
      if (!known)
        throw UsageError(at + ".loss_fn_inputs['" + kv.first +
                         "'] is not read "
                         "by " +
                         in.loss_fn);
    }
    DatumPlan p;
    p.tokens = torch::from_blob(const_cast<int64_t*>(d.tokens.data()), {1, t},
                                torch::kInt64)
                   .clone();
    for (const std::string& key : needed)
      if (!d.inputs.count(key))
        throw UsageError(at + ".loss_fn_inputs lacks '" + key + "', which " +
                         in.loss_fn + " needs");
    // cross_entropy's target_tokens and weights may carry K values per
    // position ([T, K]: distillation's soft targets); both the same shape.
    const bool soft = in.loss_fn == "cross_entropy" &&
                      d.inputs.at("target_tokens").shape.size() == 2;
    const std::vector<int64_t> row_shape =
        soft ? d.inputs.at("target_tokens").shape : std::vector<int64_t>{t};
    for (const auto& kv : d.inputs) {
      const TensorValue& v = kv.second;
      const std::string where = at + ".loss_fn_inputs['" + kv.first + "']";
      const bool per_target = kv.first == "target_tokens" ||
                              (in.loss_fn == "cross_entropy" &&
                               kv.first == "weights");
      const bool shape_ok =
          per_target ? (v.shape == row_shape && v.shape[0] == t &&
                        (v.shape.size() == 1 || v.shape[1] >= 1))
                     : v.shape == std::vector<int64_t>{t};
      if (!shape_ok)
        throw UsageError(
            where + " has shape " + shape_text(v.shape) + "; it must be [" +
            std::to_string(t) + "], one entry per input token" +
            (in.loss_fn == "cross_entropy"
                 ? std::string(" (or target_tokens and weights both [") +
                       std::to_string(t) + ", K], K >= 1 targets each)"
                 : std::string()));
      const bool want_int = kv.first == "target_tokens";
      // A mask may come as integers or floats (numpy's bool/int arrays).
      if (want_int == v.is_float && kv.first != "sequence_ratio_mask")
        throw UsageError(where + " must be " +
                         (want_int ? "an integer tensor (int64)" : "float32"));
      if (v.is_float)
        for (float f : v.floats)
          if (!std::isfinite(f))
            throw UsageError(where + " holds a non-finite value");
    }
    check_ids(d.inputs.at("target_tokens").ints,
              "loss_fn_inputs['target_tokens']");
    p.targets = as_tensor(d.inputs.at("target_tokens")).view(row_shape);
    if (in.loss_fn == "cross_entropy") {
      p.weights =
          d.inputs.count("weights")
              ? as_tensor(d.inputs.at("weights")).view(row_shape)
              : torch::ones(row_shape, torch::kFloat32);
    } else if (in.loss_fn == "stable_reinforce") {
      p.adv = as_tensor(d.inputs.at("advantages"));
      check_provenance(d, at, t);
    } else {
      p.q = as_tensor(d.inputs.at("logprobs"));
      p.adv = as_tensor(d.inputs.at("advantages"));
    }
    if (d.inputs.count("sequence_ratio_mask")) {
      p.ratio_mask =
          as_tensor(d.inputs.at("sequence_ratio_mask")).to(torch::kFloat32);
      if (!p.ratio_mask.ne(0).any().item<bool>())
        throw UsageError(at +
                         ".loss_fn_inputs['sequence_ratio_mask'] marks no "
                         "token: gspo's sequence ratio is a mean over the "
                         "marked tokens. Fix: mark the sampled tokens "
                         "(nonzero)");
    }
    out.push_back(std::move(p));
  }
  return out;
}

torch::Tensor target_logprobs(const torch::Tensor& logits,
                              const torch::Tensor& targets) {
  const torch::Tensor lp = torch::log_softmax(logits, -1);
  if (targets.dim() == 2) return lp.gather(1, targets);
  return lp.gather(1, targets.unsqueeze(1)).squeeze(1);
}

torch::Tensor elementwise_loss(const std::string& loss_fn,
                               const torch::Tensor& logprobs,
                               const DatumPlan& datum,
                               const LossConfig& config) {
  const torch::Tensor& a = datum.adv;
  if (loss_fn == "cross_entropy") return -(logprobs * datum.weights);
  if (loss_fn == "stable_reinforce") {
    // Note [stable_reinforce] in stability.h: at a sampled position, the
    // REINFORCE term weighted by the truncated ratio sg(min(r, 1)) to the
    // sampler's recorded probability, plus kl_coeff times k3 = (r - 1) -
    // log r; a prompt position (q NaN, advantage 0) adds nothing.
    const torch::Tensor sampled = datum.q.isnan().logical_not();
    const torch::Tensor q = torch::where(sampled, datum.q, logprobs.detach());
    const torch::Tensor log_r = logprobs - q;
    const torch::Tensor r = torch::exp(log_r);
    const torch::Tensor w = torch::clamp_max(r.detach(), 1.0);
    torch::Tensor loss = -(w * a * logprobs);
    if (config.kl_coeff > 0) loss = loss + config.kl_coeff * ((r - 1) - log_r);
    return torch::where(sampled, loss, torch::zeros_like(loss));
  }
  if (loss_fn == "dro") {
    const torch::Tensor d = logprobs - datum.q;
    return -(logprobs * a - 0.5 * config.beta * d * d);
  }
  torch::Tensor ratio;
  if (loss_fn == "gspo") {
    // GSPO-token: every token's ratio has the sequence ratio's value (the
    // geometric mean of the marked tokens' ratios) and the gradient of its
    // own log-probability.
    const torch::Tensor fixed = logprobs.detach();
    const torch::Tensor in_ratio = datum.ratio_mask.ne(0);
    const torch::Tensor log_ratio =
        (fixed - datum.q).masked_select(in_ratio).mean();
    ratio = torch::exp(log_ratio + logprobs - fixed);
  } else {
    ratio = torch::exp(logprobs - datum.q);
  }
  if (loss_fn == "importance_sampling") return -(ratio * a);
  const torch::Tensor clipped =
      torch::clamp(ratio, config.clip_low, config.clip_high);
  if (loss_fn == "cispo") return -(clipped.detach() * logprobs * a);
  if (loss_fn == "ppo" || loss_fn == "gspo")
    return -torch::min(ratio * a, clipped * a);
  throw InternalError("elementwise_loss: unplanned loss_fn '" + loss_fn + "'");
}

}  // namespace tinker
}  // namespace zerostep
