#include "tools/tinker/losses.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

std::vector<DatumPlan> plan_forward_backward(const ForwardBackwardIn& in,
                                             const BaseModel& base) {
  const auto& losses = supported_losses();
  if (std::find(losses.begin(), losses.end(), in.loss_fn) == losses.end()) {
    std::string names;
    for (const auto& l : losses) names += (names.empty() ? "" : ", ") + l;
    throw UsageError("loss_fn '" + in.loss_fn +
                     "' is not served (this "
                     "server computes " +
                     names + ")");
  }
  for (const auto& kv : in.loss_fn_config) {
    const bool known =
        in.loss_fn == "ppo" &&
        (kv.first == "clip_low_threshold" || kv.first == "clip_high_threshold");
    if (!known)
      throw UsageError("loss_fn_config key '" + kv.first + "' is not used by " +
                       in.loss_fn +
                       (in.loss_fn == "ppo" ? " (it reads clip_low_threshold, "
                                              "clip_high_threshold)"
                                            : " (it takes no config)"));
    if (!std::isfinite(kv.second))
      throw UsageError("loss_fn_config['" + kv.first + "'] is not finite");
  }
  if (in.data.empty()) throw UsageError("forward_backward with no data");
  std::vector<std::string> needed = {"target_tokens"};
  std::vector<std::string> optional;
  if (in.loss_fn == "cross_entropy") {
    optional = {"weights"};
  } else {
    needed.push_back("logprobs");
    needed.push_back("advantages");
  }
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
    for (const auto& kv : d.inputs) {
      const TensorValue& v = kv.second;
      const std::string where = at + ".loss_fn_inputs['" + kv.first + "']";
      if (v.shape.size() != 1 || v.shape[0] != t)
        throw UsageError(where + " has shape [" +
                         [&] {
                           std::string s;
                           for (size_t k = 0; k < v.shape.size(); ++k)
                             s += (k ? ", " : "") + std::to_string(v.shape[k]);
                           return s;
                         }() +
                         "]; it must be [" + std::to_string(t) +
                         "], one entry per input token");
      const bool want_int = kv.first == "target_tokens";
      if (want_int == v.is_float)
        throw UsageError(where + " must be " +
                         (want_int ? "an integer tensor (int64)" : "float32"));
      if (!want_int)
        for (float f : v.floats)
          if (!std::isfinite(f))
            throw UsageError(where + " holds a non-finite value");
    }
    check_ids(d.inputs.at("target_tokens").ints,
              "loss_fn_inputs['target_tokens']");
    p.targets = as_tensor(d.inputs.at("target_tokens"));
    if (in.loss_fn == "cross_entropy") {
      p.weights = d.inputs.count("weights") ? as_tensor(d.inputs.at("weights"))
                                            : torch::ones({t}, torch::kFloat32);
    } else {
      p.q = as_tensor(d.inputs.at("logprobs"));
      p.adv = as_tensor(d.inputs.at("advantages"));
    }
    out.push_back(std::move(p));
  }
  if (in.loss_fn == "ppo") {
    const PpoClip clip = ppo_clip(in.loss_fn_config);
    if (!(clip.low <= clip.high))
      throw UsageError("ppo: clip_low_threshold " + std::to_string(clip.low) +
                       " must not exceed clip_high_threshold " +
                       std::to_string(clip.high));
  }
  return out;
}

PpoClip ppo_clip(const std::map<std::string, double>& loss_fn_config) {
  PpoClip clip;
  if (loss_fn_config.count("clip_low_threshold"))
    clip.low = loss_fn_config.at("clip_low_threshold");
  if (loss_fn_config.count("clip_high_threshold"))
    clip.high = loss_fn_config.at("clip_high_threshold");
  return clip;
}

torch::Tensor target_logprobs(const torch::Tensor& logits,
                              const torch::Tensor& targets) {
  return torch::log_softmax(logits, -1)
      .gather(1, targets.unsqueeze(1))
      .squeeze(1);
}

torch::Tensor elementwise_loss(const std::string& loss_fn,
                               const torch::Tensor& logprobs,
                               const DatumPlan& datum, const PpoClip& clip) {
  if (loss_fn == "cross_entropy") return -(logprobs * datum.weights);
  torch::Tensor ratio = torch::exp(logprobs - datum.q);
  if (loss_fn == "importance_sampling") return -(ratio * datum.adv);
  torch::Tensor clipped = torch::clamp(ratio, clip.low, clip.high);
  return -torch::min(ratio * datum.adv, clipped * datum.adv);
}

}  // namespace tinker
}  // namespace zerostep
