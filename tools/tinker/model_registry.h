// ModelRegistry: this rank's replicas of the trainer server's models, by
// model id. Each is a decoder of a base model (a TinyGpt preset, or a
// Hugging Face folder's Llama/Qwen decoder: the same weights on every rank
// and for every model of that base), with LoRA adapters of the request's
// rank on its linear layers and every base weight frozen (no lora_config:
// full fine-tuning), under an Engine.
//
// Thread safety: one rank's thread only. Building a model takes a
// process-wide lock (torch's global RNG is shared by the simulator's rank
// threads).
#ifndef ZEROSTEP_TOOLS_TINKER_MODEL_REGISTRY_H_
#define ZEROSTEP_TOOLS_TINKER_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "common/cli.h"  // AvailableMemory
#include "config/config.h"
#include "engine/engine.h"
#include "models/causal_lm.h"
#include "models/hf_decoder.h"
#include "models/lora.h"
#include "models/tiny_gpt.h"
#include "tools/tinker/base_model.h"

namespace zerostep {
namespace tinker {

// A decoder the server trains or samples: a TinyGpt or an HfCausalLm, as
// the module the Engine and torch::save see and as the CausalLm the
// trainer and the sampler call (the same object).
struct Net {
  std::shared_ptr<torch::nn::Module> module;
  CausalLm* lm = nullptr;
  explicit operator bool() const { return module != nullptr; }
};

// How new_net fills the base weights.
enum class NetWeights {
  kBase,     // the base model's: a preset's from the seed, a folder's read
  kAnyValues,  // a preset's from the seed, a folder's left uninitialised
               // (the caller copies every parameter in)
  kMeta,     // a folder's on the meta device (no memory; shapes only)
};

// One model's replica on this rank.
struct Model {
  std::string id;
  std::string tenant;  // whose it is (tenancy.h)
  BaseModel base;
  LoraOptions lora;  // rank 0: full fine-tuning
  Net net;
  std::unique_ptr<Engine> engine;
  // create_model's user_metadata (an object of strings) or null; kept in
  // its checkpoints' tinker_meta.json and shown by the training run.
  nlohmann::json user_metadata;
  // When a request last named the model (get()), Unix seconds.
  int64_t last_request_unix = 0;
};

// get_info's model_data of a model of `base`: {arch, model_name,
// tokenizer_id}; tokenizer_id is a folder's path (the SDK's get_tokenizer()
// hands it to transformers' AutoTokenizer, which loads a local folder
// without a network), null for a preset (its tokens are bytes).
nlohmann::json model_data(const BaseModel& base);

// `lora` as the "lora" object of checkpoint and sampler metadata, and back
// (the keys rank, alpha, seed, train_attn, train_mlp, train_unembed).
nlohmann::json lora_to_json(const LoraOptions& lora);
LoraOptions lora_from_json(const nlohmann::json& l);

// A TinyGpt of `base` with `lora` adapters (rank 0: none), its weights
// drawn from `seed` under the process-wide construction lock: what build()
// starts from, and the shape of a sampler's copy (sampling.h).
TinyGpt new_tiny_gpt(const BaseModel& base, const LoraOptions& lora,
                     uint64_t seed);

// Note [LoRA on Hugging Face folders]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A folder's decoder gets PEFT-named adapters (models/hf_decoder.h):
// train_attn adapts q_proj, k_proj, v_proj and o_proj, train_mlp
// gate_proj, up_proj and down_proj, train_unembed lm_head (tied or not:
// Note [The head's LoRA] in models/hf_decoder.h), as on the toys; the
// adapters' A matrices come from the request's seed, B is zero (the model
// starts as the base). Any one of the three alone is valid; none is
// refused (create_model).

// `lora` as a folder's decoder takes it (Note [LoRA on Hugging Face
// folders]).
HfLoraOptions hf_lora_options(const LoraOptions& lora);

// The decoder of `base` with `lora` adapters (rank 0: none): new_tiny_gpt,
// or a folder's decoder (Note [LoRA on Hugging Face folders]) with weights
// as `weights` says. UsageError/IoError if the folder cannot be read.
Net new_net(const BaseModel& base, const LoraOptions& lora, uint64_t seed,
            NetWeights weights = NetWeights::kBase);

// Note [A model that cannot fit]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A create_model (or a load that creates) allocates a replica and an
// Engine on every rank; in a simulated world every rank shares this
// process, so a model too large for the world (small-gpt, every
// parameter trained, on 4096 simulated ranks: about 15 GB at stage 0) ran
// the process out of memory, and the kernel's kill took every session with
// it. Before building, rank 0
// compares a floor of the model's memory with what the process may still
// take, and every rank refuses the request (UsageError, nothing built) when
// it does not fit. The floor per rank, in float32 bytes of P trainable
// and F frozen parameters over W ranks: 4F (the frozen weights, replicated)
// plus the trainable weights, gradients and Adam's two moments as ZeRO
// splits them: 16P at stage 0, 8P + 8P/W at stage 1, 4P + 12P/W at stage 2,
// 16P/W at stage 3 (mixed precision and the engine's own buffers only add).
// Times the ranks in this process. A model that passes can still run out;
// one refused could not have fit. (Measured, AMD EPYC, 2026-12-02: small-
// gpt trained in full at stage 0 on 64 simulated ranks grew the server's
// resident memory by 4.6 MB per rank at its creation, before any training
// touched its buffers; its floor is 3.9 MB.)
struct MemoryCheck {
  int ranks_in_process = 1;
  // What the process may still take; nullopt (or no function): not checked.
  std::function<std::optional<AvailableMemory>()> available;
};

class ModelRegistry {
 public:
  // Every model's Engine gets `config` and runs on `*comm`, which must
  // outlive the registry; every base model's weights come from `base_seed`;
  // `memory` is Note [A model that cannot fit]'s check.
  ModelRegistry(Communicator* comm, const Config& config, uint64_t base_seed,
                MemoryCheck memory = {});
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // The model `id` of `tenant`. UsageError naming the tenant's models if
  // there is none; another tenant's model is answered the same way (Note
  // [One tenant check] in tenancy.h).
  Model& get(const std::string& id, const std::string& tenant);
  // Whether any tenant has a model `id` (ids are unique on a server).
  bool contains(const std::string& id) const;
  // `tenant`'s model `id`, or nullptr (for listings; never throws).
  const Model* find(const std::string& id, const std::string& tenant) const;
  uint64_t base_seed() const { return base_seed_; }

  // A new model, not registered: the base model's weights, LoRA adapters
  // when lora.rank > 0 (then only they train), rank 0's values of the
  // frozen weights (a collective: every rank calls it), an Engine over it.
  // UsageError on every rank, nothing built, when it cannot fit (Note [A
  // model that cannot fit]).
  std::unique_ptr<Model> build(const std::string& id,
                               const std::string& tenant,
                               const BaseModel& base, const LoraOptions& lora);
  // Registers `model` under its id, which must not be registered yet.
  void add(std::unique_ptr<Model> model);

  // The create_model request of `tenant`: checks every field (UsageError,
  // nothing built), builds the model and registers it. Returns the
  // response.
  nlohmann::json create_model(const nlohmann::json& args,
                              const std::string& tenant);

 private:
  // Note [A model that cannot fit]: rank 0 decides, every rank throws.
  void require_fits(const std::string& id, const BaseModel& base,
                    const LoraOptions& lora);

  Communicator* comm_;
  Config config_;
  uint64_t base_seed_;
  MemoryCheck memory_;
  std::map<std::string, std::unique_ptr<Model>> models_;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_MODEL_REGISTRY_H_
