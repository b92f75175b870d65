#include "tools/tinker/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "engine/config.h"
#include "engine/config_text.h"
#include "engine/engine.h"
#include "models/lora.h"
#include "models/tiny_gpt.h"
#include "tools/tinker/protocol.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {

const std::vector<BaseModel>& base_models() {
  static const std::vector<BaseModel> kModels = {
      {"zerostep/tiny-gpt", 256, 64, 32, 2, 2},
      {"zerostep/small-gpt", 256, 128, 64, 4, 4},
  };
  return kModels;
}

uint64_t digest_floats(const float* data, size_t n) {
  return fnv1a64(data, n * sizeof(float));
}

std::string digest_hex(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(digest));
  return buf;
}

std::string server_ds_config(const std::string& text, int world_size) {
  nlohmann::json doc = nlohmann::json::object();
  if (!text.empty()) {
    try {
      doc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError({{"", "", std::string("valid JSON (") + e.what() + ")",
                          "fix the JSON syntax"}});
    }
    if (!doc.is_object())
      throw ConfigError({{"", doc.dump(), "a JSON object", "write {...}"}});
  }
  std::vector<ConfigProblem> problems;
  if (doc.contains("managed_gradient_accumulation") &&
      doc["managed_gradient_accumulation"] != false)
    problems.push_back({"managed_gradient_accumulation",
                        doc["managed_gradient_accumulation"].dump(),
                        "the trainer server owns the boundary (one optim_step "
                        "= one step()): it must be false",
                        "remove the key or set it to false"});
  if (doc.contains("gradient_accumulation_scaling") &&
      !(doc["gradient_accumulation_scaling"].is_string() &&
        config_text::lower(doc["gradient_accumulation_scaling"]) == "none"))
    problems.push_back({"gradient_accumulation_scaling",
                        doc["gradient_accumulation_scaling"].dump(),
                        "the protocol's losses are sums, so gradients are "
                        "summed over a window: it must be \"none\"",
                        "remove the key or set it to \"none\""});
  if (doc.contains("optimizer") && doc["optimizer"].is_object() &&
      doc["optimizer"].contains("type") &&
      !(doc["optimizer"]["type"].is_string() &&
        config_text::lower(doc["optimizer"]["type"]) == "adamw"))
    problems.push_back({"optimizer.type", doc["optimizer"]["type"].dump(),
                        "optim_step's AdamParams are decoupled AdamW",
                        "remove the key or set it to \"AdamW\""});
  if (!problems.empty()) throw ConfigError(problems, "trainer server config");
  doc["managed_gradient_accumulation"] = false;
  doc["gradient_accumulation_scaling"] = "none";
  if (!doc.contains("train_batch_size") &&
      !doc.contains("train_micro_batch_size_per_gpu"))
    doc["train_micro_batch_size_per_gpu"] = 1;
  if (!doc.contains("gradient_accumulation_steps") &&
      !(doc.contains("train_batch_size") &&
        doc.contains("train_micro_batch_size_per_gpu")))
    doc["gradient_accumulation_steps"] = 1;
  if (!doc.contains("optimizer"))
    doc["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}};
  const std::string out = doc.dump();
  parse_config(out, world_size);  // every other problem, reported at once
  return out;
}

namespace {

std::mutex g_construction_mu;  // torch's global RNG, shared by rank threads

struct Model {
  std::string id;
  BaseModel base;
  LoraOptions lora;  // rank 0: full fine-tuning
  TinyGpt net{nullptr};
  std::unique_ptr<Engine> engine;
};

const BaseModel& find_base(const std::string& name) {
  std::string names;
  for (const BaseModel& b : base_models()) {
    if (b.name == name) return b;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  throw UsageError("unknown base_model '" + name + "'. This server has: " +
                   names);
}

template <typename T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  try {
    return j[key].get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError(std::string("field '") + key + "' has the wrong type: " +
                     j[key].dump());
  }
}

std::string require_string(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    throw UsageError(std::string("missing string field '") + key + "'");
  return j[key].get<std::string>();
}

bool safe_name(const std::string& s) {
  if (s.empty() || s.size() > 128 || s == "latest" || s == "." || s == "..")
    return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
          c == '_' || c == '.'))
      return false;
  return true;
}

// Model ids contain ':'; folders use '_' instead.
std::string folder_of(const std::string& model_id) {
  std::string f = model_id;
  for (char& c : f)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
          c == '.'))
      c = '_';
  return f;
}

// Per-datum checked inputs for a loss.
struct DatumPlan {
  torch::Tensor tokens;   // [1, T] int64
  torch::Tensor targets;  // [T] int64
  torch::Tensor weights;  // [T] float32 (cross_entropy)
  torch::Tensor q;        // [T] sampling logprobs
  torch::Tensor adv;      // [T] advantages
};

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

struct RankTrainer::Impl {
  Communicator* comm;
  TrainerOptions options;
  Config config;
  std::map<std::string, std::unique_ptr<Model>> models;

  Model& model(const std::string& id) {
    auto it = models.find(id);
    if (it != models.end()) return *it->second;
    std::string names;
    for (const auto& kv : models) names += (names.empty() ? "" : ", ") + kv.first;
    throw UsageError("unknown model_id '" + id + "' (models on this server: " +
                     (names.empty() ? "none" : names) +
                     "). Fix: create_model first");
  }

  uint64_t digest(Model& m) {
    torch::Tensor p = m.engine->full_parameters();  // a collective at stage 3
    return digest_floats(p.data_ptr<float>(), static_cast<size_t>(p.numel()));
  }

  std::unique_ptr<Model> build(const std::string& id, const BaseModel& base,
                               const LoraOptions& lora) {
    auto m = std::make_unique<Model>();
    m->id = id;
    m->base = base;
    m->lora = lora;
    TinyGptOptions o;
    o.vocab_size = base.vocab_size;
    o.block_size = base.max_context;
    o.d_model = base.d_model;
    o.n_head = base.n_head;
    o.n_layer = base.n_layer;
    o.lora = lora;
    {
      std::lock_guard<std::mutex> lock(g_construction_mu);
      torch::manual_seed(options.base_seed);
      m->net = TinyGpt(o);
    }
    if (lora.rank > 0) freeze_all_but_lora(*m->net);
    // Frozen weights are not the engine's: make rank 0's values everyone's
    // (they are equal by construction; this keeps real multi-process runs
    // honest whatever the ranks' torch builds).
    for (torch::Tensor& p : m->net->parameters()) {
      if (p.requires_grad()) continue;
      comm->broadcast(Buffer::of(p.data_ptr<float>(),
                                 static_cast<size_t>(p.numel())),
                      {0, phase::kSetup});
    }
    m->engine = std::make_unique<Engine>(m->net.ptr(), config, comm);
    return m;
  }

  CommandResult create_model(const nlohmann::json& a) {
    const std::string id = require_string(a, "model_id");
    if (models.count(id)) throw UsageError("model '" + id + "' exists already");
    const BaseModel& base = find_base(require_string(a, "base_model"));
    if (a.contains("optimizer_config") && a["optimizer_config"].is_object()) {
      const std::string t = get_or<std::string>(a["optimizer_config"], "type", "adamw");
      if (t != "adamw")
        throw UsageError("optimizer_config.type '" + t + "' is not served: "
                         "this server trains with decoupled AdamW ('adamw')");
    }
    LoraOptions lora;
    if (a.contains("lora_config") && a["lora_config"].is_object()) {
      const nlohmann::json& l = a["lora_config"];
      lora.rank = get_or<int64_t>(l, "rank", 0);
      if (lora.rank < 1 || lora.rank > base.d_model)
        throw UsageError("lora_config.rank = " + std::to_string(lora.rank) +
                         " must be in [1, " + std::to_string(base.d_model) +
                         "] for " + base.name);
      lora.seed = get_or<uint64_t>(l, "seed", 0);
      lora.attn = get_or<bool>(l, "train_attn", true);
      lora.mlp = get_or<bool>(l, "train_mlp", true);
      lora.unembed = get_or<bool>(l, "train_unembed", true);
      if (!lora.attn && !lora.mlp && !lora.unembed)
        throw UsageError("lora_config trains nothing: set one of train_attn, "
                         "train_mlp, train_unembed");
    }
    models[id] = build(id, base, lora);
    return ok_json({{"model_id", id}, {"type", "create_model"}});
  }

  static CommandResult ok_json(nlohmann::json j) {
    CommandResult r;
    r.json = std::move(j);
    return r;
  }

  // Checks everything forward_backward reads; throws UsageError naming the
  // datum and the field.
  std::vector<DatumPlan> plan(const ForwardBackwardIn& in, const Model& m) {
    const auto& losses = supported_losses();
    if (std::find(losses.begin(), losses.end(), in.loss_fn) == losses.end()) {
      std::string names;
      for (const auto& l : losses) names += (names.empty() ? "" : ", ") + l;
      throw UsageError("loss_fn '" + in.loss_fn + "' is not served (this "
                       "server computes " + names + ")");
    }
    for (const auto& kv : in.loss_fn_config) {
      const bool known = in.loss_fn == "ppo" && (kv.first == "clip_low_threshold" ||
                                                 kv.first == "clip_high_threshold");
      if (!known)
        throw UsageError("loss_fn_config key '" + kv.first + "' is not used by " +
                         in.loss_fn + (in.loss_fn == "ppo"
                                           ? " (it reads clip_low_threshold, "
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
      if (t > m.base.max_context)
        throw UsageError(at + ".model_input has " + std::to_string(t) +
                         " tokens; " + m.base.name + " takes at most " +
                         std::to_string(m.base.max_context));
      auto check_ids = [&](const std::vector<int64_t>& ids, const std::string& what) {
        for (size_t k = 0; k < ids.size(); ++k)
          if (ids[k] < 0 || ids[k] >= m.base.vocab_size)
            throw UsageError(at + "." + what + "[" + std::to_string(k) + "] = " +
                             std::to_string(ids[k]) + " is outside the vocabulary [0, " +
                             std::to_string(m.base.vocab_size) + ") of " + m.base.name);
      };
      check_ids(d.tokens, "model_input");
      for (const auto& kv : d.inputs) {
        const bool known =
            std::find(needed.begin(), needed.end(), kv.first) != needed.end() ||
            std::find(optional.begin(), optional.end(), kv.first) != optional.end();
        if (!known)
          throw UsageError(at + ".loss_fn_inputs['" + kv.first + "'] is not read "
                           "by " + in.loss_fn);
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
            if (!std::isfinite(f)) throw UsageError(where + " holds a non-finite value");
      }
      check_ids(d.inputs.at("target_tokens").ints, "loss_fn_inputs['target_tokens']");
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
      const double lo = in.loss_fn_config.count("clip_low_threshold")
                            ? in.loss_fn_config.at("clip_low_threshold") : 0.8;
      const double hi = in.loss_fn_config.count("clip_high_threshold")
                            ? in.loss_fn_config.at("clip_high_threshold") : 1.2;
      if (!(lo <= hi))
        throw UsageError("ppo: clip_low_threshold " + std::to_string(lo) +
                         " must not exceed clip_high_threshold " + std::to_string(hi));
    }
    return out;
  }

  CommandResult forward_backward(const Command& c) {
    const ForwardBackwardIn in = decode_forward_backward(c.blob);
    Model& m = model(in.model_id);
    const std::vector<DatumPlan> plans = plan(in, m);
    // Validated on every rank: from here on every rank runs the same
    // collectives.
    const int w = comm->world_size(), r = comm->rank();
    const int64_t n = static_cast<int64_t>(plans.size());
    const int64_t rows = (n + w - 1) / w;
    std::vector<int64_t> offset(static_cast<size_t>(n) + 1, 0);
    for (int64_t j = 0; j < n; ++j)
      offset[j + 1] = offset[j] + plans[j].targets.size(0);
    const int64_t total = offset[n];
    std::vector<float> lp_all(static_cast<size_t>(total), 0.0f),
        el_all(static_cast<size_t>(total), 0.0f);
    std::vector<double> loss_all(static_cast<size_t>(n), 0.0);
    const double lo = in.loss_fn_config.count("clip_low_threshold")
                          ? in.loss_fn_config.at("clip_low_threshold") : 0.8;
    const double hi = in.loss_fn_config.count("clip_high_threshold")
                          ? in.loss_fn_config.at("clip_high_threshold") : 1.2;
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t j = row * w + r;
      torch::Tensor loss;
      {
        torch::AutoGradMode grad_mode(!in.forward_only);
        if (j < n) {
          const DatumPlan& p = plans[j];
          torch::Tensor logits = m.net->forward(p.tokens)[0];  // [T, V]
          torch::Tensor lp =
              torch::log_softmax(logits, -1).gather(1, p.targets.unsqueeze(1)).squeeze(1);
          torch::Tensor elementwise;
          if (in.loss_fn == "cross_entropy") {
            elementwise = -(lp * p.weights);
          } else {
            torch::Tensor ratio = torch::exp(lp - p.q);
            if (in.loss_fn == "importance_sampling") {
              elementwise = -(ratio * p.adv);
            } else {
              torch::Tensor clipped = torch::clamp(ratio, lo, hi);
              elementwise = -torch::min(ratio * p.adv, clipped * p.adv);
            }
          }
          loss = elementwise.sum();
          torch::Tensor lpc = lp.detach().contiguous(),
                        elc = elementwise.detach().contiguous();
          std::copy(lpc.data_ptr<float>(), lpc.data_ptr<float>() + lpc.numel(),
                    lp_all.begin() + offset[j]);
          std::copy(elc.data_ptr<float>(), elc.data_ptr<float>() + elc.numel(),
                    el_all.begin() + offset[j]);
          loss_all[static_cast<size_t>(j)] = loss.item<double>();
        } else {
          // No datum for this rank in the last row: the same collectives,
          // a zero gradient.
          loss = m.net->forward(torch::zeros({1, 1}, torch::kInt64)).sum() * 0.0;
        }
      }
      if (!in.forward_only) {
        // The engine averages over ranks; the protocol sums over datums.
        m.engine->backward(w == 1 ? loss : loss * static_cast<double>(w),
                           /*scale_wrt_gas=*/false);
      }
    }
    if (w > 1) {
      // Each datum's outputs live on one rank, zeros elsewhere: a sum
      // gathers them exactly.
      std::vector<float> packed(lp_all);
      packed.insert(packed.end(), el_all.begin(), el_all.end());
      if (!packed.empty())
        comm->all_reduce(Buffer::of(packed.data(), packed.size()),
                         {ReduceOp::kSum, phase::kForward});
      comm->all_reduce(Buffer::of(loss_all.data(), loss_all.size()),
                       {ReduceOp::kSum, phase::kForward});
      std::copy(packed.begin(), packed.begin() + total, lp_all.begin());
      std::copy(packed.begin() + total, packed.end(), el_all.begin());
    }
    std::vector<DatumOut> outs(static_cast<size_t>(n));
    double loss_sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      outs[j].logprobs.assign(lp_all.begin() + offset[j], lp_all.begin() + offset[j + 1]);
      outs[j].elementwise_loss.assign(el_all.begin() + offset[j],
                                      el_all.begin() + offset[j + 1]);
      loss_sum += loss_all[static_cast<size_t>(j)];
    }
    CommandResult res;
    res.has_proto = true;
    res.proto = encode_forward_backward_output(outs, {{"loss:sum", loss_sum}});
    return res;
  }

  CommandResult optim_step(const nlohmann::json& a) {
    Model& m = model(require_string(a, "model_id"));
    nlohmann::json p;
    if (a.contains("adam_params")) {
      p = a["adam_params"];
    } else if (a.contains("optimizer_params")) {
      throw UsageError("optimizer_params of type '" +
                       get_or<std::string>(a["optimizer_params"], "type", "?") +
                       "' are not served: this server trains with AdamW "
                       "(send adam_params)");
    } else {
      throw UsageError("optim_step without adam_params");
    }
    if (m.engine->window_backwards() == 0)
      throw UsageError("optim_step on '" + m.id + "' with no forward_backward "
                       "since its last optim_step: there is no gradient to "
                       "apply. Nothing was changed");
    StepOverrides o;
    o.lr = get_or<double>(p, "learning_rate", 1e-4);
    o.beta1 = get_or<double>(p, "beta1", 0.9);
    o.beta2 = get_or<double>(p, "beta2", 0.95);
    o.eps = get_or<double>(p, "eps", 1e-12);
    o.weight_decay = get_or<double>(p, "weight_decay", 0.0);
    o.gradient_clipping = get_or<double>(p, "grad_clip_norm", 0.0);
    m.engine->step(o);  // UsageError on bad values, before anything changes
    const uint64_t d = digest(m);
    return ok_json(
        {{"metrics",
          {{"param_digest_hi:unique", static_cast<double>(d >> 32)},
           {"param_digest_lo:unique", static_cast<double>(d & 0xffffffffu)},
           {"grad_norm:mean", m.engine->get_global_grad_norm()},
           {"global_steps:max", static_cast<double>(m.engine->global_steps())}}}});
  }

  std::string run_folder(const std::string& model_id) const {
    return options.state_dir + "/" + folder_of(model_id);
  }

  // Rank 0's answer, everyone's (file systems may differ between machines).
  bool agree(bool mine) {
    int64_t v = mine ? 1 : 0;
    comm->broadcast(Buffer::of(&v, 1), {0, phase::kSetup});
    return v != 0;
  }

  CommandResult save_weights(const nlohmann::json& a) {
    Model& m = model(require_string(a, "model_id"));
    const std::string name = get_or<std::string>(a, "path", "");
    if (!safe_name(name))
      throw UsageError("save_weights name '" + name + "' must be 1-128 "
                       "characters of [A-Za-z0-9._-] (and not 'latest')");
    const std::string dir = run_folder(m.id);
    const bool exists =
        agree(std::ifstream(dir + "/" + name + "/manifest.json").good());
    if (exists && !get_or<bool>(a, "overwrite", false))
      throw UsageError("checkpoint '" + name + "' of " + m.id + " exists. Fix: "
                       "pass overwrite=True or choose another name");
    m.engine->save_checkpoint(dir, name);
    if (comm->rank() == 0) {
      nlohmann::json meta = {{"base_model", m.base.name},
                             {"model_id", m.id},
                             {"lora", {{"rank", m.lora.rank},
                                       {"alpha", m.lora.alpha},
                                       {"seed", m.lora.seed},
                                       {"train_attn", m.lora.attn},
                                       {"train_mlp", m.lora.mlp},
                                       {"train_unembed", m.lora.unembed}}}};
      atomic_write_file(dir + "/" + name + "/tinker_meta.json", meta.dump(1));
    }
    return ok_json({{"path", "tinker://" + m.id + "/weights/" + name},
                    {"type", "save_weights"}});
  }

  struct CheckpointRef {
    std::string dir, name;
    nlohmann::json meta;
  };

  CheckpointRef resolve(const std::string& path) {
    const std::string prefix = "tinker://";
    std::vector<std::string> parts;
    if (path.rfind(prefix, 0) == 0) {
      std::string rest = path.substr(prefix.size());
      size_t at = 0;
      while (true) {
        size_t slash = rest.find('/', at);
        parts.push_back(rest.substr(at, slash - at));
        if (slash == std::string::npos) break;
        at = slash + 1;
      }
    }
    if (parts.size() != 3 || parts[1] != "weights" || parts[0].empty() ||
        !safe_name(parts[2]))
      throw UsageError("path '" + path + "' is not a training checkpoint of "
                       "this server: expected tinker://<model id>/weights/<name>");
    CheckpointRef ref{run_folder(parts[0]), parts[2], {}};
    std::string meta;
    std::string error;
    try {
      meta = read_file(ref.dir + "/" + ref.name + "/tinker_meta.json");
      ref.meta = nlohmann::json::parse(meta);
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (!agree(error.empty()))
      throw UsageError("checkpoint '" + path + "' cannot be read" +
                       (error.empty() ? "" : ": " + error));
    return ref;
  }

  static LoraOptions lora_of(const nlohmann::json& meta) {
    const nlohmann::json& l = meta.at("lora");
    LoraOptions o;
    o.rank = l.at("rank").get<int64_t>();
    o.alpha = l.at("alpha").get<double>();
    o.seed = l.at("seed").get<uint64_t>();
    o.attn = l.at("train_attn").get<bool>();
    o.mlp = l.at("train_mlp").get<bool>();
    o.unembed = l.at("train_unembed").get<bool>();
    return o;
  }

  CommandResult load_weights(const nlohmann::json& a) {
    const std::string path = require_string(a, "path");
    const std::string id = require_string(a, "model_id");
    CheckpointRef ref = resolve(path);
    const std::string base_name = ref.meta.at("base_model").get<std::string>();
    const LoraOptions lora = lora_of(ref.meta);
    std::unique_ptr<Model> created;
    Model* m = nullptr;
    if (get_or<bool>(a, "create", false)) {
      if (models.count(id)) throw UsageError("model '" + id + "' exists already");
      created = build(id, find_base(base_name), lora);
      m = created.get();
    } else {
      m = &model(id);
      if (m->base.name != base_name || m->lora.rank != lora.rank ||
          m->lora.attn != lora.attn || m->lora.mlp != lora.mlp ||
          m->lora.unembed != lora.unembed)
        throw UsageError("checkpoint '" + path + "' holds " + base_name +
                         " with LoRA rank " + std::to_string(lora.rank) +
                         "; model " + id + " is " + m->base.name +
                         " with LoRA rank " + std::to_string(m->lora.rank) +
                         ". Nothing was changed");
    }
    LoadOptions lo;
    lo.allow_reshard = true;
    lo.load_optimizer_states = get_or<bool>(a, "optimizer", false);
    m->engine->load_checkpoint(ref.dir, ref.name, lo);
    if (created) models[id] = std::move(created);
    return ok_json({{"path", path}, {"model_id", id}, {"type", "load_weights"}});
  }

  CommandResult get_info(const nlohmann::json& a) {
    Model& m = model(require_string(a, "model_id"));
    const uint64_t d = digest(m);
    int64_t trainable = 0;
    for (const torch::Tensor& p : m.engine->parameters()) trainable += p.numel();
    nlohmann::json j = {
        {"type", "get_info"},
        {"model_id", m.id},
        {"model_name", m.base.name},
        {"model_data", {{"arch", "zerostep-tiny-gpt"}, {"model_name", m.base.name}}},
        {"is_lora", m.lora.rank > 0},
        {"param_digest", digest_hex(d)},
        {"trainable_parameters", trainable},
        {"window_forward_backwards", m.engine->window_backwards()},
        {"global_steps", m.engine->global_steps()},
        {"zero_stage", config.zero.stage},
        {"world_size", comm->world_size()}};
    if (m.lora.rank > 0) j["lora_rank"] = m.lora.rank;
    return ok_json(j);
  }

  CommandResult dispatch(const Command& c) {
    if (c.op == "noop" || c.op == "shutdown") return CommandResult();
    if (c.op == "create_model") return create_model(c.args);
    if (c.op == "forward_backward") return forward_backward(c);
    if (c.op == "optim_step") return optim_step(c.args);
    if (c.op == "save_weights") return save_weights(c.args);
    if (c.op == "load_weights") return load_weights(c.args);
    if (c.op == "get_info") return get_info(c.args);
    throw InternalError("unknown command '" + c.op + "'");
  }
};

RankTrainer::RankTrainer(Communicator* comm, const TrainerOptions& options)
    : impl_(new Impl{comm, options, {}, {}}) {
  impl_->config = parse_config(
      server_ds_config(options.ds_config_json, comm->world_size()),
      comm->world_size());
}

RankTrainer::~RankTrainer() = default;

CommandResult RankTrainer::execute(const Command& command) {
  try {
    return impl_->dispatch(command);
  } catch (const CommError& e) {
    return CommandResult::failure(e.what(), "server");
  } catch (const InternalError& e) {
    return CommandResult::failure(e.what(), "server");
  } catch (const Error& e) {  // UsageError, ConfigError, IoError
    return CommandResult::failure(e.what(), "user");
  } catch (const c10::Error& e) {
    return CommandResult::failure(
        std::string("LibTorch failed: ") + e.what_without_backtrace(), "server");
  } catch (const std::exception& e) {
    return CommandResult::failure(e.what(), "server");
  }
}

}  // namespace tinker
}  // namespace zerostep
