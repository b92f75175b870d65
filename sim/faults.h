// FaultOptions: seeded, replayable faults that SimWorld injects into its
// collectives. The engine and the stages know nothing of them: a fault is
// something the simulated network or a simulated peer does.
//
// Note [Fault model]
// ~~~~~~~~~~~~~~~~~~
// A fault is placed at one rank's k-th collective, counted from 0 at the
// start of each SimWorld::run()/run_collect() (the ledger's `seq`; every
// rank's k-th collective is the same collective, so k also names it).
//
//   crash:R@K          rank R dies on entering its collective K: its call
//                      throws CommError and the rank leaves the world. The
//                      ranks that wait for it give up `timeout_s` virtual
//                      seconds after they arrived.
//   straggle:R@KxN:D   rank R reaches its collectives K .. K+N-1 D virtual
//                      seconds late (xN may be left out: N = 1). A delay
//                      within the timeout only costs time; a rank that
//                      arrives more than `timeout_s` after the first one
//                      makes the collective time out on every rank.
//   mismatch:R@K:F     rank R's collective K differs from the others' in F:
//                      `op` (another collective), `dtype` or `count` (one
//                      more element). Needs world_size >= 2.
//   lost:R@K           rank R's part of collective K is lost (a peer that
//                      is alive but unreachable): the collective never
//                      completes, and every rank, R included, gives up
//                      `timeout_s` virtual seconds after it arrived.
//   timeout:S          the virtual seconds a rank waits for a collective
//                      (default 60); not a fault, an option.
//
// Each fault ends as CommError on every rank that reaches that collective,
// naming the rank at fault, the collective's number, op and phase, and the
// virtual time; never a hang, in bounded virtual time (wall time does not
// enter). Faults are written as a comma-separated list of the items above
// (to_string / parse_fault_options round-trip exactly), which is what
// tools/harness --faults takes, so a printed run replays.
//
// Thread safety: value types; the functions are pure.
#ifndef ZEROSTEP_SIM_FAULTS_H_
#define ZEROSTEP_SIM_FAULTS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace zerostep {

enum class FaultKind : uint8_t { kCrash, kStraggle, kMismatch, kLostPeer };
enum class MismatchField : uint8_t { kOp, kDtype, kCount };

const char* to_string(FaultKind kind);
const char* to_string(MismatchField field);

struct Fault {
  FaultKind kind = FaultKind::kCrash;
  int rank = 0;
  int64_t collective = 0;  // the rank's collective index, from 0
  int64_t count = 1;       // straggle: consecutive collectives delayed
  double delay_s = 0.0;    // straggle: virtual seconds per collective
  MismatchField field = MismatchField::kCount;  // mismatch

  // Whether this fault applies to `rank`'s collective `seq`.
  bool hits(int rank, int64_t seq) const;
  // "crash:2@7", "straggle:1@3x2:0.5", "mismatch:0@4:dtype", "lost:3@9".
  std::string to_string() const;
};

struct FaultOptions {
  std::vector<Fault> faults;  // default: none
  // Virtual seconds a rank waits in a collective for its peers before it
  // gives up with CommError. Default 60.
  double timeout_s = 60.0;

  bool empty() const { return faults.empty(); }
  // "crash:2@7,straggle:1@3:0.5,timeout:60" ("timeout:60" alone when there
  // is no fault). parse_fault_options(to_string()) == *this.
  std::string to_string() const;
};

// Parses the text form (Note [Fault model]); "" or "none" is no fault.
// Throws UsageError naming the bad item and the grammar.
FaultOptions parse_fault_options(const std::string& text);

// UsageError if a fault names a rank outside [0, world_size), a negative
// collective, a negative delay, a count < 1, a mismatch in a world of one
// rank, or timeout_s <= 0.
void validate(const FaultOptions& options, int world_size);

// Swarm mode: a fault mix drawn from `seed` alone (splitmix64), for a world
// of `world_size` ranks whose runs issue about `collectives` collectives
// per rank: 1 to 3 faults of random kinds, ranks and positions in
// [0, collectives), straggle delays from 1 ms up to twice the timeout (so
// some time out and some only cost time), mismatches only when
// world_size >= 2. The same arguments always give the same options.
FaultOptions draw_fault_options(uint64_t seed, int world_size,
                                int64_t collectives);

}  // namespace zerostep

#endif  // ZEROSTEP_SIM_FAULTS_H_
