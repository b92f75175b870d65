// Fault scenarios: training runs on a SimWorld with injected faults
// (sim/faults.h), checked against the fault contract.
//
// run_fault_scenario() trains one mode (managed or unmanaged) of a scenario
// twice on the simulator: once without faults (the baseline) and once with
// `faults`. Before every backward() and step() each rank records its
// parameters (stages 0-1 in float32: the flat buffer; stage 2 and bf16's
// partitioned master: its partition; stage 3: its partitions and the
// persistent parameters), its optimizer state (moments, step count) and its
// counters (global_steps, global_samples, micro_steps, lr).
//
// Note [Fault contract]
// ~~~~~~~~~~~~~~~~~~~~~
// A run with faults is ok when:
//   - no rank failed, and every rank's parameters equal the baseline's
//     bitwise (a straggler within the timeout, or a fault placed beyond the
//     run's last collective, costs virtual time only); or
//   - every rank failed with CommError, and on every rank
//       * the message names an injected fault that hit the failed
//         collective (its text "injected fault crash:2@7", the rank at fault
//         and "collective #K" for a K the fault covers) and the engine call
//         (backward() / step() / a ZeRO-3 block's forward, with the global
//         step; or "phase setup" when the Engine's constructor failed);
//       * parameters, optimizer state and counters equal what they were
//         before the failing call, bitwise (no partial update): stages 0-1
//         in float32 the whole replica, stage 2 and bf16 at stages 1-2 the
//         rank's own partition (Note [Transactional update]);
//       * a further step() is refused with UsageError;
//       * its virtual clock is at most the baseline's final time plus every
//         straggler delay plus one timeout (bounded time, never a hang).
// Any other outcome is a failure, listed in FaultRunResult::failures.
//
// Thread safety: reentrant (see run_scenario).
#ifndef ZEROSTEP_PARITY_FAULT_RUN_H_
#define ZEROSTEP_PARITY_FAULT_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "parity/scenario.h"
#include "sim/faults.h"
#include "sim/sim_world.h"

namespace zerostep {

struct FaultScenario {
  // stage, world_size, backwards, scaling, model, seed, micro_batch,
  // overlap_comm, bucket sizes, persistence threshold, clipping (backend is
  // always sim).
  Scenario scenario;
  bool managed = false;
  FaultOptions faults;
};

struct FaultRankOutcome {
  std::string error;       // what() of the error the rank ended with, or ""
  std::string error_type;  // "CommError", "UsageError", ... or ""
  // The call that failed: "backward 2 of window 1", "step of window 0",
  // "Engine construction".
  std::string failed_call;
  bool state_unchanged = true;  // vs before the failing call, bitwise
  bool refused_after = true;    // a further step() was a UsageError
  double virtual_time_s = 0.0;  // the rank's clock at the end
  double exposed_comm_s = 0.0;
  std::string digest;  // FNV-1a of the final parameters (ranks that finished)
};

struct FaultRunResult {
  FaultScenario run;
  std::vector<FaultRankOutcome> ranks;
  bool any_failed = false;
  int64_t baseline_collectives = 0;  // per rank, without faults
  double baseline_time_s = 0.0;      // rank 0's clock without faults
  std::string baseline_digest;
  bool ok = false;
  std::vector<std::string> failures;  // Note [Fault contract] violations
  // The harness command line that replays this run exactly.
  std::string replay;
};

// Throws UsageError / ConfigError for an invalid scenario or faults that do
// not fit the world; contract violations go to `failures`, never throws
// for them.
FaultRunResult run_fault_scenario(const FaultScenario& run);

// "./bazelw run //tools:harness -- --faults=... --stages=... ...".
std::string replay_command(const FaultScenario& run);

// The collectives rank 0 issues in a fault-free run of `run`, in order (the
// range swarm mode draws fault positions from; tests pick the ones inside
// step()).
std::vector<CollectiveTiming> baseline_schedule(const FaultScenario& run);

}  // namespace zerostep

#endif  // ZEROSTEP_PARITY_FAULT_RUN_H_
