// Checkpoint files: the on-disk format and atomic file writes. Torch-free;
// the Engine (engine/checkpoint.cc) decides what goes in them.
//
// A checkpoint is a folder <dir>/<tag>/ holding one file per rank,
// rank_<r>.bin, and manifest.json, written last by rank 0; <dir>/latest
// names the newest complete tag. Every file is written to a temporary name,
// fsync'ed and renamed into place, and the folder is fsync'ed, so a crash at
// any point leaves the previous checkpoint (and `latest`) intact: a tag
// without a manifest is not a checkpoint.
//
// rank_<r>.bin: "ZSCKPT01", a little-endian uint64 header length, a JSON
// header, the rank's owned parameters, exp_avg and exp_avg_sq (float32, in
// its optimizer's order, with the segments that map them to the canonical
// parameter order), then the FNV-1a 64 of all the bytes before it.
//
// manifest.json: one JSON object (Manifest below) whose "manifest_fnv1a"
// is the FNV-1a 64 (16 hex digits) of the compact dump of every other key
// (nlohmann's dump: keys sorted), so any edit of any value is found on
// load.
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
