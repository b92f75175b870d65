// EngineSnapshot: everything a failed engine call must leave as it was on one
// rank (Note [Transactional update] in zero/stage.h): the parameters
// (stages 0-1 in float32: the flat buffer; stage 2 and bf16's partitioned
// master: the rank's partition; stage 3: the rank's partitions and the
// persistent parameters it keeps whole), Adam's moments, the counters and
// the learning rate.
//
// The fault runs (parity/fault_run.h) compare a rank's state around every
// faulty call; tools/gloo_worker does it in real processes whose peers
// were killed or stopped.
//
// Thread safety: values; capture_engine_snapshot reads one Engine, from its
// rank's thread.
#ifndef ZEROSTEP_PARITY_ENGINE_SNAPSHOT_H_
#define ZEROSTEP_PARITY_ENGINE_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace zerostep {

class Engine;

struct EngineSnapshot {
  std::vector<float> params;  // the replica or the partitions (above)
  // Stage 3: each parameter whose storage is live (the persistent ones
  // between calls), else empty.
  std::vector<std::vector<float>> live;
  std::vector<float> exp_avg, exp_avg_sq;
  int64_t optimizer_steps = 0;
  int64_t global_steps = 0, global_samples = 0, micro_steps = 0;
  double lr = 0.0;
  // Bitwise. A group gathered inside the failed call is live only
  // afterwards: only what is live in both (the persistent parameters) is
  // compared.
  bool operator==(const EngineSnapshot& o) const;
  // FNV-1a 64 (hex) of the parameters, moments and counters (not `live`,
  // which repeats parameters the partitions hold).
  std::string digest() const;
};

EngineSnapshot capture_engine_snapshot(Engine& e);

}  // namespace zerostep

#endif  // ZEROSTEP_PARITY_ENGINE_SNAPSHOT_H_
