// CheckpointStore: the save_weights / load_weights requests, the tenant's
// checkpoint listings and deletes, over the trainer's state directory. A
// checkpoint named tinker://<model id>/weights/<name> of tenant T is the
// folder <state_dir>/tenants/<T>/<model folder>/<name>/ (tenancy.h:
// locate_checkpoint; the model id with every character other than
// [A-Za-z0-9.-] made '_'), holding the Engine's checkpoint
// (Engine::save_checkpoint; loading may re-partition) and tinker_meta.json
// (the base model, the model id and the LoRA options, which load_weights
// needs to build or check the model). Another tenant's path names a folder
// of the caller's that does not exist, so it is answered as a missing one.
//
// Quota: before a save writes anything, rank 0 adds what the tenant's
// folder holds (minus the checkpoint a save with overwrite replaces) to a
// bound on the new checkpoint's size (checkpoint_bytes_bound), and every
// rank refuses the save when that exceeds the caller's max_bytes.
//
// Also: external weights (save_weights_external, Note [External weights]
// in export_weights.h: <run folder>/external_weights/<name>/, named
// tinker://<model id>/external_weights/<name>), checkpoint TTLs and their
// expiry (Note [Checkpoint expiry] in retention.h), training runs (the
// caller's live models and the runs in its folder), copies (copy_weights:
// a checkpoint of any kind copied, as hard links where the file system
// allows, into a new run that only holds it) and weights_info.
//
// Every decision that depends on the file system is rank 0's, broadcast to
// every rank (file systems may differ between machines), so every rank
// takes the same path and reaches the same collectives. Listings, deletes,
// TTLs, copies and the expiry sweep are rank 0's alone (no collective;
// the other ranks execute them as no-ops).
//
// Thread safety: one rank's thread only.
#ifndef ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_
#define ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "tools/tinker/checkpoint_paths.h"
#include "tools/tinker/model_registry.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

// An upper bound on the bytes Engine::save_checkpoint writes for `m` at
// `stage` over `world` ranks, tinker_meta.json and `latest` included: 12
// bytes (parameter and Adam's two moments) per element of every rank's
// owned state (stage 0: each rank owns the whole padded buffer; stages
// 1-3: the ranks split it; a stage 3 group is padded on its own), plus
// each rank file's header (one segment per parameter tensor at most) and
// the manifest. trainer_test checks it against real checkpoints.
uint64_t checkpoint_bytes_bound(Model& m, int stage, int world);

// A bound on the bytes save_weights_external writes for `m`: the float32
// trainable parameters with their safetensors headers, and the config
// files.
uint64_t external_bytes_bound(Model& m);

class CheckpointStore {
 public:
  // `*comm` must outlive the store; `stage` is every model's ZeRO stage;
  // `now_unix` is the wall clock checkpoint expiry is judged by (default:
  // retention.h unix_now; tests pass their own).
  CheckpointStore(Communicator* comm, std::string state_dir, int stage,
                  std::function<int64_t()> now_unix = nullptr);

  // save_weights: saves the caller's model args.model_id as args.path (a
  // name) on every rank (rank 0 also writes tinker_meta.json, with the
  // expiry args.ttl_seconds sets). UsageError, before anything is written,
  // for an unknown model, a bad name, an existing checkpoint without
  // args.overwrite, a ttl_seconds out of range, or a save beyond the
  // caller's max_bytes. Returns the response.
  nlohmann::json save_weights(ModelRegistry& models, const Caller& caller,
                              const nlohmann::json& args);

  // load_weights: loads args.path (a tinker:// path of the caller's) into
  // the caller's model args.model_id, or into a new model of the
  // checkpoint's base and LoRA options with args.create; the optimizer
  // state too with args.optimizer. UsageError, before anything changes,
  // for a path that is not the caller's or cannot be read, or a model that
  // does not match the checkpoint. Returns the response.
  nlohmann::json load_weights(ModelRegistry& models, const Caller& caller,
                              const nlohmann::json& args);

  // save_weights_external, on every rank (the export is a collective):
  // the caller's model args.model_id written as external weights named
  // args.path (Note [External weights]), with the expiry args.ttl_seconds
  // sets. UsageError on every rank, nothing written, for an unknown model,
  // a bad or existing name, a bad ttl_seconds, age_encryption_recipients
  // (not served) or a save beyond the caller's max_bytes. Returns
  // {"path", "size_bytes"}.
  nlohmann::json save_external(ModelRegistry& models, const Caller& caller,
                               const nlohmann::json& args);

  // Rank 0 only. The caller's checkpoints (training, sampler and external
  // weights) as the SDK's CheckpointsListResponse, newest first: of run
  // args.model_id when given (NotFound unless args.live or the run has a
  // folder), else of every run, a page of args.limit from args.offset
  // with a cursor. Expired ones are removed, not listed.
  nlohmann::json list(const Caller& caller, const nlohmann::json& args);

  // Rank 0 only. Deletes the caller's checkpoint args.path (a tinker://
  // path of any kind). NotFound when there is none (another tenant's and
  // an expired one included).
  nlohmann::json remove(const Caller& caller, const nlohmann::json& args);

  // Rank 0 only. Sets (args.ttl_seconds) or removes (null) the expiry of
  // the caller's checkpoint args.path. NotFound as remove(); UsageError
  // for a ttl_seconds out of range.
  nlohmann::json set_ttl(const Caller& caller, const nlohmann::json& args);

  // Rank 0 only. The files a user may download of the caller's external
  // weights args.path: {"files": [...], "expires_at"?}. NotFound as
  // remove().
  nlohmann::json external_files(const Caller& caller,
                                const nlohmann::json& args);

  // Rank 0 only. The SDK's TrainingRunsResponse of the caller's runs (the
  // live models args.live names, and the runs with a checkpoint in its
  // folder), most recently used first, a page of args.limit from
  // args.offset; and one TrainingRun (args.model_id; NotFound unless live
  // or on disk).
  nlohmann::json runs(const ModelRegistry& models, const Caller& caller,
                      const nlohmann::json& args);
  nlohmann::json run(const ModelRegistry& models, const Caller& caller,
                     const nlohmann::json& args);

  // Rank 0 only. copy_weights: the caller's checkpoint args.source_path
  // copied under the same kind and name into the run args.new_run (or
  // "<args.session_id>:train:<args.model_seq_id>"), a run no model trains,
  // with its own expiry (args.ttl_seconds). Returns {"tinker_path"}.
  // NotFound for a missing source; UsageError for a run that exists, a
  // weights_access_token (not served), a bad ttl, or a copy beyond the
  // caller's max_bytes.
  nlohmann::json copy(const Caller& caller, const nlohmann::json& args);

  // Rank 0 only. weights_info: the base model and LoRA options of the
  // caller's checkpoint args.tinker_path (any kind). NotFound as remove().
  nlohmann::json weights_info(const Caller& caller,
                              const nlohmann::json& args);

  // Rank 0 only. Removes every expired checkpoint of every tenant (Note
  // [Checkpoint expiry]) when at least `every_s` seconds have passed
  // since the last sweep. Returns how many were removed.
  int sweep_expired(int64_t every_s = 60);

 private:
  struct CheckpointRef {
    std::string dir, name;
    nlohmann::json meta;  // tinker_meta.json
  };
  // A checkpoint of the caller's, found on rank 0 (Note [One tenant
  // check]): any kind, not expired (an expired one is removed on the way).
  struct Found {
    CheckpointLocation at;
    std::string kind;  // "weights", "sampler_weights", "external_weights"
    nlohmann::json meta;
  };
  std::optional<Found> find(const Caller& caller, const std::string& path);

  // Rank 0's answer, everyone's.
  bool agree(bool mine);
  // The caller's checkpoint `path` names, with its tinker_meta.json read
  // (a collective). UsageError when it is not one of the caller's.
  CheckpointRef resolve(const Caller& caller, const std::string& path);

  Communicator* comm_;
  std::string state_dir_;
  int stage_;
  std::function<int64_t()> now_unix_;
  int64_t last_sweep_ = 0;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_
