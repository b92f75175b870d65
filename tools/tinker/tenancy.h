// Tenants of the trainer server: who a request acts for, and where that
// tenant's files live. Torch-free.
//
// A tenant is a name (an API key's tenant in the keys file, api_keys.h; a
// key without one is a tenant of its own; every request is tenant
// "default" when the server runs without keys). Each tenant sees only its
// own sessions, models (training runs), futures, sampling sessions,
// checkpoints and sampler weights.
//
// Note [One tenant check]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Every name a client sends is turned into a thing of the caller's tenant
// in one of two places, and a name of another tenant comes out exactly as
// a name that does not exist (same status, same message), so a client
// cannot even learn that it exists:
//   - ids that live in rank 0's memory (sessions, models, futures,
//     sampling sessions): TenantIds below, which the Service
//     (tools/tinker/service.h) asks through its resolve_*() functions
//     before it queues or answers anything;
//   - tinker:// paths and run folders on disk: locate_checkpoint() and
//     run_dir() below, which put every tenant's files under
//     <state_dir>/tenants/<tenant>/, so another tenant's path names a
//     folder of the caller's that does not exist. CheckpointStore and
//     SamplerStore (every rank) call nothing else to find a folder.
// The trainer checks models again (ModelRegistry::get takes the tenant):
// a command that names another tenant's model fails as an unknown one.
// A new endpoint (issue 43's runs, checkpoints, sessions, deletes;
// issue 40's downloads) resolves what it is given through these and
// nothing else.
//
// Thread safety: free functions are pure or read the file system;
// TenantIds is not synchronized (the Service holds it under its mutex).
#ifndef ZEROSTEP_TOOLS_TINKER_TENANCY_H_
#define ZEROSTEP_TOOLS_TINKER_TENANCY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace tinker {

// A UsageError whose HTTP answer is 404 (an unknown run or checkpoint in a
// listing or a delete).
class NotFound : public UsageError {
 public:
  using UsageError::UsageError;
};

// The tenant of every request when the server runs without API keys.
inline constexpr char kDefaultTenant[] = "default";

// Who a request acts for, and that tenant's quotas (nullopt: no limit).
struct Caller {
  std::string tenant = kDefaultTenant;
  // Models (training clients) the tenant may hold at once.
  std::optional<int64_t> max_models;
  // Bytes the tenant's folder of the state directory may hold
  // (checkpoints and sampler weights).
  std::optional<uint64_t> max_bytes;
};

// A tenant name: 1-64 characters of [A-Za-z0-9._-], starting with a letter
// or a digit, and not starting with "tml-" (an API key's prefix: a key
// written where a tenant belongs must not become a folder name) or "key-"
// (the names of keys without a tenant, api_keys.h). Empty if valid; else
// the rule it breaks.
std::string tenant_name_problem(const std::string& name);

// <state_dir>/tenants/<tenant>: everything a tenant saves lies below it.
std::string tenant_dir(const std::string& state_dir, const std::string& tenant);

// A model's (training run's) folder: <tenant dir>/<model folder> (the model
// id with every character other than [A-Za-z0-9.-] made '_').
std::string run_dir(const std::string& state_dir, const std::string& tenant,
                    const std::string& model_id);

// Where a tinker:// path of `kind` ("weights": a training checkpoint;
// "sampler_weights": sampler weights) lies for `tenant`.
struct CheckpointLocation {
  std::string model_id;  // the path's run
  std::string name;      // the checkpoint's name
  std::string run;       // run_dir(): the engine's checkpoint folder
  std::string dir;       // the checkpoint's own folder
};
// nullopt unless `path` is tinker://<model id>/<kind>/<name> with a model
// id that is not made of dots only and a safe name (checkpoint_paths.h).
// The folder need not exist: another tenant's path names a folder of the
// caller's that does not, so it reads as a missing one.
std::optional<CheckpointLocation> locate_checkpoint(
    const std::string& state_dir, const std::string& tenant,
    const std::string& path, const std::string& kind);

// The refusal of a save that would take the caller's folder over its
// max_bytes ("<what>: tenant 'T' holds ... and this needs up to ... more,
// over its quota of ..."), or empty when `held` + `needed` fits (or the
// caller has no max_bytes).
std::string over_bytes_quota(const Caller& caller, const std::string& what,
                             uint64_t held, uint64_t needed);

// The apparent size of every regular file under `dir` (symbolic links are
// not followed); 0 if it does not exist.
uint64_t tree_bytes(const std::string& dir);

// Folders at the top of `state_dir` that hold checkpoints of a server from
// before tenants (a run folder: "session-*" or "model-*"), which the
// server no longer reads there; sorted.
std::vector<std::string> pre_tenant_run_folders(const std::string& state_dir);

// The error for a sampling session id that is not the caller's (missing,
// or another tenant's): the Service's and SamplerStore's answer alike.
std::string unknown_sampling_session(const std::string& id);

// Which tenant owns each id of one kind that lives in rank 0's memory
// (Note [One tenant check]).
class TenantIds {
 public:
  // Records `id` as `tenant`'s. False (nothing changed) if `id` has an
  // owner already, whoever it is.
  bool claim(const std::string& id, const std::string& tenant);
  // True iff `id` exists and is `tenant`'s: another tenant's id and an id
  // that does not exist give the same answer.
  bool owns(const std::string& tenant, const std::string& id) const;
  // Whether anyone owns `id` (for choosing fresh ids only; never for
  // answering a client).
  bool taken(const std::string& id) const;
  // The ids `tenant` owns, sorted.
  std::vector<std::string> ids_of(const std::string& tenant) const;

 private:
  std::map<std::string, std::string> owner_;  // id -> tenant
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_TENANCY_H_
