#include "tools/tinker/model_registry.h"

#include <torch/torch.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "common/errors.h"
#include "tools/tinker/request_fields.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {
namespace {

std::mutex g_construction_mu;  // torch's global RNG, shared by rank threads

}  // namespace

nlohmann::json model_data(const BaseModel& base) {
  return {{"arch", base.arch},
          {"model_name", base.name},
          {"tokenizer_id",
           base.is_hf() ? nlohmann::json(base.hf_dir) : nlohmann::json()}};
}

nlohmann::json lora_to_json(const LoraOptions& lora) {
  return {{"rank", lora.rank},     {"alpha", lora.alpha},
          {"seed", lora.seed},     {"train_attn", lora.attn},
          {"train_mlp", lora.mlp}, {"train_unembed", lora.unembed}};
}

LoraOptions lora_from_json(const nlohmann::json& l) {
  LoraOptions o;
  o.rank = l.at("rank").get<int64_t>();
  o.alpha = l.at("alpha").get<double>();
  o.seed = l.at("seed").get<uint64_t>();
  o.attn = l.at("train_attn").get<bool>();
  o.mlp = l.at("train_mlp").get<bool>();
  o.unembed = l.at("train_unembed").get<bool>();
  return o;
}

TinyGpt new_tiny_gpt(const BaseModel& base, const LoraOptions& lora,
                     uint64_t seed) {
  TinyGptOptions o;
  o.vocab_size = base.vocab_size;
  o.block_size = base.max_context;
  o.d_model = base.d_model;
  o.n_head = base.n_head;
  o.n_layer = base.n_layer;
  o.lora = lora;
  std::lock_guard<std::mutex> lock(g_construction_mu);
  torch::manual_seed(seed);
  return TinyGpt(o);
}

HfLoraOptions hf_lora_options(const LoraOptions& lora) {
  HfLoraOptions o;
  if (lora.rank <= 0) return o;
  o.rank = lora.rank;
  o.alpha = lora.alpha;
  o.seed = lora.seed;
  o.target_modules.clear();
  if (lora.attn)
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
      o.target_modules.push_back(p);
  if (lora.mlp)
    for (const char* p : {"gate_proj", "up_proj", "down_proj"})
      o.target_modules.push_back(p);
  if (lora.unembed) o.target_modules.push_back("lm_head");
  return o;
}

Net new_net(const BaseModel& base, const LoraOptions& lora, uint64_t seed,
            NetWeights weights) {
  Net net;
  if (!base.is_hf()) {
    TinyGpt m = new_tiny_gpt(base, lora, seed);
    net.lm = m.get();
    net.module = m.ptr();
    return net;
  }
  HfDecoderOptions o;
  o.lora = hf_lora_options(lora);
  HfCausalLm m{nullptr};
  if (weights == NetWeights::kBase) {
    m = load_hf_decoder(base.hf_dir, o);
  } else {
    if (weights == NetWeights::kMeta) o.device = torch::kMeta;
    m = make_hf_decoder(read_hf_config(base.hf_dir), o);
  }
  net.lm = m.get();
  net.module = m.ptr();
  return net;
}

ModelRegistry::ModelRegistry(Communicator* comm, const Config& config,
                             uint64_t base_seed, MemoryCheck memory)
    : comm_(comm),
      config_(config),
      base_seed_(base_seed),
      memory_(std::move(memory)) {}

Model& ModelRegistry::get(const std::string& id, const std::string& tenant) {
  auto it = models_.find(id);
  if (it != models_.end() && it->second->tenant == tenant) {
    it->second->last_request_unix =
        std::chrono::duration_cast<std::chrono::seconds>(
            std::chrono::system_clock::now().time_since_epoch())
            .count();
    return *it->second;
  }
  std::string names;
  for (const auto& kv : models_)
    if (kv.second->tenant == tenant)
      names += (names.empty() ? "" : ", ") + kv.first;
  throw UsageError("unknown model_id '" + elide(id, 200) +
                   "' (your models on this server: " +
                   (names.empty() ? "none" : elide(names, 2000)) +
                   "). Fix: create_model first");
}

bool ModelRegistry::contains(const std::string& id) const {
  return models_.count(id) != 0;
}

const Model* ModelRegistry::find(const std::string& id,
                                 const std::string& tenant) const {
  auto it = models_.find(id);
  if (it == models_.end() || it->second->tenant != tenant) return nullptr;
  return it->second.get();
}

void ModelRegistry::require_fits(const std::string& id, const BaseModel& base,
                                 const LoraOptions& lora) {
  // Every rank has the same options, so with no check configured no rank
  // checks, and there is nothing to agree on (no broadcast).
  if (!memory_.available) return;
  std::string refusal;
  const std::optional<AvailableMemory> available =
      comm_->rank() == 0 ? memory_.available() : std::nullopt;
  if (available) {
    // The model's parameters, trainable and frozen: one replica, on rank 0
    // (a folder's on the meta device).
    Net probe = new_net(base, lora, base_seed_, NetWeights::kMeta);
    if (lora.rank > 0) freeze_all_but_lora(*probe.module);
    double trainable = 0, frozen = 0;
    for (const torch::Tensor& p : probe.module->parameters())
      (p.requires_grad() ? trainable : frozen) +=
          static_cast<double>(p.numel());
    const double w = comm_->world_size();
    const int stage = config_.zero.stage;
    const double per_trainable = stage == 0   ? 16.0
                                 : stage == 1 ? 8.0 + 8.0 / w
                                 : stage == 2 ? 4.0 + 12.0 / w
                                              : 16.0 / w;
    const double per_rank = 4.0 * frozen + per_trainable * trainable;
    const double need = per_rank * memory_.ranks_in_process;
    if (need > static_cast<double>(available->bytes)) {
      std::ostringstream m;
      m.precision(3);
      const double gib = 1024.0 * 1024.0 * 1024.0;
      m << "model '" << id << "' (" << base.name << ", "
        << static_cast<int64_t>(trainable) << " trainable and "
        << static_cast<int64_t>(frozen) << " frozen parameters, ZeRO stage "
        << stage << ") needs at least " << need / gib << " GiB on the "
        << memory_.ranks_in_process << " rank(s) in this server's process ("
        << per_rank / (1024.0 * 1024.0) << " MiB each), and the process may "
        << "take " << static_cast<double>(available->bytes) / gib << " GiB ("
        << available->source
        << "). Nothing was created. Fix: use LoRA (the base weights then "
           "do not train), a smaller base model, fewer models, or restart "
           "the server with fewer --world ranks or a higher ZeRO stage";
      refusal = m.str();
    }
  }
  int64_t refused = refusal.empty() ? 0 : 1;
  comm_->broadcast(Buffer::of(&refused, 1), {0, phase::kSetup});
  if (refused == 0) return;
  if (comm_->rank() == 0) throw UsageError(refusal);
  throw UsageError("model '" + id +
                   "' cannot fit in this server's memory (rank 0 says "
                   "why). Nothing was created");
}

std::unique_ptr<Model> ModelRegistry::build(const std::string& id,
                                            const std::string& tenant,
                                            const BaseModel& base,
                                            const LoraOptions& lora) {
  require_fits(id, base, lora);
  auto m = std::make_unique<Model>();
  m->id = id;
  m->tenant = tenant;
  m->base = base;
  m->lora = lora;
  m->net = new_net(base, lora, base_seed_);
  if (lora.rank > 0) freeze_all_but_lora(*m->net.module);
  // Frozen weights are not the engine's: make rank 0's values everyone's
  // (they are equal by construction; this keeps real multi-process runs
  // honest whatever the ranks' torch builds).
  for (torch::Tensor& p : m->net.module->parameters()) {
    if (p.requires_grad()) continue;
    comm_->broadcast(
        Buffer::of(p.data_ptr<float>(), static_cast<size_t>(p.numel())),
        {0, phase::kSetup});
  }
  m->engine = std::make_unique<Engine>(m->net.module, config_, comm_);
  return m;
}

void ModelRegistry::add(std::unique_ptr<Model> model) {
  ZS_CHECK(model != nullptr);
  ZS_CHECK(!contains(model->id));
  const std::string id = model->id;
  models_[id] = std::move(model);
}

nlohmann::json ModelRegistry::create_model(const nlohmann::json& a,
                                           const std::string& tenant) {
  const std::string id = require_string(a, "model_id");
  if (contains(id)) throw UsageError("model '" + id + "' exists already");
  const BaseModel& base = find_base_model(require_string(a, "base_model"));
  if (const nlohmann::json* oc = get_object(a, "optimizer_config")) {
    const std::string t =
        get_or<std::string>(*oc, "type", "adamw", "optimizer_config.");
    if (t != "adamw")
      throw UsageError("optimizer_config.type '" + t +
                       "' is not served: "
                       "this server trains with decoupled AdamW ('adamw')");
  }
  LoraOptions lora;
  if (const nlohmann::json* lc = get_object(a, "lora_config")) {
    const nlohmann::json& l = *lc;
    lora.rank = get_or<int64_t>(l, "rank", 0, "lora_config.");
    if (lora.rank < 1 || lora.rank > base.d_model)
      throw UsageError("lora_config.rank = " + std::to_string(lora.rank) +
                       " must be in [1, " + std::to_string(base.d_model) +
                       "] for " + base.name);
    // seed is optional in the SDK (None: the server's choice), so a null
    // seed is the default, not an error.
    if (!(l.contains("seed") && l["seed"].is_null()))
      lora.seed = get_or<uint64_t>(l, "seed", 0, "lora_config.");
    lora.attn = get_or<bool>(l, "train_attn", true, "lora_config.");
    lora.mlp = get_or<bool>(l, "train_mlp", true, "lora_config.");
    lora.unembed = get_or<bool>(l, "train_unembed", true, "lora_config.");
    if (!lora.attn && !lora.mlp && !lora.unembed)
      throw UsageError(
          "lora_config trains nothing: set one of train_attn, "
          "train_mlp, train_unembed");
  }
  // user_metadata: the SDK's dict[str, Any]; the REST types hold strings.
  nlohmann::json metadata = nullptr;
  if (const nlohmann::json* um = get_object(a, "user_metadata")) {
    metadata = nlohmann::json::object();
    for (const auto& kv : um->items())
      metadata[kv.key()] = kv.value().is_string()
                               ? kv.value().get<std::string>()
                               : kv.value().dump();
  }
  std::unique_ptr<Model> m = build(id, tenant, base, lora);
  m->user_metadata = std::move(metadata);
  m->last_request_unix = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  add(std::move(m));
  return {{"model_id", id}, {"type", "create_model"}};
}

}  // namespace tinker
}  // namespace zerostep
