#include "tools/tinker/checkpoints.h"

#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "tools/tinker/command.h"
#include "tools/tinker/request_fields.h"
#include "zero/phase.h"

namespace zerostep {
namespace tinker {
namespace {

namespace fs = std::filesystem;

// The UTC time of `path`'s last change, ISO 8601 (the SDK's datetime).
std::string mtime_iso(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "1970-01-01T00:00:00Z";
  std::tm tm{};
  gmtime_r(&st.st_mtime, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// One listed checkpoint (the SDK's Checkpoint) and its sort key.
struct Listed {
  std::string time;
  nlohmann::json entry;
};

// The checkpoints in one run folder of a tenant: training checkpoints
// (<run>/<name>/manifest.json) and sampler weights
// (<run>/sampler_weights/<name>/weights.pt), named by the model id their
// tinker_meta.json records (the folder name is the id with ':' made '_').
void list_run(const std::string& run, std::vector<Listed>* out) {
  auto add = [&](const std::string& dir, const std::string& name,
                 const std::string& kind, const std::string& type,
                 const std::string& marker) {
    std::error_code ec;
    if (!fs::is_regular_file(dir + "/" + marker, ec)) return;
    std::string model_id = fs::path(run).filename().string();
    try {
      const nlohmann::json meta =
          nlohmann::json::parse(read_file(dir + "/tinker_meta.json"));
      model_id = meta.at("model_id").get<std::string>();
    } catch (const std::exception&) {
      return;  // not one of this server's (or being written)
    }
    const std::string time = mtime_iso(dir + "/" + marker);
    out->push_back(
        {time,
         {{"checkpoint_id", kind + "/" + name},
          {"checkpoint_type", type},
          {"time", time},
          {"tinker_path", "tinker://" + model_id + "/" + kind + "/" + name},
          {"size_bytes", tree_bytes(dir)},
          {"public", false},
          {"training_run_id", model_id}}});
  };
  std::error_code ec;
  for (fs::directory_iterator it(run, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!safe_checkpoint_name(name)) continue;  // .tmp, .old, latest
    if (name == "sampler_weights") {
      std::error_code e2;
      for (fs::directory_iterator s(it->path(), e2), send; !e2 && s != send;
           s.increment(e2)) {
        const std::string sn = s->path().filename().string();
        if (safe_checkpoint_name(sn))
          add(s->path().string(), sn, "sampler_weights", "sampler",
              "weights.pt");
      }
      continue;
    }
    add(it->path().string(), name, "weights", "training", "manifest.json");
  }
}

}  // namespace

uint64_t checkpoint_bytes_bound(Model& m, int stage, int world) {
  uint64_t numel = 0, tensors = 0;
  for (const torch::Tensor& p : m.engine->parameters()) {
    numel += static_cast<uint64_t>(p.numel());
    ++tensors;
  }
  const uint64_t w = static_cast<uint64_t>(world);
  // Padding: at most one quantum of 16 elements per rank for each padded
  // range (the whole buffer, or each stage 3 group: at most one per
  // tensor).
  const uint64_t padded = numel + (tensors + 1) * 16 * w;
  const uint64_t owned = (stage == 0 ? w : 1) * padded;
  const uint64_t rank_files = w * (64 + 256 + 80 * (tensors + 2));
  const uint64_t manifest = 4096 + 32 * tensors + 128 * w;
  const uint64_t meta_and_latest = 4096;
  return 12 * owned + rank_files + manifest + meta_and_latest;
}

CheckpointStore::CheckpointStore(Communicator* comm, std::string state_dir,
                                 int stage)
    : comm_(comm), state_dir_(std::move(state_dir)), stage_(stage) {}

bool CheckpointStore::agree(bool mine) {
  int64_t v = mine ? 1 : 0;
  comm_->broadcast(Buffer::of(&v, 1), {0, phase::kSetup});
  return v != 0;
}

nlohmann::json CheckpointStore::save_weights(ModelRegistry& models,
                                             const Caller& caller,
                                             const nlohmann::json& a) {
  Model& m = models.get(require_string(a, "model_id"), caller.tenant);
  const std::string name = get_or<std::string>(a, "path", "");
  if (!safe_checkpoint_name(name) || name == "sampler_weights")
    throw UsageError("save_weights name (field 'path') '" + elide(name, 140) +
                     "' must be 1-128 "
                     "characters of [A-Za-z0-9._-] (and not 'latest' or "
                     "'sampler_weights')");
  const std::string tinker_path = "tinker://" + m.id + "/weights/" + name;
  const CheckpointLocation at =
      *locate_checkpoint(state_dir_, caller.tenant, tinker_path, "weights");
  if (!agree(comm_->rank() != 0 || within_dir(state_dir_, at.dir)))
    throw UsageError("checkpoint '" + tinker_path +
                     "' would leave this server's state directory (a "
                     "symbolic link?). Nothing was written");
  const bool exists = agree(std::ifstream(at.dir + "/manifest.json").good());
  if (exists && !get_or<bool>(a, "overwrite", false))
    throw UsageError("checkpoint '" + name + "' of " + m.id +
                     " exists. Fix: "
                     "pass overwrite=True or choose another name");
  if (caller.max_bytes) {
    std::string refusal;
    if (comm_->rank() == 0) {
      const uint64_t held = tree_bytes(tenant_dir(state_dir_, caller.tenant));
      const uint64_t replaced = exists ? tree_bytes(at.dir) : 0;
      refusal = over_bytes_quota(
          caller, "save_weights '" + name + "'", held - std::min(held, replaced),
          checkpoint_bytes_bound(m, stage_, comm_->world_size()));
    }
    if (!agree(refusal.empty())) {
      if (comm_->rank() == 0) throw UsageError(refusal);
      throw UsageError("save_weights '" + name +
                       "' is over the tenant's quota (rank 0 says how "
                       "much). Nothing was written");
    }
  }
  try {
    m.engine->save_checkpoint(at.run, name);
  } catch (const IoError& e) {
    throw IoError(scrub_path(scrub_path(e.what(), at.dir, tinker_path),
                             state_dir_, "<state dir>"));
  }
  if (comm_->rank() == 0) {
    nlohmann::json meta = {{"base_model", m.base.name},
                           {"model_id", m.id},
                           {"lora", lora_to_json(m.lora)}};
    atomic_write_file(at.dir + "/tinker_meta.json", meta.dump(1));
  }
  return {{"path", tinker_path}, {"type", "save_weights"}};
}

CheckpointStore::CheckpointRef CheckpointStore::resolve(
    const Caller& caller, const std::string& path) {
  const std::optional<CheckpointLocation> at =
      locate_checkpoint(state_dir_, caller.tenant, path, "weights");
  if (!at)
    throw UsageError(
        "path '" + elide(path, 200) +
        "' is not a training checkpoint of "
        "this server: expected tinker://<model id>/weights/<name>");
  CheckpointRef ref{at->run, at->name, {}};
  bool ok = false;
  if (comm_->rank() == 0 && within_dir(state_dir_, at->dir)) {
    try {
      ref.meta =
          nlohmann::json::parse(read_file(at->dir + "/tinker_meta.json"));
      ok = ref.meta.is_object() && ref.meta.contains("base_model");
    } catch (const std::exception&) {
    }
  }
  // Rank 0's answer and meta, everyone's. The message names the client's
  // path only, never a server file, and is the same for another tenant's
  // path (Note [One tenant check] in tenancy.h).
  if (!agree(ok))
    throw UsageError("checkpoint '" + elide(path, 200) +
                     "' cannot be read: this server has no such checkpoint "
                     "(see save_state)");
  std::string meta = ref.meta.dump();
  broadcast_bytes(*comm_, &meta);
  ref.meta = nlohmann::json::parse(meta);
  return ref;
}

nlohmann::json CheckpointStore::load_weights(ModelRegistry& models,
                                             const Caller& caller,
                                             const nlohmann::json& a) {
  const std::string path = require_string(a, "path");
  const std::string id = require_string(a, "model_id");
  CheckpointRef ref = resolve(caller, path);
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
    created = models.build(id, caller.tenant, find_base_model(base_name), lora);
    m = created.get();
  } else {
    m = &models.get(id, caller.tenant);
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
  const std::string dir = ref.dir + "/" + ref.name;
  try {
    m->engine->load_checkpoint(ref.dir, ref.name, lo);
  } catch (const IoError& e) {
    throw IoError(scrub_path(scrub_path(e.what(), dir, path), state_dir_,
                             "<state dir>"));
  } catch (const UsageError& e) {
    throw UsageError(scrub_path(scrub_path(e.what(), dir, path), state_dir_,
                                "<state dir>"));
  }
  if (created) models.add(std::move(created));
  return {{"path", path}, {"model_id", id}, {"type", "load_weights"}};
}

nlohmann::json CheckpointStore::list(const Caller& caller,
                                     const nlohmann::json& a) {
  std::vector<Listed> found;
  const std::string run_id = get_or<std::string>(a, "model_id", "");
  if (!run_id.empty()) {
    const std::string run = run_dir(state_dir_, caller.tenant, run_id);
    std::error_code ec;
    const bool on_disk = model_folder(run_id).find_first_not_of('.') !=
                             std::string::npos &&
                         within_dir(state_dir_, run) &&
                         fs::is_directory(run, ec);
    if (!on_disk && !get_or<bool>(a, "live", false))
      throw NotFound("unknown training run '" + elide(run_id, 200) +
                     "' (a model id that save_state or "
                     "save_weights_for_sampler wrote to)");
    if (on_disk) list_run(run, &found);
  } else {
    const std::string root = tenant_dir(state_dir_, caller.tenant);
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end;
         it.increment(ec))
      if (it->is_directory(ec) && within_dir(state_dir_, it->path().string()))
        list_run(it->path().string(), &found);
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Listed& x, const Listed& y) {
                     return x.time > y.time;
                   });
  nlohmann::json out = {{"checkpoints", nlohmann::json::array()}};
  const size_t total = found.size();
  size_t offset = 0, limit = total;
  if (run_id.empty()) {
    offset = static_cast<size_t>(get_or<int64_t>(a, "offset", 0));
    limit = static_cast<size_t>(get_or<int64_t>(a, "limit", 100));
    out["cursor"] = {{"offset", offset},
                     {"limit", limit},
                     {"total_count", total}};
  }
  for (size_t i = offset; i < total && i < offset + limit; ++i)
    out["checkpoints"].push_back(found[i].entry);
  return out;
}

nlohmann::json CheckpointStore::remove(const Caller& caller,
                                       const nlohmann::json& a) {
  const std::string path = require_string(a, "path");
  std::optional<CheckpointLocation> at =
      locate_checkpoint(state_dir_, caller.tenant, path, "weights");
  const char* marker = "manifest.json";
  if (!at) {
    at = locate_checkpoint(state_dir_, caller.tenant, path, "sampler_weights");
    marker = "weights.pt";
  }
  std::error_code ec;
  if (!at || !within_dir(state_dir_, at->dir) ||
      !fs::is_regular_file(at->dir + "/" + marker, ec))
    throw NotFound("checkpoint '" + elide(path, 200) +
                   "' cannot be deleted: this server has no such "
                   "checkpoint");
  fs::remove_all(at->dir, ec);
  if (ec)
    throw IoError("checkpoint '" + path +
                  "' could not be deleted whole (see the server's disk)");
  return {{"path", path}, {"type", "delete_checkpoint"}};
}

}  // namespace tinker
}  // namespace zerostep
