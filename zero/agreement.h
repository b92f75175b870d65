// Agreement: the few collectives the engine layer needs outside a stage's
// window protocol, so that no engine code calls the Communicator itself
// (DESIGN: "the engine never issues collectives"): the broadcast that gives
// every replica rank 0's initial parameters, and the checkpoint's
// agreements (every rank between windows; every rank's file written; rank
// 0's manifest written).
//
// Each function is a collective: every rank calls it at the same point.
// A failed collective throws CommError (the communicator's).
//
// Thread safety: as the Communicator (one thread per rank).
#ifndef ZEROSTEP_ZERO_AGREEMENT_H_
#define ZEROSTEP_ZERO_AGREEMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace zerostep {

// Every replica starts from rank 0's values: broadcasts data[0, n).
void broadcast_initial_parameters(Communicator& comm, float* data, size_t n);

// Every rank learns every rank's open-window backward() count; if any is
// not zero, every rank throws the same UsageError: "<what> inside an open
// accumulation window (rank r has k backward() call(s) since its last
// step()) ... Nothing was written".
void agree_between_windows(Communicator& comm, int64_t window_backwards,
                           const std::string& what);

// What one rank reports after writing its part of a checkpoint.
struct RankOutcome {
  bool failed = false;
  uint64_t bytes = 0;     // of the file it wrote
  uint64_t checksum = 0;  // FNV-1a 64 of the file
};

// Every rank's outcome, in rank order (one all-gather of 24 bytes a rank).
std::vector<RankOutcome> share_outcomes(Communicator& comm,
                                        const RankOutcome& mine);

// Rank 0's `root_failed` on every rank (one 8-byte broadcast); the other
// ranks' argument is ignored.
bool root_failed(Communicator& comm, bool root_failed);

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_AGREEMENT_H_
