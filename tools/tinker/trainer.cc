#include "tools/tinker/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

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
  parse_config(out, world_size);  // every other problem, reported at once
  return out;
}

struct RankTrainer::Impl {
  Impl(Communicator* comm, const TrainerOptions& options)
      : comm(comm),
        config(parse_config(
            server_ds_config(options.ds_config_json, comm->world_size()),
            comm->world_size())),
        models(comm, config, options.base_seed),
        checkpoints(comm, options.state_dir),
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

  // Note [Bitwise splitting] in trainer.h: datum j goes to rank j % W in
  // row j / W; every rank runs one forward and backward() per row.
  CommandResult forward_backward(const Command& c) {
    const ForwardBackwardIn in = decode_forward_backward(c.blob);
    Model& m = models.get(in.model_id);
    const std::vector<DatumPlan> plans = plan_forward_backward(in, m.base);
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
    const PpoClip clip = ppo_clip(in.loss_fn_config);
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t j = row * w + r;
      torch::Tensor loss;
      {
        torch::AutoGradMode grad_mode(!in.forward_only);
        if (j < n) {
          const DatumPlan& p = plans[j];
          torch::Tensor logits = m.net->forward(p.tokens)[0];  // [T, V]
          torch::Tensor lp = target_logprobs(logits, p.targets);
          torch::Tensor elementwise = elementwise_loss(in.loss_fn, lp, p, clip);
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
          loss =
              m.net->forward(torch::zeros({1, 1}, torch::kInt64)).sum() * 0.0;
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
      outs[j].logprobs.assign(lp_all.begin() + offset[j],
                              lp_all.begin() + offset[j + 1]);
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
    Model& m = models.get(require_string(a, "model_id"));
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
    if (m.engine->window_backwards() == 0)
      throw UsageError("optim_step on '" + m.id +
                       "' with no forward_backward "
                       "since its last optim_step: there is no gradient to "
                       "apply. Nothing was changed");
    m.engine->step(o);  // UsageError on bad values, before anything changes
    const uint64_t d = digest(m);
    return ok_json(
        {{"metrics",
          {{"param_digest_hi:unique", static_cast<double>(d >> 32)},
           {"param_digest_lo:unique", static_cast<double>(d & 0xffffffffu)},
           {"grad_norm:mean", m.engine->get_global_grad_norm()},
           {"global_steps:max",
            static_cast<double>(m.engine->global_steps())}}}});
  }

  CommandResult get_info(const nlohmann::json& a) {
    Model& m = models.get(require_string(a, "model_id"));
    const uint64_t d = digest(m);
    int64_t trainable = 0;
    for (const torch::Tensor& p : m.engine->parameters())
      trainable += p.numel();
    nlohmann::json j = {
        {"type", "get_info"},
        {"model_id", m.id},
        {"model_name", m.base.name},
        {"model_data",
         {{"arch", "zerostep-tiny-gpt"}, {"model_name", m.base.name}}},
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
    if (c.op == "create_model") return ok_json(models.create_model(c.args));
    if (c.op == "forward_backward") return forward_backward(c);
    if (c.op == "optim_step") return optim_step(c.args);
    if (c.op == "save_weights")
      return ok_json(checkpoints.save_weights(models, c.args));
    if (c.op == "load_weights")
      return ok_json(checkpoints.load_weights(models, c.args));
    if (c.op == "get_info") return get_info(c.args);
    if (c.op == "save_weights_for_sampler")
      return ok_json(samplers.save_for_sampler(models, c.args));
    // Sessions and sampling are rank 0's alone (sampling.h).
    const bool rank0 = comm->rank() == 0;
    if (c.op == "create_sampling_session")
      return rank0 ? ok_json(samplers.create_session(models, c.args))
                   : CommandResult();
    if (c.op == "get_sampler")
      return rank0 ? ok_json(samplers.get_sampler(c.args)) : CommandResult();
    if (c.op == "sample") {
      if (!rank0) return CommandResult();
      CommandResult r;
      r.has_proto = true;
      r.proto = samplers.sample(models, c.args);
      return r;
    }
    throw InternalError("unknown command '" + c.op + "'");
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
