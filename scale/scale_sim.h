// Scale mode: the stages' schedule (zero/schedule.h) of one accumulation
// window, played on a shape-only communicator (sim/shape_only_comm.h) for
// worlds of thousands of ranks, in one process, in milliseconds.
//
// What it reports per (model, stage, world): the virtual time of one window
// (N backward() calls and one step()), its compute and communication time
// and the part of communication compute did not hide, the bytes one rank
// moves (payload and ring wire bytes, per collective and phase) and the
// memory one rank holds. Ranks are symmetric (Note [Symmetric ranks]); the
// schedule is the stages' (Note [Shape-only schedule]); time follows
// Note [Cost model] and Note [Virtual clock].
//
// Thread safety: reentrant.
#ifndef ZEROSTEP_SCALE_SCALE_SIM_H_
#define ZEROSTEP_SCALE_SCALE_SIM_H_

#include <map>
#include <string>
#include <vector>

#include "comm/ledger.h"
#include "sim/cost_model.h"
#include "zero/schedule.h"

namespace zerostep {

// Decoder-only transformer presets (Llama-2 shapes): "1.3B", "7B", "13B",
// "70B". Each layer is a Zero3Block (its matrices: q, k, v, o, gate, up,
// down; its two norms fall under the persistence threshold); the token
// embedding and the output head are blocks of their own; the final norm
// is persistent. UsageError for another name, listing these.
ModelShape model_preset(const std::string& name);
std::vector<std::string> model_preset_names();
// Tokens one sample carries in a preset (its sequence length: 4096).
constexpr double kPresetSequenceLength = 4096;

struct ScaleOptions {
  ScheduleOptions schedule;  // stage, world_size, backwards, mode, buckets
  CostModel cost;
  double tokens_per_micro_batch = kPresetSequenceLength;  // per rank
};

struct ScaleReport {
  ScaleOptions options;
  std::string model;
  double params = 0.0;
  double step_s = 0.0;               // virtual time of one window
  double compute_s = 0.0;            // forward + backward + optimizer
  double comm_s = 0.0;               // collective time
  double exposed_comm_s = 0.0;       // of it, not hidden by compute
  uint64_t bytes_per_rank = 0;       // ledger payload bytes, one window
  uint64_t wire_bytes_per_rank = 0;  // ring bytes sent, one window
  // "reduce_scatter/backward" -> bytes (payload), one window.
  std::map<std::string, uint64_t> bytes_by_collective;
  std::vector<LedgerEntry> ledger;  // one window, in order
  MemoryStats memory;
};

// UsageError for invalid options (zero/schedule.h).
ScaleReport simulate_scale(const ModelShape& model,
                           const ScaleOptions& options);

}  // namespace zerostep

#endif  // ZEROSTEP_SCALE_SCALE_SIM_H_
