// CheckpointStore: the save_weights / load_weights requests over the
// trainer's state directory. A checkpoint named tinker://<model id>/
// weights/<name> is the folder <state_dir>/<model folder>/<name>/ (the
// model id with every character other than [A-Za-z0-9.-] made '_'),
// holding the Engine's checkpoint (Engine::save_checkpoint; loading may
// re-partition) and tinker_meta.json (the base model and the LoRA options,
// which load_weights needs to build or check the model).
//
// Every decision that depends on the file system is rank 0's, broadcast to
// every rank (file systems may differ between machines), so every rank
// takes the same path and reaches the same collectives.
//
// Thread safety: one rank's thread only.
#ifndef ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_
#define ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_

#include <nlohmann/json.hpp>
#include <string>

#include "comm/communicator.h"
#include "tools/tinker/checkpoint_paths.h"
#include "tools/tinker/model_registry.h"

namespace zerostep {
namespace tinker {

class CheckpointStore {
 public:
  // `*comm` must outlive the store.
  CheckpointStore(Communicator* comm, std::string state_dir);

  // save_weights: saves model args.model_id as args.path (a name) on every
  // rank (rank 0 also writes tinker_meta.json). UsageError, before anything
  // is written, for an unknown model, a bad name, or an existing
  // checkpoint without args.overwrite. Returns the response.
  nlohmann::json save_weights(ModelRegistry& models,
                              const nlohmann::json& args);

  // load_weights: loads args.path (a tinker:// path) into model
  // args.model_id, or into a new model of the checkpoint's base and LoRA
  // options with args.create; the optimizer state too with
  // args.optimizer. UsageError, before anything changes, for a path that
  // is not this server's or cannot be read, or a model that does not
  // match the checkpoint. Returns the response.
  nlohmann::json load_weights(ModelRegistry& models,
                              const nlohmann::json& args);

 private:
  struct CheckpointRef {
    std::string dir, name;
    nlohmann::json meta;  // tinker_meta.json
  };

  std::string run_folder(const std::string& model_id) const;
  // Rank 0's answer, everyone's.
  bool agree(bool mine);
  // The checkpoint `path` names, with its tinker_meta.json read (a
  // collective). UsageError when it is not one of this server's.
  CheckpointRef resolve(const std::string& path);

  Communicator* comm_;
  std::string state_dir_;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_CHECKPOINTS_H_
