// Checkpoint files: the on-disk format and atomic file writes. Torch-free;
// the Engine (engine/checkpoint.cc) decides what goes in them.
//
// A checkpoint is a folder <dir>/<tag>/ holding one file per rank,
// rank_<r>.bin, and manifest.json, written last by rank 0; <dir>/latest
// names the newest complete tag. Every file is written to a temporary name,
// fsync'ed and renamed into place, and the folder is fsync'ed.
//
// Note [Checkpoint switch]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A save builds the new checkpoint beside the old one and switches it in;
// a crash at any point (any write, fsync or rename, on any rank) leaves the
// old or the new checkpoint loadable under <tag>, and `latest` naming a
// loadable one. With S = <dir>/.<tag>.tmp and B = <dir>/.<tag>.old:
//   1. rank 0 recovers from an interrupted save (B without <tag>: B is
//      renamed back; B beside <tag>: B is removed), removes any S, creates
//      S empty;
//   2. every rank writes S/rank_<r>.bin; rank 0 then S/manifest.json, so S
//      is complete;
//   3. rank 0 renames <tag> (if any) to B, S to <tag> (rename(2) cannot
//      replace a non-empty folder, hence two renames), fsyncs <dir>,
//      writes `latest`, and removes B.
// resolve_checkpoint_folder() gives a load the folder for <tag>: <tag>
// itself if it exists (it is only ever made by renaming a complete S),
// else B (the old checkpoint, caught between the two renames), else S (a
// first save under <tag> caught before its rename; loadable only if its
// manifest was written). `latest` is written only after step 3's renames,
// so it always names a tag that resolves.
//
// rank_<r>.bin: "ZSCKPT01", a little-endian uint64 header length, a JSON
// header, the rank's owned parameters, exp_avg and exp_avg_sq (float32, in
// its optimizer's order, with the segments that map them to the canonical
// parameter order), then the FNV-1a 64 of all the bytes before it.
//
// manifest.json: one JSON object (Manifest below) with "format" =
// kCheckpointFormat, whose "manifest_fnv1a" is the FNV-1a 64 (16 hex
// digits) of the compact dump of every other key (nlohmann's dump: keys
// sorted), so any edit of any value is found on load. A manifest of the
// older kCheckpointFormatV1 (no checksum of its own) still loads, with
// every field checked and a warning through the log hook (common/log.h)
// that an edit cannot be detected.
//
// Errors: IoError naming the path and the cause (missing, short, corrupt,
// not writable); for a manifest, also the field.
#ifndef ZEROSTEP_ENGINE_CHECKPOINT_IO_H_
#define ZEROSTEP_ENGINE_CHECKPOINT_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "zero/stage.h"

namespace zerostep {

inline constexpr const char* kCheckpointFormat = "zerostep-checkpoint-2";
inline constexpr const char* kCheckpointFormatV1 = "zerostep-checkpoint-1";

struct RankState {
  int rank = 0;
  std::vector<Segment> segments;
  std::vector<float> params;      // owned, optimizer order
  std::vector<float> exp_avg;     // empty if the optimizer keeps none
  std::vector<float> exp_avg_sq;  // empty if the optimizer keeps none
};

// What manifest.json holds (the engine fills and reads it; the names are
// the JSON keys).
struct Manifest {
  struct File {
    std::string name;  // rank_<r>.bin
    uint64_t bytes = 0;
    uint64_t fnv1a = 0;  // of the whole file
  };
  int world_size = 1;
  int stage = 0;
  uint64_t numel = 0;  // the sum of param_numels
  std::vector<uint64_t> param_numels;
  std::string optimizer;  // config/optimizer.h to_string
  int64_t optimizer_steps = 0;
  // "counters": engine/boundary.h.
  int64_t micro_steps = 0;
  int64_t global_steps = 0;
  int64_t global_samples = 0;
  int64_t skipped_steps = 0;
  int64_t lr_schedule_iteration = -1;
  std::string dtype = "fp32";  // fp32, bf16 or fp16
  // "loss_scaler": engine/loss_scaler.h State.
  double loss_scale = 1.0;
  int64_t loss_scale_iteration = 0;
  int64_t last_overflow_iteration = -1;
  int64_t hysteresis_left = 1;
  std::vector<File> files;  // one per rank, in rank order
};

// The manifest's bytes, "manifest_fnv1a" included.
std::string encode_manifest(const Manifest& manifest);
// Parses and verifies manifest bytes read from `path`. IoError naming
// `path` and the field when the checksum does not match (any edit), a
// field is missing or of the wrong type, a value is out of range, or
// values contradict each other (Note [Manifest invariants] in the .cc).
Manifest decode_manifest(const std::string& bytes, const std::string& path);
// FNV-1a 64 of a manifest's canonical content, as 16 hex digits
// (`manifest_json` is the manifest without "manifest_fnv1a", compact).
std::string manifest_checksum(const std::string& manifest_json);

// The file operations a save makes, so that a test can stop a save after
// any one of them (a decorator, as engine/checkpoint_test.cc's); reads are
// not behind it. Every method throws IoError naming the path on failure.
// Thread safety: as the implementation; the POSIX one is stateless.
class CheckpointFiles {
 public:
  virtual ~CheckpointFiles() = default;
  // Creates or truncates `path` and writes `bytes` (no fsync).
  virtual void write(const std::string& path, const std::string& bytes) = 0;
  virtual void sync_file(const std::string& path) = 0;
  // fsync of a folder, so that the renames and creations in it are durable.
  virtual void sync_folder(const std::string& path) = 0;
  // rename(2): replaces a file or an empty folder at `to`.
  virtual void rename(const std::string& from, const std::string& to) = 0;
  // One folder; succeeds if it exists.
  virtual void make_folder(const std::string& path) = 0;
  virtual void remove_file(const std::string& path) = 0;
  // An empty folder.
  virtual void remove_folder(const std::string& path) = 0;
};

// The real file system (a process-wide instance).
CheckpointFiles& posix_checkpoint_files();

// Writes `bytes` to `path` atomically through `files`: `path`.tmp, fsync,
// rename, fsync of the folder.
void atomic_write_file(CheckpointFiles& files, const std::string& path,
                       const std::string& bytes);
// Removes `path` and everything in it through `files`; nothing if it does
// not exist.
void remove_tree(CheckpointFiles& files, const std::string& path);
// Whether `path` exists (file or folder).
bool path_exists(const std::string& path);
// Note [Checkpoint switch]: the folder a load of `tag` in `dir` reads.
std::string resolve_checkpoint_folder(const std::string& dir,
                                      const std::string& tag);
// Note [Checkpoint switch]: <dir>/.<tag>.tmp and <dir>/.<tag>.old.
std::string staging_folder(const std::string& dir, const std::string& tag);
std::string backup_folder(const std::string& dir, const std::string& tag);

// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync
// of the folder). IoError on any failure; `path` is then unchanged.
void atomic_write_file(const std::string& path, const std::string& bytes);
// The whole file. IoError if it cannot be read.
std::string read_file(const std::string& path);
// mkdir -p. IoError naming the path.
void make_dirs(const std::string& path);

// Encodes a rank file; returns its bytes.
std::string encode_rank_state(const RankState& state);
// Decodes and verifies a rank file read from `path` (for messages).
// IoError if it is truncated or its checksum does not match.
RankState decode_rank_state(const std::string& bytes, const std::string& path);

uint64_t fnv1a64(const void* data, size_t bytes);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_CHECKPOINT_IO_H_
