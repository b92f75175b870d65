#include "tools/tinker/checkpoints.h"

#include <cctype>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "tools/tinker/command.h"
#include "tools/tinker/request_fields.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {

CheckpointStore::CheckpointStore(Communicator* comm, std::string state_dir)
    : comm_(comm), state_dir_(std::move(state_dir)) {}

std::string CheckpointStore::run_folder(const std::string& model_id) const {
  return state_dir_ + "/" + model_folder(model_id);
}

bool CheckpointStore::agree(bool mine) {
  int64_t v = mine ? 1 : 0;
  comm_->broadcast(Buffer::of(&v, 1), {0, phase::kSetup});
  return v != 0;
}

nlohmann::json CheckpointStore::save_weights(ModelRegistry& models,
                                             const nlohmann::json& a) {
  Model& m = models.get(require_string(a, "model_id"));
  const std::string name = get_or<std::string>(a, "path", "");
  if (!safe_checkpoint_name(name))
    throw UsageError("save_weights name (field 'path') '" + elide(name, 140) +
                     "' must be 1-128 "
                     "characters of [A-Za-z0-9._-] (and not 'latest')");
  const std::string dir = run_folder(m.id);
  const std::string tinker_path = "tinker://" + m.id + "/weights/" + name;
  if (!agree(comm_->rank() != 0 || within_dir(state_dir_, dir + "/" + name)))
    throw UsageError("checkpoint '" + tinker_path +
                     "' would leave this server's state directory (a "
                     "symbolic link?). Nothing was written");
  const bool exists =
      agree(std::ifstream(dir + "/" + name + "/manifest.json").good());
  if (exists && !get_or<bool>(a, "overwrite", false))
    throw UsageError("checkpoint '" + name + "' of " + m.id +
                     " exists. Fix: "
                     "pass overwrite=True or choose another name");
  try {
    m.engine->save_checkpoint(dir, name);
  } catch (const IoError& e) {
    throw IoError(
        scrub_path(scrub_path(e.what(), dir + "/" + name, tinker_path),
                   state_dir_, "<state dir>"));
  }
  if (comm_->rank() == 0) {
    nlohmann::json meta = {{"base_model", m.base.name},
                           {"model_id", m.id},
                           {"lora", lora_to_json(m.lora)}};
    atomic_write_file(dir + "/" + name + "/tinker_meta.json", meta.dump(1));
  }
  return {{"path", tinker_path}, {"type", "save_weights"}};
}

CheckpointStore::CheckpointRef CheckpointStore::resolve(
    const std::string& path) {
  std::string model_id, name;
  if (!parse_tinker_path(path, &model_id, &name))
    throw UsageError(
        "path '" + path +
        "' is not a training checkpoint of "
        "this server: expected tinker://<model id>/weights/<name>");
  CheckpointRef ref{run_folder(model_id), name, {}};
  bool ok = false;
  if (comm_->rank() == 0 && within_dir(state_dir_, ref.dir + "/" + ref.name)) {
    try {
      ref.meta = nlohmann::json::parse(
          read_file(ref.dir + "/" + ref.name + "/tinker_meta.json"));
      ok = ref.meta.is_object() && ref.meta.contains("base_model");
    } catch (const std::exception&) {
    }
  }
  // Rank 0's answer and meta, everyone's. The message names the client's
  // path only, never a server file.
  if (!agree(ok))
    throw UsageError("checkpoint '" + path +
                     "' cannot be read: this server has no such checkpoint "
                     "(see save_state)");
  std::string meta = ref.meta.dump();
  broadcast_bytes(*comm_, &meta);
  ref.meta = nlohmann::json::parse(meta);
  return ref;
}

nlohmann::json CheckpointStore::load_weights(ModelRegistry& models,
                                             const nlohmann::json& a) {
  const std::string path = require_string(a, "path");
  const std::string id = require_string(a, "model_id");
  CheckpointRef ref = resolve(path);
  const std::string base_name = ref.meta.at("base_model").get<std::string>();
  const LoraOptions lora = lora_from_json(ref.meta.at("lora"));
  std::unique_ptr<Model> created;
  Model* m = nullptr;
  if (get_or<bool>(a, "create", false)) {
    const std::string asked = get_or<std::string>(a, "base_model", "");
    if (!asked.empty() && asked != base_name)
      throw UsageError("base_model '" + asked +
                       "' does not match checkpoint '" + path +
                       "', which holds " + base_name +
                       " (this server's base models differ in shape). Fix: "
                       "omit base_model or pass " +
                       base_name + ". Nothing was changed");
    if (models.contains(id))
      throw UsageError("model '" + id + "' exists already");
    created = models.build(id, find_base_model(base_name), lora);
    m = created.get();
  } else {
    m = &models.get(id);
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
  try {
    m->engine->load_checkpoint(ref.dir, ref.name, lo);
  } catch (const IoError& e) {
    throw IoError(
        scrub_path(scrub_path(e.what(), ref.dir + "/" + ref.name, path),
                   state_dir_, "<state dir>"));
  } catch (const UsageError& e) {
    throw UsageError(
        scrub_path(scrub_path(e.what(), ref.dir + "/" + ref.name, path),
                   state_dir_, "<state dir>"));
  }
  if (created) models.add(std::move(created));
  return {{"path", path}, {"model_id", id}, {"type", "load_weights"}};
}

}  // namespace tinker
}  // namespace zerostep
