// Where the trainer server's checkpoints live, and the guards that keep a
// request's tinker:// path inside the state directory. Torch-free.
//
// The default state directory is stable across restarts, so a checkpoint
// saved by one run of the server is found by the next:
// $XDG_STATE_HOME/zerostep/trainer_server, else
// $HOME/.local/state/zerostep/trainer_server (the XDG base directory
// specification's place for state that should persist across restarts but
// is not user data), else /tmp/zerostep-trainer_server-<uid>. Model ids
// carry a per-start token (service.h "Ids"), so runs sharing the directory
// never write into each other's checkpoints.
//
// Thread safety: free functions; within_dir reads the file system.
#ifndef ZEROSTEP_TOOLS_TINKER_CHECKPOINT_PATHS_H_
#define ZEROSTEP_TOOLS_TINKER_CHECKPOINT_PATHS_H_

#include <string>

namespace zerostep {
namespace tinker {

// A checkpoint name a request may use: 1-128 characters of [A-Za-z0-9._-],
// not "latest", "." or "..".
bool safe_checkpoint_name(const std::string& name);

// The folder of a model's checkpoints under the state directory: `model_id`
// with every character other than [A-Za-z0-9.-] made '_' (ids contain ':').
std::string model_folder(const std::string& model_id);

// The default state directory (above), from the environment.
std::string default_state_dir();

// Splits "tinker://<model id>/weights/<name>". False, with nothing set,
// unless there are exactly those three parts, the model id is non-empty
// and not made of dots only ("." or ".." would name a folder outside the
// state directory), and `name` is a safe checkpoint name (above).
bool parse_tinker_path(const std::string& path, std::string* model_id,
                       std::string* name);

// The same for sampler weights, "tinker://<model id>/sampler_weights/<name>"
// (save_weights_for_sampler), and for any middle part `kind`.
bool parse_sampler_path(const std::string& path, std::string* model_id,
                        std::string* name);
bool parse_tinker_path_of_kind(const std::string& path, const std::string& kind,
                               std::string* model_id, std::string* name);

// Whether `path`, with every symbolic link resolved (it need not exist),
// lies under the directory `root` (resolved too). False when either cannot
// be resolved.
bool within_dir(const std::string& root, const std::string& path);

// `message` with every occurrence of `dir` replaced by `label`: error
// messages name the client's tinker:// path, never a server file path.
std::string scrub_path(std::string message, const std::string& dir,
                       const std::string& label);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_CHECKPOINT_PATHS_H_
