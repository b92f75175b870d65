// ModelRegistry: this rank's replicas of the trainer server's models, by
// model id. Each is a TinyGpt of a base model (same weights on every rank
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
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/communicator.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/lora.h"
#include "models/tiny_gpt.h"
#include "tools/tinker/base_model.h"

namespace zerostep {
namespace tinker {

// One model's replica on this rank.
struct Model {
  std::string id;
  BaseModel base;
  LoraOptions lora;  // rank 0: full fine-tuning
  TinyGpt net{nullptr};
  std::unique_ptr<Engine> engine;
};

// `lora` as the "lora" object of checkpoint and sampler metadata, and back
// (the keys rank, alpha, seed, train_attn, train_mlp, train_unembed).
nlohmann::json lora_to_json(const LoraOptions& lora);
LoraOptions lora_from_json(const nlohmann::json& l);

// A TinyGpt of `base` with `lora` adapters (rank 0: none), its weights
// drawn from `seed` under the process-wide construction lock: what build()
// starts from, and the shape of a sampler's copy (sampling.h).
TinyGpt new_tiny_gpt(const BaseModel& base, const LoraOptions& lora,
                     uint64_t seed);

class ModelRegistry {
 public:
  // Every model's Engine gets `config` and runs on `*comm`, which must
  // outlive the registry; every base model's weights come from `base_seed`.
  ModelRegistry(Communicator* comm, const Config& config, uint64_t base_seed);
  ModelRegistry(const ModelRegistry&) = delete;
  ModelRegistry& operator=(const ModelRegistry&) = delete;

  // The model `id`. UsageError naming the models on this server if there
  // is none.
  Model& get(const std::string& id);
  bool contains(const std::string& id) const;
  uint64_t base_seed() const { return base_seed_; }

  // A new model, not registered: the base model's weights, LoRA adapters
  // when lora.rank > 0 (then only they train), rank 0's values of the
  // frozen weights (a collective: every rank calls it), an Engine over it.
  std::unique_ptr<Model> build(const std::string& id, const BaseModel& base,
                               const LoraOptions& lora);
  // Registers `model` under its id, which must not be registered yet.
  void add(std::unique_ptr<Model> model);

  // The create_model request: checks every field (UsageError, nothing
  // built), builds the model and registers it. Returns the response.
  nlohmann::json create_model(const nlohmann::json& args);

 private:
  Communicator* comm_;
  Config config_;
  uint64_t base_seed_;
  std::map<std::string, std::unique_ptr<Model>> models_;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_MODEL_REGISTRY_H_
