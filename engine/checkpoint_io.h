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
// Errors: IoError naming the path and the cause (missing, short, corrupt,
// not writable).
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
