#include "tools/tinker/sampling.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>

#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "tools/tinker/checkpoint_paths.h"
#include "tools/tinker/command.h"
#include "tools/tinker/request_fields.h"
#include "tools/tinker/tinker_public.pb.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

// A copy of `m`'s current weights, base plus LoRA, on rank 0 (`keep`); an
// empty holder elsewhere. Every rank must call it: the trainable
// parameters are gathered with Engine::full_parameters() (a collective at
// stage 3, where each rank holds a partition); the frozen base weights are
// whole on every rank (the engine does not own them).
TinyGpt snapshot_of(Model& m, uint64_t seed, bool keep) {
  torch::Tensor full = m.engine->full_parameters();
  if (!keep) return TinyGpt(nullptr);
  TinyGpt copy = new_tiny_gpt(m.base, m.lora, seed);
  torch::NoGradGuard no_grad;
  auto dst = copy->named_parameters();
  int64_t offset = 0;
  for (const auto& item : m.net->named_parameters()) {
    torch::Tensor d = dst[item.key()];
    if (item.value().requires_grad()) {
      d.copy_(full.narrow(0, offset, d.numel()).view_as(d));
      offset += d.numel();
    } else {
      d.copy_(item.value());
    }
  }
  ZS_CHECK(offset == full.numel());
  for (torch::Tensor& p : copy->parameters()) p.set_requires_grad(false);
  return copy;
}

std::vector<int64_t> bytes_of(const std::string& s) {
  std::vector<int64_t> out;
  for (unsigned char c : s) out.push_back(c);
  return out;
}

// stop: null/absent (none), a string, a list of strings (each its UTF-8
// bytes: the models are byte-level), or a list of token ids (each a stop
// token of its own).
std::vector<std::vector<int64_t>> parse_stop(const json& params) {
  std::vector<std::vector<int64_t>> out;
  if (!params.contains("stop") || params["stop"].is_null()) return out;
  const json& stop = params["stop"];
  if (stop.is_string()) {
    out.push_back(bytes_of(stop.get<std::string>()));
    return out;
  }
  const std::string rule =
      "sampling_params.stop must be a string, a list of strings or a list "
      "of token ids (not a mix)";
  if (!stop.is_array())
    throw UsageError(rule + "; got " + elide(stop.dump(), 80));
  bool strings = false, ints = false;
  for (const json& s : stop) {
    if (s.is_string()) {
      strings = true;
      out.push_back(bytes_of(s.get<std::string>()));
    } else if (is_int64(s)) {
      ints = true;
      out.push_back({s.get<int64_t>()});
    } else {
      throw UsageError(rule + "; got an element " + elide(s.dump(), 80));
    }
  }
  if (strings && ints) throw UsageError(rule + "; got a mix");
  return out;
}

void reject_if(bool unserved, const std::string& field) {
  if (unserved)
    throw UsageError(field +
                     " is not served by this server (it returns tokens, "
                     "their logprobs and prompt_logprobs). Fix: leave it "
                     "unset");
}

}  // namespace

SampleRequestIn parse_sample_request(const json& a, uint64_t default_seed) {
  SampleRequestIn in;
  if (!a.contains("prompt") || !a["prompt"].is_object() ||
      !a["prompt"].contains("chunks") || !a["prompt"]["chunks"].is_array())
    throw UsageError(
        "missing field 'prompt' (a ModelInput: {\"chunks\": [...]})");
  const json& chunks = a["prompt"]["chunks"];
  for (size_t i = 0; i < chunks.size(); ++i) {
    const json& c = chunks[i];
    const std::string type = get_or<std::string>(c, "type", "encoded_text");
    if (type != "encoded_text" || !c.contains("tokens") ||
        !c["tokens"].is_array())
      throw UsageError("prompt chunk " + std::to_string(i) + " has type '" +
                       type +
                       "': this server samples from token chunks "
                       "(encoded_text) only");
    for (const json& t : c["tokens"]) {
      if (!is_int64(t))
        throw UsageError(
            "prompt chunk " + std::to_string(i) +
            " holds a token that is not an integer: " + elide(t.dump(), 40));
      in.prompt.push_back(t.get<int64_t>());
    }
  }
  in.num_samples = get_or<int64_t>(a, "num_samples", 1);
  const json params =
      a.contains("sampling_params") ? a["sampling_params"] : json::object();
  if (!params.is_object())
    throw UsageError("field 'sampling_params' must be an object");
  SamplingOptions& o = in.options;
  // max_tokens is optional in the SDK; without it, the rest of the context
  // (resolved against the model by SamplerStore::sample).
  in.max_tokens_given =
      params.contains("max_tokens") && !params["max_tokens"].is_null();
  if (in.max_tokens_given)
    o.max_tokens = get_or<int64_t>(params, "max_tokens", 0, "sampling_params.");
  o.temperature =
      get_or<double>(params, "temperature", 1.0, "sampling_params.");
  o.top_k = get_or<int64_t>(params, "top_k", -1, "sampling_params.");
  o.top_p = get_or<double>(params, "top_p", 1.0, "sampling_params.");
  o.seed = params.contains("seed") && !params["seed"].is_null()
               ? get_or<uint64_t>(params, "seed", 0, "sampling_params.")
               : default_seed;
  o.stop = parse_stop(params);
  o.prompt_logprobs = get_or<bool>(a, "prompt_logprobs", false);
  if (a.contains("prompt_logprobs_last_n") &&
      !a["prompt_logprobs_last_n"].is_null()) {
    in.prompt_logprobs_last_n = get_or<int64_t>(a, "prompt_logprobs_last_n", 0);
    const int64_t n = static_cast<int64_t>(in.prompt.size());
    if (!o.prompt_logprobs)
      throw UsageError("prompt_logprobs_last_n needs prompt_logprobs = true");
    if (in.prompt_logprobs_last_n < 1 || in.prompt_logprobs_last_n > n - 1)
      throw UsageError(
          "prompt_logprobs_last_n = " +
          std::to_string(in.prompt_logprobs_last_n) +
          " must be in [1, len(prompt) - 1 = " + std::to_string(n - 1) + "]");
  }
  reject_if(get_or<int64_t>(a, "topk_prompt_logprobs", 0) != 0,
            "topk_prompt_logprobs");
  reject_if(get_or<int64_t>(a, "topk_sample_logprobs", 0) != 0,
            "topk_sample_logprobs");
  reject_if(get_or<int64_t>(a, "prompt_alt_tokens_k", 0) != 0,
            "prompt_alt_tokens_k");
  reject_if(a.contains("target_prompt_logprobs") &&
                !a["target_prompt_logprobs"].is_null(),
            "target_prompt_logprobs");
  reject_if(get_or<bool>(a, "record_stability_info", false),
            "record_stability_info");
  return in;
}

std::string encode_sample_response(const SampleOutput& out) {
  tinker_public::SampleResponse r;
  for (const SampledSequence& s : out.sequences) {
    tinker_public::SampledSequence* q = r.add_sequences();
    q->set_stop_reason(s.stopped ? tinker_public::STOP_REASON_STOP
                                 : tinker_public::STOP_REASON_LENGTH);
    std::vector<int32_t> tokens(s.tokens.begin(), s.tokens.end());
    q->set_tokens(std::string(reinterpret_cast<const char*>(tokens.data()),
                              tokens.size() * sizeof(int32_t)));
    q->set_logprobs(
        std::string(reinterpret_cast<const char*>(s.logprobs.data()),
                    s.logprobs.size() * sizeof(float)));
  }
  if (!out.prompt_logprobs.empty())
    r.set_prompt_logprobs(
        std::string(reinterpret_cast<const char*>(out.prompt_logprobs.data()),
                    out.prompt_logprobs.size() * sizeof(float)));
  return r.SerializeAsString();
}

SamplerStore::SamplerStore(Communicator* comm, std::string state_dir)
    : comm_(comm), state_dir_(std::move(state_dir)) {}

bool SamplerStore::agree(bool mine) {
  int64_t v = mine ? 1 : 0;
  comm_->broadcast(Buffer::of(&v, 1), {0, phase::kSetup});
  return v != 0;
}

uint64_t sampler_bytes_bound(Model& m) {
  uint64_t numel = 0, tensors = 0;
  for (const torch::Tensor& p : m.net->parameters()) {
    numel += static_cast<uint64_t>(p.numel());
    ++tensors;
  }
  // torch::save's zip archive: each tensor's bytes 64-byte aligned with a
  // local and a central header, and the pickled module structure.
  return 4 * numel + 512 * tensors + (64 << 10);
}

json SamplerStore::save_for_sampler(ModelRegistry& models,
                                    const Caller& caller, const json& a) {
  Model& m = models.get(require_string(a, "model_id"), caller.tenant);
  const bool named = a.contains("path") && !a["path"].is_null();
  const bool rank0 = comm_->rank() == 0;
  if (named) {
    const std::string name = require_string(a, "path");
    if (!safe_checkpoint_name(name))
      throw UsageError("save_weights_for_sampler name (field 'path') '" +
                       elide(name, 140) +
                       "' must be 1-128 characters of [A-Za-z0-9._-] (and "
                       "not 'latest')");
    const std::string path = "tinker://" + m.id + "/sampler_weights/" + name;
    const CheckpointLocation at =
        *locate_checkpoint(state_dir_, caller.tenant, path, "sampler_weights");
    const std::string dir = at.dir;
    if (!agree(!rank0 || within_dir(state_dir_, dir)))
      throw UsageError("sampler weights '" + path +
                       "' would leave this server's state directory (a "
                       "symbolic link?). Nothing was written");
    if (agree(rank0 && (paths_.count(dir) != 0 ||
                        std::ifstream(dir + "/weights.pt").good())))
      throw UsageError("sampler weights '" + path +
                       "' exist already. Fix: choose another name");
    if (caller.max_bytes) {
      const std::string refusal =
          rank0 ? over_bytes_quota(
                      caller, "save_weights_for_sampler '" + name + "'",
                      tree_bytes(tenant_dir(state_dir_, caller.tenant)),
                      sampler_bytes_bound(m))
                : "";
      if (!agree(refusal.empty())) {
        if (rank0) throw UsageError(refusal);
        throw UsageError("save_weights_for_sampler '" + name +
                         "' is over the tenant's quota (rank 0 says how "
                         "much). Nothing was written");
      }
    }
    TinyGpt net = snapshot_of(m, models.base_seed(), rank0);
    if (rank0) {
      auto s = std::make_shared<Sampler>();
      s->net = net;
      s->base_model = m.base.name;
      s->model_path = path;
      try {
        std::filesystem::create_directories(dir);
        torch::save(net, dir + "/weights.pt.tmp");
        std::filesystem::rename(dir + "/weights.pt.tmp", dir + "/weights.pt");
        atomic_write_file(dir + "/tinker_meta.json",
                          json({{"base_model", m.base.name},
                                {"model_id", m.id},
                                {"lora", lora_to_json(m.lora)}})
                              .dump(1));
      } catch (const std::exception&) {
        // The snapshot still serves this run; only persistence failed.
        throw IoError("sampler weights '" + path +
                      "' could not be written to the server's state "
                      "directory (see the server's disk)");
      }
      paths_[dir] = s;
    }
    return {{"path", path}, {"type", "save_weights_for_sampler"}};
  }
  int64_t sampling_seq = 0;
  if (!get_int64(a, "sampling_session_seq_id", &sampling_seq))
    throw UsageError(
        "save_weights_for_sampler needs 'path' (a name) or an integer "
        "'sampling_session_seq_id'");
  const std::string id = m.id + ":sample:" + std::to_string(sampling_seq);
  if (agree(rank0 && sessions_.count(id) != 0))
    throw UsageError("sampling session '" + id + "' exists already");
  TinyGpt net = snapshot_of(m, models.base_seed(), rank0);
  if (rank0) {
    auto s = std::make_shared<Sampler>();
    s->net = net;
    s->base_model = m.base.name;
    sessions_[id] = s;
  }
  return {{"sampling_session_id", id}, {"type", "save_weights_for_sampler"}};
}

std::shared_ptr<SamplerStore::Sampler> SamplerStore::by_path(
    const Caller& caller, const std::string& path) {
  const std::optional<CheckpointLocation> at =
      locate_checkpoint(state_dir_, caller.tenant, path, "sampler_weights");
  if (!at) {
    if (locate_checkpoint(state_dir_, caller.tenant, path, "weights"))
      throw UsageError("model_path '" + elide(path, 200) +
                       "' is a training checkpoint (save_state); sampling "
                       "reads sampler weights. Fix: save them with "
                       "save_weights_for_sampler(name) and pass the path it "
                       "returns (tinker://<model id>/sampler_weights/<name>)");
    throw UsageError("model_path '" + elide(path, 200) +
                     "' is not sampler weights of this server: expected "
                     "tinker://<model id>/sampler_weights/<name>");
  }
  const std::string dir = at->dir;
  auto it = paths_.find(dir);
  if (it != paths_.end()) return it->second;
  auto s = std::make_shared<Sampler>();
  try {
    if (!within_dir(state_dir_, dir)) throw UsageError("outside");
    const json meta = json::parse(read_file(dir + "/tinker_meta.json"));
    s->base_model = meta.at("base_model").get<std::string>();
    s->net = new_tiny_gpt(find_base_model(s->base_model),
                          lora_from_json(meta.at("lora")), 0);
    torch::load(s->net, dir + "/weights.pt");
  } catch (const std::exception&) {
    // Names the client's path only, never a server file; the same answer
    // for another tenant's path (Note [One tenant check] in tenancy.h).
    throw UsageError("sampler weights '" + elide(path, 200) +
                     "' cannot be read: this server has none of that name "
                     "(see save_weights_for_sampler)");
  }
  for (torch::Tensor& p : s->net->parameters()) p.set_requires_grad(false);
  s->model_path = path;
  paths_[dir] = s;
  return s;
}

void SamplerStore::forget(const Caller& caller, const std::string& path) {
  if (auto at = locate_checkpoint(state_dir_, caller.tenant, path,
                                  "sampler_weights"))
    paths_.erase(at->dir);
}

std::shared_ptr<SamplerStore::Sampler> SamplerStore::by_base(
    ModelRegistry& models, const std::string& base_model) {
  auto it = bases_.find(base_model);
  if (it != bases_.end()) return it->second;
  auto s = std::make_shared<Sampler>();
  s->base_model = find_base_model(base_model).name;  // UsageError if unknown
  s->net = new_tiny_gpt(find_base_model(base_model), LoraOptions(),
                        models.base_seed());
  for (torch::Tensor& p : s->net->parameters()) p.set_requires_grad(false);
  bases_[base_model] = s;
  return s;
}

std::shared_ptr<SamplerStore::Sampler> SamplerStore::session(
    const std::string& id) const {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) throw UsageError(unknown_sampling_session(id));
  return it->second;
}

json SamplerStore::create_session(ModelRegistry& models, const Caller& caller,
                                  const json& a) {
  const std::string owner = require_string(a, "session_id");
  const int64_t seq = get_or<int64_t>(a, "sampling_session_seq_id", -1);
  if (seq < 0)
    throw UsageError(
        "create_sampling_session needs an integer sampling_session_seq_id "
        ">= 0");
  const std::string id = owner + ":sample:" + std::to_string(seq);
  const std::string path = get_or<std::string>(a, "model_path", "");
  const std::string base = get_or<std::string>(a, "base_model", "");
  std::shared_ptr<Sampler> s;
  if (!path.empty()) {
    s = by_path(caller, path);
    if (!base.empty() && base != s->base_model)
      throw UsageError("base_model '" + elide(base, 100) +
                       "' does not match model_path '" + path +
                       "', which holds " + s->base_model +
                       ". Fix: omit base_model or pass " + s->base_model);
  } else if (!base.empty()) {
    s = by_base(models, base);
  } else {
    throw UsageError("create_sampling_session needs model_path or base_model");
  }
  auto it = sessions_.find(id);
  if (it != sessions_.end() && it->second != s)
    throw UsageError("sampling session '" + id +
                     "' exists already with other weights");
  sessions_[id] = s;
  return {{"type", "create_sampling_session"}, {"sampling_session_id", id}};
}

json SamplerStore::get_sampler(const json& a) {
  const std::string id = require_string(a, "sampler_id");
  std::shared_ptr<Sampler> s = session(id);
  json out = {{"sampler_id", id}, {"base_model", s->base_model}};
  if (!s->model_path.empty()) out["model_path"] = s->model_path;
  return out;
}

std::string SamplerStore::sample(ModelRegistry& models, const Caller& caller,
                                 const json& a) {
  std::shared_ptr<Sampler> s;
  std::string seed_key;
  if (a.contains("sampling_session_id") &&
      !a["sampling_session_id"].is_null()) {
    const std::string id = require_string(a, "sampling_session_id");
    s = session(id);
    seed_key = id + "#" + std::to_string(get_or<int64_t>(a, "seq_id", 0));
  } else if (a.contains("model_path") && a["model_path"].is_string()) {
    s = by_path(caller, a["model_path"].get<std::string>());
  } else if (a.contains("base_model") && a["base_model"].is_string()) {
    s = by_base(models, a["base_model"].get<std::string>());
  } else {
    throw UsageError(
        "a sample request needs sampling_session_id, model_path or "
        "base_model");
  }
  if (seed_key.empty()) seed_key = a.dump();
  SampleRequestIn in =
      parse_sample_request(a, fnv1a64(seed_key.data(), seed_key.size()));
  if (!in.max_tokens_given)
    in.options.max_tokens =
        s->net->options().block_size - static_cast<int64_t>(in.prompt.size());
  SampleOutput out =
      zerostep::sample(s->net, in.prompt, in.num_samples, in.options);
  if (in.prompt_logprobs_last_n > 0) {
    const size_t scored = static_cast<size_t>(in.prompt_logprobs_last_n);
    for (size_t i = 0; i + scored < out.prompt_logprobs.size(); ++i)
      out.prompt_logprobs[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return encode_sample_response(out);
}

}  // namespace tinker
}  // namespace zerostep
