#include "tools/tinker/checkpoints.h"

#include <sys/stat.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "models/hf_decoder.h"
#include "engine/checkpoint_io.h"
#include "engine/safetensors.h"
#include "tools/tinker/command.h"
#include "tools/tinker/export_weights.h"
#include "tools/tinker/retention.h"
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

// The kinds of checkpoint a run folder holds: the tinker:// path segment,
// the SDK's checkpoint_type, and the file that is written last (a folder
// without it is not a whole checkpoint).
struct Kind {
  const char* segment;
  const char* type;
  const char* marker;
};
const Kind kKinds[] = {{"weights", "training", "manifest.json"},
                       {"sampler_weights", "sampler", "weights.pt"},
                       {"external_weights", "external", "tinker_meta.json"}};

const Kind* kind_of(const std::string& segment) {
  for (const Kind& k : kKinds)
    if (segment == k.segment) return &k;
  return nullptr;
}

// One listed checkpoint (the SDK's Checkpoint) and its sort key.
struct Listed {
  std::string time;
  nlohmann::json entry;
  std::string kind;
  nlohmann::json meta;
};

// The checkpoints in one run folder of a tenant (training checkpoints at
// <run>/<name>/, the others at <run>/<kind>/<name>/), named by the model
// id their tinker_meta.json records (the folder name is the id with ':'
// made '_'). Expired ones are removed instead (Note [Checkpoint expiry]);
// returns how many.
int list_run(const std::string& run, int64_t now, std::vector<Listed>* out) {
  int removed = 0;
  auto add = [&](const std::string& dir, const std::string& name,
                 const Kind& kind) {
    std::error_code ec;
    if (!fs::is_regular_file(dir + "/" + kind.marker, ec)) return;
    nlohmann::json meta;
    std::string model_id;
    try {
      meta = nlohmann::json::parse(read_file(dir + "/tinker_meta.json"));
      model_id = meta.at("model_id").get<std::string>();
    } catch (const std::exception&) {
      return;  // not one of this server's (or being written)
    }
    if (expired(meta, now)) {
      fs::remove_all(dir, ec);
      ++removed;
      return;
    }
    const std::string time = mtime_iso(dir + "/" + kind.marker);
    nlohmann::json entry = {
        {"checkpoint_id", std::string(kind.segment) + "/" + name},
        {"checkpoint_type", kind.type},
        {"time", time},
        {"tinker_path",
         "tinker://" + model_id + "/" + kind.segment + "/" + name},
        {"size_bytes", tree_bytes(dir)},
        {"public", false},
        {"training_run_id", model_id},
        {"expires_at", nullptr}};
    if (meta.contains("expires_at") && meta["expires_at"].is_number_integer())
      entry["expires_at"] = iso8601(meta["expires_at"].get<int64_t>());
    out->push_back({time, std::move(entry), kind.segment, std::move(meta)});
  };
  std::error_code ec;
  for (fs::directory_iterator it(run, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!safe_checkpoint_name(name)) continue;  // .tmp, .old, latest
    const Kind* sub = kind_of(name);
    if (sub != nullptr && sub != &kKinds[0]) {
      std::error_code e2;
      for (fs::directory_iterator s(it->path(), e2), send; !e2 && s != send;
           s.increment(e2)) {
        const std::string sn = s->path().filename().string();
        if (safe_checkpoint_name(sn)) add(s->path().string(), sn, *sub);
      }
      continue;
    }
    add(it->path().string(), name, kKinds[0]);
  }
  return removed;
}

// The checkpoint listing's cursor and page of `found` (newest first).
nlohmann::json page(std::vector<Listed> found, const nlohmann::json& a,
                    bool paged) {
  std::stable_sort(found.begin(), found.end(),
                   [](const Listed& x, const Listed& y) {
                     return x.time > y.time;
                   });
  nlohmann::json out = {{"checkpoints", nlohmann::json::array()}};
  const size_t total = found.size();
  size_t offset = 0, limit = total;
  if (paged) {
    offset = static_cast<size_t>(get_or<int64_t>(a, "offset", 0));
    limit = static_cast<size_t>(get_or<int64_t>(a, "limit", 100));
    out["cursor"] = {
        {"offset", offset}, {"limit", limit}, {"total_count", total}};
  }
  for (size_t i = offset; i < total && i < offset + limit; ++i)
    out["checkpoints"].push_back(found[i].entry);
  return out;
}

// A tinker_meta.json for a checkpoint of `m` (the base model, model id,
// LoRA options, user metadata) expiring at `expires_at` (none: never).
nlohmann::json meta_of(const Model& m, std::optional<int64_t> expires_at) {
  nlohmann::json meta = {{"base_model", m.base.name},
                         {"model_id", m.id},
                         {"lora", lora_to_json(m.lora)}};
  if (!m.user_metadata.is_null()) meta["user_metadata"] = m.user_metadata;
  if (expires_at) meta["expires_at"] = *expires_at;
  return meta;
}

// Copies `from` to `to` (a folder that must not exist), file by file as
// hard links when the file system allows and as copies otherwise.
void link_or_copy_tree(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::copy(from, to,
           fs::copy_options::recursive | fs::copy_options::create_hard_links,
           ec);
  if (!ec) return;
  fs::remove_all(to, ec);
  fs::copy(from, to, fs::copy_options::recursive, ec);
  if (ec) {
    fs::remove_all(to, ec);
    throw IoError("the copy could not be written (see the server's disk)");
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

uint64_t external_bytes_bound(Model& m) {
  uint64_t numel = 0, tensors = 0;
  for (const torch::Tensor& p : m.engine->parameters()) {
    numel += static_cast<uint64_t>(p.numel());
    ++tensors;
  }
  // The safetensors header (one entry per tensor) and the config files.
  return 4 * numel + 256 * tensors + (64 << 10);
}

CheckpointStore::CheckpointStore(Communicator* comm, std::string state_dir,
                                 int stage, std::function<int64_t()> now_unix)
    : comm_(comm),
      state_dir_(std::move(state_dir)),
      stage_(stage),
      now_unix_(now_unix ? std::move(now_unix) : unix_now) {}

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
  if (!safe_checkpoint_name(name) || kind_of(name) != nullptr)
    throw UsageError("save_weights name (field 'path') '" + elide(name, 140) +
                     "' must be 1-128 "
                     "characters of [A-Za-z0-9._-] (and not 'latest', "
                     "'weights', 'sampler_weights' or 'external_weights')");
  // Every rank reads the same request and clock value: an error is
  // everyone's, before anything is written.
  const std::optional<int64_t> expires =
      expiry_from_ttl(a, "ttl_seconds", now_unix_(), "save_weights");
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
  if (comm_->rank() == 0)
    atomic_write_file(at.dir + "/tinker_meta.json",
                      meta_of(m, expires).dump(1));
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
      ok = ref.meta.is_object() && ref.meta.contains("base_model") &&
           !expired(ref.meta, now_unix_());
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
  const int64_t now = now_unix_();
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
    if (on_disk) list_run(run, now, &found);
    return page(std::move(found), a, false);
  }
  const std::string root = tenant_dir(state_dir_, caller.tenant);
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end;
       it.increment(ec))
    if (it->is_directory(ec) && within_dir(state_dir_, it->path().string()))
      list_run(it->path().string(), now, &found);
  return page(std::move(found), a, true);
}

std::optional<CheckpointStore::Found> CheckpointStore::find(
    const Caller& caller, const std::string& path) {
  for (const Kind& k : kKinds) {
    std::optional<CheckpointLocation> at =
        locate_checkpoint(state_dir_, caller.tenant, path, k.segment);
    std::error_code ec;
    if (!at || !within_dir(state_dir_, at->dir) ||
        !fs::is_regular_file(at->dir + "/" + k.marker, ec))
      continue;
    Found f{*at, k.segment, nullptr};
    try {
      f.meta = nlohmann::json::parse(read_file(at->dir + "/tinker_meta.json"));
    } catch (const std::exception&) {
      return std::nullopt;  // not a whole checkpoint of this server's
    }
    if (expired(f.meta, now_unix_())) {
      fs::remove_all(at->dir, ec);
      return std::nullopt;
    }
    return f;
  }
  return std::nullopt;
}

namespace {

NotFound no_checkpoint(const std::string& path, const std::string& action) {
  return NotFound("checkpoint '" + elide(path, 200) + "' cannot be " + action +
                  ": this server has no such checkpoint (deleted, expired, "
                  "or never saved)");
}

}  // namespace

nlohmann::json CheckpointStore::remove(const Caller& caller,
                                       const nlohmann::json& a) {
  const std::string path = require_string(a, "path");
  const std::optional<Found> f = find(caller, path);
  if (!f) throw no_checkpoint(path, "deleted");
  std::error_code ec;
  fs::remove_all(f->at.dir, ec);
  if (ec)
    throw IoError("checkpoint '" + path +
                  "' could not be deleted whole (see the server's disk)");
  return {{"path", path}, {"type", "delete_checkpoint"}};
}

nlohmann::json CheckpointStore::set_ttl(const Caller& caller,
                                        const nlohmann::json& a) {
  const std::string path = require_string(a, "path");
  const std::optional<int64_t> expires =
      expiry_from_ttl(a, "ttl_seconds", now_unix_(), "set_checkpoint_ttl");
  const std::optional<Found> f = find(caller, path);
  if (!f) throw no_checkpoint(path, "given a TTL");
  nlohmann::json meta = f->meta;
  if (expires)
    meta["expires_at"] = *expires;
  else
    meta.erase("expires_at");
  atomic_write_file(f->at.dir + "/tinker_meta.json", meta.dump(1));
  nlohmann::json out = {{"path", path}, {"type", "set_checkpoint_ttl"}};
  if (expires) out["expires_at"] = iso8601(*expires);
  return out;
}

nlohmann::json CheckpointStore::external_files(const Caller& caller,
                                               const nlohmann::json& a) {
  const std::string path = require_string(a, "path");
  const std::optional<Found> f = find(caller, path);
  if (!f || f->kind != "external_weights")
    throw NotFound("external weights '" + elide(path, 200) +
                   "' do not exist on this server (deleted, expired, or "
                   "never saved with save_weights_external)");
  nlohmann::json out = {{"files", external_weight_files(f->at.dir)}};
  if (f->meta.contains("expires_at")) out["expires_at"] = f->meta["expires_at"];
  return out;
}

nlohmann::json CheckpointStore::save_external(ModelRegistry& models,
                                              const Caller& caller,
                                              const nlohmann::json& a) {
  Model& m = models.get(require_string(a, "model_id"), caller.tenant);
  const std::string name = get_or<std::string>(a, "path", "");
  if (!safe_checkpoint_name(name))
    throw UsageError("save_weights_external name (field 'path') '" +
                     elide(name, 140) +
                     "' must be 1-128 characters of [A-Za-z0-9._-] (and not "
                     "'latest')");
  if (a.contains("age_encryption_recipients") &&
      !a["age_encryption_recipients"].is_null())
    throw UsageError(
        "save_weights_external: age_encryption_recipients is not served "
        "(this server writes the files unencrypted, readable through the "
        "signed URLs of get_external_weights_urls). Fix: leave it unset");
  const std::optional<int64_t> expires =
      expiry_from_ttl(a, "ttl_seconds", now_unix_(), "save_weights_external");
  const std::string tinker_path =
      "tinker://" + m.id + "/external_weights/" + name;
  const CheckpointLocation at = *locate_checkpoint(
      state_dir_, caller.tenant, tinker_path, "external_weights");
  const bool rank0 = comm_->rank() == 0;
  if (!agree(!rank0 || within_dir(state_dir_, at.dir)))
    throw UsageError("external weights '" + tinker_path +
                     "' would leave this server's state directory (a "
                     "symbolic link?). Nothing was written");
  std::error_code ec;
  if (agree(rank0 && fs::exists(at.dir, ec)))
    throw UsageError("external weights '" + tinker_path +
                     "' exist already. Fix: choose another name, or delete "
                     "them first (RestClient.delete_checkpoint_from_"
                     "tinker_path)");
  if (caller.max_bytes) {
    const std::string refusal =
        rank0 ? over_bytes_quota(
                    caller, "save_weights_external '" + name + "'",
                    tree_bytes(tenant_dir(state_dir_, caller.tenant)),
                    external_bytes_bound(m))
              : "";
    if (!agree(refusal.empty())) {
      if (rank0) throw UsageError(refusal);
      throw UsageError("save_weights_external '" + name +
                       "' is over the tenant's quota (rank 0 says how "
                       "much). Nothing was written");
    }
  }
  // Written into a hidden folder, renamed into place when whole.
  const std::string tmp = at.run + "/external_weights/." + name + ".tmp";
  bool made = true;
  if (rank0) {
    fs::remove_all(tmp, ec);
    made = fs::create_directories(tmp, ec) && !ec;
  }
  if (!agree(made))
    throw IoError("external weights '" + tinker_path +
                  "' could not be written (see the server's disk)");
  const std::string trainable = tmp + "/trainable.safetensors";
  try {
    m.engine->export_full_model(trainable);  // a collective
  } catch (const IoError&) {
    if (rank0) fs::remove_all(tmp, ec);
    throw IoError("external weights '" + tinker_path +
                  "' could not be written (see the server's disk)");
  }
  std::string error;
  uint64_t size = 0;
  if (rank0) {
    try {
      const SafetensorsFile file =
          decode_safetensors(read_file(trainable), trainable);
      if (m.base.is_hf() && m.lora.rank > 0) {
        // PEFT's adapter of the folder's decoder (models/hf_decoder.h).
        zerostep::write_peft_adapter(trainable, hf_lora_options(m.lora),
                                     m.base.name, tmp);
      } else if (m.base.is_hf()) {
        // Every parameter trained: a folder transformers loads.
        copy_hf_folder_metadata(m.base.hf_dir, tmp);
        fs::rename(trainable, tmp + "/model.safetensors");
      } else if (m.lora.rank > 0) {
        AdapterSpec spec;
        spec.rank = m.lora.rank;
        spec.alpha = m.lora.alpha;
        spec.attn = m.lora.attn;
        spec.mlp = m.lora.mlp;
        spec.unembed = m.lora.unembed;
        spec.base_model = m.base.name;
        write_peft_adapter(file, spec, tmp);
      } else {
        write_full_model(file,
                         {{"architectures", {"ZerostepTinyGpt"}},
                          {"model_type", "zerostep_tiny_gpt"},
                          {"base_model", m.base.name},
                          {"vocab_size", m.base.vocab_size},
                          {"block_size", m.base.max_context},
                          {"d_model", m.base.d_model},
                          {"n_head", m.base.n_head},
                          {"n_layer", m.base.n_layer},
                          {"dtype", "float32"}},
                         tmp);
      }
      fs::remove(trainable);
      atomic_write_file(tmp + "/tinker_meta.json",
                        meta_of(m, expires).dump(1));
      size = tree_bytes(tmp);
      fs::rename(tmp, at.dir);
    } catch (const std::exception& e) {
      fs::remove_all(tmp, ec);
      error = e.what();
    }
  }
  if (!agree(error.empty()))
    throw IoError("external weights '" + tinker_path +
                  "' could not be written" +
                  (rank0 ? ": " + scrub_path(error, state_dir_, "<state dir>")
                         : std::string(" (rank 0 says why)")));
  return {{"path", tinker_path},
          {"size_bytes", size},
          {"type", "save_weights_external"}};
}

namespace {

// The SDK's TrainingRun of one of the caller's runs.
nlohmann::json training_run(const std::string& id, const std::string& tenant,
                            const Model* live,
                            const std::vector<Listed>& checkpoints) {
  nlohmann::json meta = nullptr;
  const Listed* last[2] = {nullptr, nullptr};  // training, sampler
  for (const Listed& c : checkpoints) {
    if (meta.is_null()) meta = c.meta;
    const int slot = c.kind == "weights" ? 0 : c.kind == "sampler_weights" ? 1
                                                                           : -1;
    if (slot >= 0 && (last[slot] == nullptr || c.time > last[slot]->time))
      last[slot] = &c;
  }
  std::string base;
  LoraOptions lora;
  nlohmann::json metadata = nullptr;
  std::string time = "1970-01-01T00:00:00Z";
  if (live != nullptr) {
    base = live->base.name;
    lora = live->lora;
    metadata = live->user_metadata;
    time = iso8601(live->last_request_unix);
  } else {
    base = meta.value("base_model", "");
    if (meta.contains("lora")) lora = lora_from_json(meta["lora"]);
    if (meta.contains("user_metadata")) metadata = meta["user_metadata"];
    for (const Listed& c : checkpoints) time = std::max(time, c.time);
  }
  nlohmann::json run = {{"training_run_id", id},
                        {"base_model", base},
                        {"model_owner", tenant},
                        {"is_lora", lora.rank > 0},
                        {"corrupted", false},
                        {"lora_rank", nullptr},
                        {"last_request_time", time},
                        {"last_checkpoint", nullptr},
                        {"last_sampler_checkpoint", nullptr},
                        {"user_metadata", metadata}};
  if (lora.rank > 0) run["lora_rank"] = lora.rank;
  if (last[0] != nullptr) run["last_checkpoint"] = last[0]->entry;
  if (last[1] != nullptr) run["last_sampler_checkpoint"] = last[1]->entry;
  return run;
}

}  // namespace

nlohmann::json CheckpointStore::runs(const ModelRegistry& models,
                                     const Caller& caller,
                                     const nlohmann::json& a) {
  const int64_t now = now_unix_();
  // Every run of the caller's: the live ones and those in its folder.
  std::map<std::string, std::vector<Listed>> by_run;
  for (const nlohmann::json& id : a.value("live", nlohmann::json::array()))
    by_run[id.get<std::string>()];
  const std::string root = tenant_dir(state_dir_, caller.tenant);
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (!it->is_directory(ec) || !within_dir(state_dir_, it->path().string()))
      continue;
    std::vector<Listed> found;
    list_run(it->path().string(), now, &found);
    for (Listed& c : found)
      by_run[c.entry["training_run_id"].get<std::string>()].push_back(
          std::move(c));
  }
  std::vector<nlohmann::json> all;
  for (const auto& kv : by_run) {
    const Model* live = models.find(kv.first, caller.tenant);
    if (live == nullptr && kv.second.empty()) continue;
    all.push_back(training_run(kv.first, caller.tenant, live, kv.second));
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const nlohmann::json& x, const nlohmann::json& y) {
                     return x["last_request_time"].get<std::string>() >
                            y["last_request_time"].get<std::string>();
                   });
  const size_t offset = static_cast<size_t>(get_or<int64_t>(a, "offset", 0));
  const size_t limit = static_cast<size_t>(get_or<int64_t>(a, "limit", 20));
  nlohmann::json out = {{"training_runs", nlohmann::json::array()},
                        {"cursor",
                         {{"offset", offset},
                          {"limit", limit},
                          {"total_count", all.size()}}}};
  for (size_t i = offset; i < all.size() && i < offset + limit; ++i)
    out["training_runs"].push_back(all[i]);
  return out;
}

nlohmann::json CheckpointStore::run(const ModelRegistry& models,
                                    const Caller& caller,
                                    const nlohmann::json& a) {
  const std::string id = require_string(a, "model_id");
  const Model* live =
      get_or<bool>(a, "live", false) ? models.find(id, caller.tenant) : nullptr;
  std::vector<Listed> found;
  const std::string dir = run_dir(state_dir_, caller.tenant, id);
  std::error_code ec;
  if (model_folder(id).find_first_not_of('.') != std::string::npos &&
      within_dir(state_dir_, dir) && fs::is_directory(dir, ec))
    list_run(dir, now_unix_(), &found);
  if (live == nullptr && found.empty())
    throw NotFound("unknown training run '" + elide(id, 200) +
                   "' (none of your models, and no checkpoint of that run)");
  return training_run(id, caller.tenant, live, found);
}

nlohmann::json CheckpointStore::copy(const Caller& caller,
                                     const nlohmann::json& a) {
  const std::string source = require_string(a, "source_path");
  if (a.contains("weights_access_token") && !a["weights_access_token"].is_null())
    throw UsageError("copy_weights: weights_access_token is not served (this "
                     "server copies the caller's own checkpoints only)");
  std::string new_run = get_or<std::string>(a, "new_run", "");
  int64_t seq = 0;
  if (a.contains("session_id") && a["session_id"].is_string() &&
      get_int64(a, "model_seq_id", &seq))
    new_run = a["session_id"].get<std::string>() + ":train:" +
              std::to_string(seq);
  const std::optional<int64_t> expires =
      expiry_from_ttl(a, "ttl_seconds", now_unix_(), "copy_weights");
  const std::optional<Found> f = find(caller, source);
  if (!f) throw no_checkpoint(source, "copied");
  const std::string path =
      "tinker://" + new_run + "/" + f->kind + "/" + f->at.name;
  const std::optional<CheckpointLocation> to =
      locate_checkpoint(state_dir_, caller.tenant, path, f->kind);
  std::error_code ec;
  if (!to || !within_dir(state_dir_, to->dir))
    throw UsageError("copy_weights: cannot copy to '" + elide(path, 200) + "'");
  if (fs::exists(to->run, ec))
    throw UsageError("copy_weights: run '" + elide(new_run, 200) +
                     "' exists already (a copy makes a new run). Fix: "
                     "another model_seq_id");
  if (const std::string refusal = over_bytes_quota(
          caller, "copy_weights '" + source + "'",
          tree_bytes(tenant_dir(state_dir_, caller.tenant)),
          tree_bytes(f->at.dir));
      !refusal.empty())
    throw UsageError(refusal);
  fs::create_directories(fs::path(to->dir).parent_path(), ec);
  link_or_copy_tree(f->at.dir, to->dir);
  nlohmann::json meta = f->meta;
  meta["model_id"] = new_run;
  meta["copied_from"] = source;
  if (a.contains("destination_project_id") &&
      a["destination_project_id"].is_string())
    meta["project_id"] = a["destination_project_id"];
  meta.erase("expires_at");
  if (expires) meta["expires_at"] = *expires;
  atomic_write_file(to->dir + "/tinker_meta.json", meta.dump(1));
  return {{"tinker_path", path}, {"type", "copy_weights"}};
}

nlohmann::json CheckpointStore::weights_info(const Caller& caller,
                                             const nlohmann::json& a) {
  const std::string path = require_string(a, "tinker_path");
  const std::optional<Found> f = find(caller, path);
  if (!f) throw no_checkpoint(path, "described");
  const LoraOptions lora = f->meta.contains("lora")
                               ? lora_from_json(f->meta["lora"])
                               : LoraOptions();
  nlohmann::json out = {{"base_model", f->meta.value("base_model", "")},
                        {"is_lora", lora.rank > 0},
                        {"lora_rank", nullptr},
                        {"train_attn", nullptr},
                        {"train_mlp", nullptr},
                        {"train_unembed", nullptr}};
  if (lora.rank > 0) {
    out["lora_rank"] = lora.rank;
    out["train_attn"] = lora.attn;
    out["train_mlp"] = lora.mlp;
    out["train_unembed"] = lora.unembed;
  }
  return out;
}

int CheckpointStore::sweep_expired(int64_t every_s) {
  const int64_t now = now_unix_();
  if (last_sweep_ != 0 && now - last_sweep_ < every_s) return 0;
  last_sweep_ = now;
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator t(state_dir_ + "/tenants", ec), tend;
       !ec && t != tend; t.increment(ec))
    for (fs::directory_iterator r(t->path(), ec), rend; !ec && r != rend;
         r.increment(ec)) {
      if (!r->is_directory(ec) || !within_dir(state_dir_, r->path().string()))
        continue;
      std::vector<Listed> kept;
      removed += list_run(r->path().string(), now, &kept);
    }
  return removed;
}

}  // namespace tinker
}  // namespace zerostep
