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
// Every decision that depends on the file system is rank 0's, broadcast to
// every rank (file systems may differ between machines), so every rank
// takes the same path and reaches the same collectives. Listings and
// deletes are rank 0's alone (no collective; the other ranks execute them
// as no-ops).
//
// Thread safety: one rank's thread only.
#ifndef ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_
#define ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
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

class CheckpointStore {
 public:
  // `*comm` must outlive the store; `stage` is every model's ZeRO stage.
  CheckpointStore(Communicator* comm, std::string state_dir, int stage);

  // save_weights: saves the caller's model args.model_id as args.path (a
  // name) on every rank (rank 0 also writes tinker_meta.json). UsageError,
  // before anything is written, for an unknown model, a bad name, an
  // existing checkpoint without args.overwrite, or a save beyond the
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

  // Rank 0 only. The caller's checkpoints (training and sampler weights)
  // as the SDK's CheckpointsListResponse, newest first: of run
  // args.model_id when given (UsageError with http_status 404 unless
  // args.live or the run has a folder), else of every run, a page of
  // args.limit from args.offset with a cursor.
  nlohmann::json list(const Caller& caller, const nlohmann::json& args);

  // Rank 0 only. Deletes the caller's checkpoint args.path (a tinker://
  // path of either kind). UsageError when there is none (another tenant's
  // included).
  nlohmann::json remove(const Caller& caller, const nlohmann::json& args);

 private:
  struct CheckpointRef {
    std::string dir, name;
    nlohmann::json meta;  // tinker_meta.json
  };

  // Rank 0's answer, everyone's.
  bool agree(bool mine);
  // The caller's checkpoint `path` names, with its tinker_meta.json read
  // (a collective). UsageError when it is not one of the caller's.
  CheckpointRef resolve(const Caller& caller, const std::string& path);

  Communicator* comm_;
  std::string state_dir_;
  int stage_;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_
