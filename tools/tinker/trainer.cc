#include "tools/tinker/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "config/text.h"
#include "engine/checkpoint_io.h"
#include "engine/engine.h"
#include "tools/tinker/checkpoints.h"
#include "tools/tinker/losses.h"
#include "tools/tinker/model_registry.h"
#include "tools/tinker/protocol.h"
#include "tools/tinker/request_fields.h"
#include "tools/tinker/sampling.h"
#include "tools/tinker/stability.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {

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
  // Every other problem, reported at once.
  parse_config(out, world_size, server_trainer_values());
  return out;
}

TrainerValues server_trainer_values() {
  TrainerValues t;
  t.micro_batch_size = 1;
  t.gradient_accumulation_steps = 1;
  // The protocol's AdamParams defaults (optim_step's, below).
  t.learning_rate = 1e-4;
  t.adam_beta1 = 0.9;
  t.adam_beta2 = 0.95;
  t.adam_epsilon = 1e-12;
  t.weight_decay = 0.0;
  t.max_grad_norm = 0.0;
  t.dtype = Precision::kFp32;
  int64_t hidden = 0;
  for (const BaseModel& b : base_models()) hidden = std::max(hidden, b.d_model);
  t.hidden_size = hidden;
  t.must_match = false;
  return t;
}

Config server_config(const std::string& ds_config_json, int world_size) {
  return parse_config(server_ds_config(ds_config_json, world_size), world_size,
                      server_trainer_values());
}

struct RankTrainer::Impl {
  Impl(Communicator* comm, const TrainerOptions& options)
      : comm(comm),
        config(server_config(options.ds_config_json, comm->world_size())),
        models(comm, config, options.base_seed,
               MemoryCheck{options.ranks_in_process, options.available_memory}),
        checkpoints(comm, options.state_dir, config.zero.stage),
        samplers(comm, options.state_dir) {}

  Communicator* comm;
  Config config;
  ModelRegistry models;
  CheckpointStore checkpoints;
  SamplerStore samplers;

  uint64_t digest(Model& m) {
    torch::Tensor p = m.engine->full_parameters();  // a collective at stage 3
    return digest_floats(p.data_ptr<float>(), static_cast<size_t>(p.numel()));
  }

  static CommandResult ok_json(nlohmann::json j) {
    CommandResult r;
    r.json = std::move(j);
    return r;
  }

  // A datum of a model's open window whose row is not backpropagated yet
  // (Note [Window positions] in trainer.h).
  struct PendingDatum {
    DatumPlan plan;
    std::string loss_fn;
    LossConfig config;
  };
  // A model's open window: `datums` since its last optim_step, the last
  // `pending.size()` of them in the partial row (datums % W of them).
  struct Window {
    int64_t datums = 0;
    std::vector<PendingDatum> pending;
  };
  std::map<std::string, Window> windows;  // by model id; absent: empty

  // One datum's forward: its target logprobs and elementwise loss ([T]).
  static std::pair<torch::Tensor, torch::Tensor> run_datum(
      Model& m, const DatumPlan& p, const std::string& loss_fn,
      const LossConfig& config) {
    torch::Tensor logits = m.net.lm->logits(p.tokens)[0];  // [T, V]
    torch::Tensor lp = target_logprobs(logits, p.targets);
    return {lp, elementwise_loss(loss_fn, lp, p, config)};
  }

  // A rank without a datum in a row: the same forward collectives (stage
  // 3 gathers), a zero loss.
  static torch::Tensor zero_loss(Model& m) {
    return m.net.lm->logits(torch::zeros({1, 1}, torch::kInt64)).sum() * 0.0;
  }

  // The engine averages over ranks; the protocol sums over datums.
  void backward(Model& m, const torch::Tensor& loss) {
    const int w = comm->world_size();
    m.engine->backward(w == 1 ? loss : loss * static_cast<double>(w),
                       /*scale_wrt_gas=*/false);
  }

  // Note [Window positions] in trainer.h: the request's datums take the
  // window's next positions; datum at position p is rank p % W's in row
  // p / W; every rank runs one forward per row the request touches, and
  // one backward() per row it completes.
  // stable_reinforce: rank 0 resolves every datum's provenance against the
  // sampler's records (Note [Stability records] in stability.h) and
  // broadcasts the result, so every rank fails alike or gets the same q.
  void fill_recorded_q(const ForwardBackwardIn& in, const Model& m,
                       const Caller& caller, std::vector<DatumPlan>* plans) {
    std::string payload;
    if (comm->rank() == 0) {
      try {
        std::vector<float> all;
        for (size_t i = 0; i < in.data.size(); ++i) {
          const std::vector<float> q = samplers.stability().resolve(
              caller.tenant, session_of(m.id), in.data[i], i);
          all.insert(all.end(), q.begin(), q.end());
        }
        payload = "q" + std::string(reinterpret_cast<const char*>(all.data()),
                                    all.size() * sizeof(float));
      } catch (const UsageError& e) {
        payload = std::string("e") + e.what();
      }
    }
    broadcast_bytes(*comm, &payload);
    if (payload.empty() || payload[0] != 'q')
      throw UsageError(payload.empty() ? "stable_reinforce: no answer from "
                                         "rank 0"
                                       : payload.substr(1));
    size_t offset = 1;
    for (DatumPlan& p : *plans) {
      const int64_t t = p.targets.size(0);
      p.q = torch::empty({t}, torch::kFloat32);
      std::memcpy(p.q.data_ptr<float>(), payload.data() + offset,
                  static_cast<size_t>(t) * sizeof(float));
      offset += static_cast<size_t>(t) * sizeof(float);
    }
    ZS_CHECK(offset == payload.size());
  }

  // One forward_backward request's outputs, datum by datum: datum j's
  // target logprobs and elementwise loss at [offset[j], offset[j + 1]) of
  // the flat arrays (zeros on the ranks that did not run it), and its
  // summed loss.
  struct RequestOutputs {
    std::vector<int64_t> offset;
    std::vector<float> logprobs, elementwise;
    std::vector<double> loss;

    explicit RequestOutputs(const std::vector<DatumPlan>& plans)
        : offset(plans.size() + 1, 0), loss(plans.size(), 0.0) {
      for (size_t j = 0; j < plans.size(); ++j)
        offset[j + 1] = offset[j] + plans[j].targets.numel();
      logprobs.assign(static_cast<size_t>(offset.back()), 0.0f);
      elementwise.assign(static_cast<size_t>(offset.back()), 0.0f);
    }
  };

  // Note [Window positions]: the rows the request's positions [start, end)
  // touch, this rank's datum of each (the request's, a pending one, or
  // none: a zero loss), and a backward() for every row the request
  // completes (none when forward_only). Outputs of the request's datums go
  // into *out.
  void run_rows(Model& m, const ForwardBackwardIn& in,
                const std::vector<DatumPlan>& plans, const LossConfig& config,
                const Window& win, int64_t start, RequestOutputs* out) {
    const int w = comm->world_size(), r = comm->rank();
    const int64_t end = start + static_cast<int64_t>(plans.size());
    // The pending datums sit at positions [start - pending, start).
    const int64_t pending_from =
        start - static_cast<int64_t>(win.pending.size());
    for (int64_t row = start / w; row * w < end; ++row) {
      const bool complete = !in.forward_only && (row + 1) * w <= end;
      const int64_t p = row * w + r;
      torch::Tensor loss;
      {
        torch::AutoGradMode grad_mode(complete);
        if (p >= start && p < end) {
          const int64_t j = p - start;
          auto o = run_datum(m, plans[j], in.loss_fn, config);
          loss = o.second.sum();
          torch::Tensor lpc = o.first.detach().contiguous(),
                        elc = o.second.detach().contiguous();
          std::copy(lpc.data_ptr<float>(), lpc.data_ptr<float>() + lpc.numel(),
                    out->logprobs.begin() + out->offset[j]);
          std::copy(elc.data_ptr<float>(), elc.data_ptr<float>() + elc.numel(),
                    out->elementwise.begin() + out->offset[j]);
          out->loss[static_cast<size_t>(j)] = loss.item<double>();
        } else if (p < start && complete) {
          // This rank's datum came with an earlier request: its outputs
          // went back then; now its row is complete.
          const PendingDatum& d = win.pending[p - pending_from];
          loss = run_datum(m, d.plan, d.loss_fn, d.config).second.sum();
        } else {
          // No datum (past the request's end), or one still pending.
          loss = zero_loss(m);
        }
      }
      if (complete) backward(m, loss);
    }
  }

  // The window after the request: its datums counted, and the datums of
  // the row it left partial kept (earlier requests' and this one's).
  static void keep_partial_row(Window* win, int w,
                               const std::vector<DatumPlan>& plans,
                               const std::string& loss_fn,
                               const LossConfig& config, int64_t start) {
    const int64_t end = start + static_cast<int64_t>(plans.size());
    const int64_t pending_from =
        start - static_cast<int64_t>(win->pending.size());
    std::vector<PendingDatum> pending;
    for (int64_t p = (end / w) * w; p < end; ++p) {
      if (p < start)
        pending.push_back(std::move(win->pending[p - pending_from]));
      else
        pending.push_back({plans[p - start], loss_fn, config});
    }
    win->pending = std::move(pending);
    win->datums = end;
  }

  // Each datum's outputs live on one rank, zeros elsewhere: a sum gathers
  // them exactly, on every rank.
  void gather_outputs(RequestOutputs* out) {
    if (comm->world_size() == 1) return;
    const size_t total = out->logprobs.size();
    std::vector<float> packed(out->logprobs);
    packed.insert(packed.end(), out->elementwise.begin(),
                  out->elementwise.end());
    if (!packed.empty())
      comm->all_reduce(Buffer::of(packed.data(), packed.size()),
                       {ReduceOp::kSum, phase::kForward});
    comm->all_reduce(Buffer::of(out->loss.data(), out->loss.size()),
                     {ReduceOp::kSum, phase::kForward});
    std::copy(packed.begin(), packed.begin() + total, out->logprobs.begin());
    std::copy(packed.begin() + total, packed.end(), out->elementwise.begin());
  }

  static CommandResult encode_outputs(const std::vector<DatumPlan>& plans,
                                      const RequestOutputs& out) {
    std::vector<DatumOut> outs(plans.size());
    double loss_sum = 0.0;
    for (size_t j = 0; j < plans.size(); ++j) {
      outs[j].logprobs.assign(out.logprobs.begin() + out.offset[j],
                              out.logprobs.begin() + out.offset[j + 1]);
      outs[j].elementwise_loss.assign(
          out.elementwise.begin() + out.offset[j],
          out.elementwise.begin() + out.offset[j + 1]);
      if (plans[j].targets.dim() == 2) outs[j].k = plans[j].targets.size(1);
      loss_sum += out.loss[j];
    }
    CommandResult res;
    res.has_proto = true;
    res.proto = encode_forward_backward_output(outs, {{"loss:sum", loss_sum}});
    return res;
  }

  CommandResult forward_backward(const Command& c) {
    const ForwardBackwardIn in = decode_forward_backward(c.blob);
    Model& m = models.get(in.model_id, c.caller.tenant);
    std::vector<DatumPlan> plans = plan_forward_backward(in, m.base);
    const LossConfig config = loss_config(in.loss_fn, in.loss_fn_config);
    if (in.loss_fn == "stable_reinforce")
      fill_recorded_q(in, m, c.caller, &plans);
    // Validated on every rank: from here on every rank runs the same
    // collectives.
    Window none;
    Window& win = in.forward_only ? none : windows[m.id];
    const int64_t start = win.datums;
    RequestOutputs out(plans);
    run_rows(m, in, plans, config, win, start, &out);
    if (!in.forward_only)
      keep_partial_row(&win, comm->world_size(), plans, in.loss_fn, config,
                       start);
    gather_outputs(&out);
    return encode_outputs(plans, out);
  }

  // save_weights / load_weights of a model inside an open window: refused
  // (Note [Window positions]), as the engine refuses a checkpoint there.
  void require_no_open_window(const char* op, const nlohmann::json& a) {
    if (!a.contains("model_id") || !a["model_id"].is_string()) return;
    auto it = windows.find(a["model_id"].get<std::string>());
    if (it == windows.end() || it->second.datums == 0) return;
    const int64_t n = it->second.datums;
    throw UsageError(std::string(op) + " on '" + it->first +
                     "' inside an open window (" + std::to_string(n) +
                     (n == 1 ? " datum" : " datums") +
                     " by forward_backward since its last optim_step). "
                     "Nothing was changed; call optim_step first");
  }

  CommandResult optim_step(const Caller& caller, const nlohmann::json& a) {
    Model& m = models.get(require_string(a, "model_id"), caller.tenant);
    nlohmann::json p;
    if (const nlohmann::json* adam = get_object(a, "adam_params")) {
      p = *adam;
    } else if (a.contains("optimizer_params")) {
      throw UsageError("optimizer_params of type '" +
                       get_or<std::string>(a["optimizer_params"], "type", "?") +
                       "' are not served: this server trains with AdamW "
                       "(send adam_params)");
    } else {
      throw UsageError("optim_step without adam_params");
    }
    // Every field is checked before anything else (a null is a NaN or an
    // infinity the SDK could not send): an error names it, nothing changes.
    StepOverrides o;
    o.lr = get_or<double>(p, "learning_rate", 1e-4, "adam_params.");
    o.beta1 = get_or<double>(p, "beta1", 0.9, "adam_params.");
    o.beta2 = get_or<double>(p, "beta2", 0.95, "adam_params.");
    o.eps = get_or<double>(p, "eps", 1e-12, "adam_params.");
    o.weight_decay = get_or<double>(p, "weight_decay", 0.0, "adam_params.");
    o.gradient_clipping =
        get_or<double>(p, "grad_clip_norm", 0.0, "adam_params.");
    auto win = windows.find(m.id);
    if (win == windows.end() || win->second.datums == 0)
      throw UsageError("optim_step on '" + m.id +
                       "' with no forward_backward "
                       "since its last optim_step: there is no gradient to "
                       "apply. Nothing was changed");
    check_step_overrides(o);  // before the partial row changes gradients
    const std::vector<PendingDatum> pending = std::move(win->second.pending);
    windows.erase(win);
    if (!pending.empty()) {
      // The window's last row (Note [Window positions]).
      const int r = comm->rank();
      torch::Tensor loss =
          r < static_cast<int>(pending.size())
              ? run_datum(m, pending[r].plan, pending[r].loss_fn,
                          pending[r].config)
                    .second.sum()
              : zero_loss(m);
      backward(m, loss);
    }
    m.engine->step(o);
    const uint64_t d = digest(m);
    return ok_json(
        {{"metrics",
          {{"param_digest_hi:unique", static_cast<double>(d >> 32)},
           {"param_digest_lo:unique", static_cast<double>(d & 0xffffffffu)},
           {"grad_norm:mean", m.engine->get_global_grad_norm()},
           {"global_steps:max",
            static_cast<double>(m.engine->global_steps())}}}});
  }

  CommandResult get_info(const Caller& caller, const nlohmann::json& a) {
    Model& m = models.get(require_string(a, "model_id"), caller.tenant);
    const uint64_t d = digest(m);
    int64_t trainable = 0;
    for (const torch::Tensor& p : m.engine->parameters())
      trainable += p.numel();
    nlohmann::json j = {
        {"type", "get_info"},
        {"model_id", m.id},
        {"model_name", m.base.name},
        {"model_data", model_data(m.base)},
        {"is_lora", m.lora.rank > 0},
        {"param_digest", digest_hex(d)},
        {"trainable_parameters", trainable},
        {"window_forward_backwards", m.engine->window_backwards()},
        {"window_datums",
         windows.count(m.id) ? windows.at(m.id).datums : int64_t{0}},
        {"global_steps", m.engine->global_steps()},
        {"zero_stage", config.zero.stage},
        {"world_size", comm->world_size()}};
    if (m.lora.rank > 0) j["lora_rank"] = m.lora.rank;
    return ok_json(j);
  }

  CommandResult dispatch(const Command& c) {
    if (c.op == "noop") {
      // Note [Checkpoint expiry] in retention.h: rank 0 sweeps while idle.
      if (comm->rank() == 0) checkpoints.sweep_expired();
      return CommandResult();
    }
    if (c.op == "shutdown") return CommandResult();
    const Caller& caller = c.caller;
    if (c.op == "create_model")
      return ok_json(models.create_model(c.args, caller.tenant));
    if (c.op == "forward_backward") return forward_backward(c);
    if (c.op == "optim_step") return optim_step(caller, c.args);
    if (c.op == "save_weights") {
      require_no_open_window("save_weights", c.args);
      return ok_json(checkpoints.save_weights(models, caller, c.args));
    }
    if (c.op == "load_weights") {
      require_no_open_window("load_weights", c.args);
      return ok_json(checkpoints.load_weights(models, caller, c.args));
    }
    if (c.op == "get_info") return get_info(caller, c.args);
    if (c.op == "save_weights_external") {
      require_no_open_window("save_weights_external", c.args);
      return ok_json(checkpoints.save_external(models, caller, c.args));
    }
    if (c.op == "save_weights_for_sampler")
      return ok_json(samplers.save_for_sampler(models, caller, c.args));
    // Sessions, sampling, listings and deletes are rank 0's alone
    // (sampling.h, checkpoints.h).
    if (std::optional<CommandResult> r = dispatch_rank0_only(c)) return *r;
    throw InternalError("unknown command '" + c.op + "'");
  }

  // The commands rank 0 alone serves: its result there, an empty one on
  // the other ranks; nullopt for any other command.
  std::optional<CommandResult> dispatch_rank0_only(const Command& c) {
    const Caller& caller = c.caller;
    const bool rank0 = comm->rank() == 0;
    if (c.op == "create_sampling_session")
      return rank0 ? ok_json(samplers.create_session(models, caller, c.args))
                   : CommandResult();
    if (c.op == "get_sampler")
      return rank0 ? ok_json(samplers.get_sampler(c.args)) : CommandResult();
    if (c.op == "sample") {
      if (!rank0) return CommandResult();
      CommandResult r;
      r.has_proto = true;
      r.proto = samplers.sample(models, caller, c.args);
      return r;
    }
    if (c.op == "list_checkpoints")
      return rank0 ? ok_json(checkpoints.list(caller, c.args))
                   : CommandResult();
    if (c.op == "delete_checkpoint" || c.op == "set_checkpoint_ttl") {
      if (!rank0) return CommandResult();
      nlohmann::json out = c.op == "delete_checkpoint"
                               ? checkpoints.remove(caller, c.args)
                               : checkpoints.set_ttl(caller, c.args);
      // The in-memory copy of sampler weights follows the files.
      samplers.forget(caller, out.at("path").get<std::string>());
      return ok_json(out);
    }
    if (c.op == "external_weights_files")
      return rank0 ? ok_json(checkpoints.external_files(caller, c.args))
                   : CommandResult();
    if (c.op == "list_training_runs")
      return rank0 ? ok_json(checkpoints.runs(models, caller, c.args))
                   : CommandResult();
    if (c.op == "get_training_run")
      return rank0 ? ok_json(checkpoints.run(models, caller, c.args))
                   : CommandResult();
    if (c.op == "copy_weights")
      return rank0 ? ok_json(checkpoints.copy(caller, c.args))
                   : CommandResult();
    if (c.op == "weights_info")
      return rank0 ? ok_json(checkpoints.weights_info(caller, c.args))
                   : CommandResult();
    return std::nullopt;
  }
};

RankTrainer::RankTrainer(Communicator* comm, const TrainerOptions& options)
    : impl_(new Impl(comm, options)) {}

RankTrainer::~RankTrainer() = default;

CommandResult RankTrainer::execute(const Command& command) {
  try {
    return impl_->dispatch(command);
  } catch (const CommError& e) {
    return CommandResult::failure(e.what(), "server");
  } catch (const InternalError& e) {
    return CommandResult::failure(e.what(), "server");
  } catch (const NotFound& e) {
    CommandResult r = CommandResult::failure(e.what(), "user");
    r.http_status = 404;
    return r;
  } catch (const Error& e) {  // UsageError, ConfigError, IoError
    return CommandResult::failure(e.what(), "user");
  } catch (const c10::Error& e) {
    return CommandResult::failure(
        std::string("LibTorch failed: ") + e.what_without_backtrace(),
        "server");
  } catch (const std::exception& e) {
    return CommandResult::failure(e.what(), "server");
  }
}

}  // namespace tinker
}  // namespace zerostep
