// SimWorld: N simulated ranks in one process, connected by a deterministic
// Communicator backend ("sim"), with a traffic ledger per rank, a virtual
// clock with a cost model, and seeded fault injection.
//
// A run is defined by its options (world size, seed, faults, cost model;
// describe() prints them all), and every result is independent of how the OS
// schedules the rank threads:
//
// Note [Reduction order]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every reduction runs once all ranks have arrived (by the pure functions
// of sim/reduction.h), and every element of it is computed by one thread,
// elementwise in rank order: acc = x[0]; acc = acc (op) x[1]; ...;
// acc = acc (op) x[W-1], in the buffer's dtype. A large one is split into
// parts of disjoint elements that the rank threads reduce at once (Note
// [Parallel reduction] in sim/reduction.cc); which thread reduces which
// part never changes an element's operations or their order. kAvg is the
// kSum result divided by W (a true division's bits: a multiplication by
// 1/W only where that is exact and rounds the same, Note [Finishing in
// the last pass] in comm/rank_order.h). All ranks receive the same bits. Real
// backends (ring, tree) sum in other orders, so their float results may differ
// from sim's in the last bits; zerostep's managed/unmanaged parity does not
// depend on the order, only on it being the same for both modes.
//
// Note [Virtual clock]
// ~~~~~~~~~~~~~~~~~~~~
// Each rank has a compute time `now` and a communication stream that is
// free from `comm_free`. A collective is ready on a rank at
// max(now, comm_free) (plus a straggler's delay); it starts when it is
// ready on every rank, and ends CostModel::collective_seconds() later
// (Note [Cost model]). A blocking collective moves the rank's `now` to the
// end; an asynchronous one (reduce_scatter_async) only occupies the stream,
// and Work::wait() moves `now` to its end if that is later. compute(r, s)
// advances `now` by s (drivers charge modelled FLOPs with it), so compute
// issued between an async launch and its wait() overlaps the collective.
// Exposed communication time is what `now` moved inside collectives and
// waits: the part of communication that compute did not hide. The clock
// is a function of the call sequence alone, never of wall time.
//
// Note [Sim collective]
// ~~~~~~~~~~~~~~~~~~~~~
// One rank's call of a collective passes four parts, each in one place in
// sim_world.cc:
//   numbering   collective(): the rank's k-th call of the run is #k;
//   clock       issue() and ready_time() when the rank calls, leave() when
//               it leaves (Note [Virtual clock]);
//   faults      inject(): the seeded faults at (rank, #k) delay the rank,
//               lose its part, change the call its peers see, or crash it;
//               survives_faults() at the meeting turns a lost part or a
//               straggler beyond the timeout into the collective's error;
//   rendezvous  arrive(), meet(), await(), depart(): the calls of #k meet
//               in one slot; the last rank to arrive checks that they match
//               and moves the data with sim/reduction.h, under the world's
//               one mutex, so the result is independent of thread timing.
//               A reduction of several parts (Note [Parallel reduction]) is
//               instead moved in reduce_parts() by every rank, outside the
//               mutex, each taking the next part not yet taken; no rank
//               leaves until every part is done. A rank that waits for
//               its peers spins briefly before it sleeps: on the CPU when
//               every rank can have a core, yielding its core when there
//               are more ranks than cores (Note [Spin before sleeping] in
//               sim_world.cc).
//
// Failure model: if a rank's function throws, the rank is marked exited and
// every other rank blocked in (or later entering) a collective that needs it
// gets CommError naming that rank and its error. Ranks that issue mismatched
// collectives (op, reduce op, dtype, count or root; labels are named in the
// message, not compared) all get CommError describing the calls. Injected
// faults (sim/faults.h, Note [Fault model]) end the same way, within
// SimOptions::faults.timeout_s of virtual time. Nothing hangs.
//
// Collective numbers (the ledger's seq, a fault's K) count from 0 at the
// start of every run()/run_collect(); clocks and timelines carry on across
// runs until reset_clocks().
//
// Thread safety: run() must not be called concurrently with itself. comm(r),
// compute(r, ...) must only be used from rank r's thread inside run();
// clock(r) and timeline(r) may be read from any thread between runs.
#ifndef ZEROSTEP_SIM_SIM_WORLD_H_
#define ZEROSTEP_SIM_SIM_WORLD_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/ledger.h"
#include "comm/local_world.h"
#include "sim/cost_model.h"
#include "sim/faults.h"

namespace zerostep {

struct SimOptions {
  int world_size = 1;  // number of simulated ranks, >= 1
  uint64_t seed = 0;   // identifies the run; printed by tools
  FaultOptions faults;  // injected faults; default none (sim/faults.h)
  CostModel cost;       // virtual time; defaults in sim/cost_model.h
};

// A rank's virtual time (Note [Virtual clock]).
struct SimClock {
  double now_s = 0.0;           // the rank's compute time
  double comm_s = 0.0;          // collective time it took part in (sum)
  double exposed_comm_s = 0.0;  // of which compute waited for
};

// One collective as this rank saw it on the virtual clock.
struct CollectiveTiming {
  int64_t seq = 0;
  CollectiveKind kind = CollectiveKind::kBarrier;
  const char* label = kBarrierLabel;  // the options' label
  uint64_t bytes = 0;  // payload, as the ledger counts it
  bool async = false;
  double issue_s = 0.0;  // `now` when the rank issued it
  double start_s = 0.0;  // ready on every rank
  double end_s = 0.0;
  bool failed = false;
};

class SimWorld final : public LocalWorld {
 public:
  // Throws UsageError if options.world_size < 1 or the faults do not fit
  // the world (validate() in sim/faults.h).
  explicit SimWorld(const SimOptions& options);
  ~SimWorld();
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  int world_size() const override { return options_.world_size; }
  uint64_t seed() const { return options_.seed; }
  const SimOptions& options() const { return options_; }
  // "seed=... world=... faults=... cost: ...": every option, one line.
  std::string describe() const;

  // Advances rank r's compute time by `seconds` (Note [Virtual clock]).
  void compute(int rank, double seconds);
  SimClock clock(int rank) const;
  // Every collective rank r issued since the last reset_clocks().
  const std::vector<CollectiveTiming>& timeline(int rank) const;
  // Clocks and timelines back to zero (not between a run's ranks).
  void reset_clocks();

  // Rank r's communicator; records into ledger(r).
  Communicator& comm(int rank) override;
  const Ledger& ledger(int rank) const override;
  Ledger& mutable_ledger(int rank) override;

  // Runs fn(rank) on one thread per rank and joins them all. Returns the
  // error each rank ended with (nullptr for success).
  std::vector<std::exception_ptr> run_collect(
      const std::function<void(int rank)>& fn) override;

  // As run_collect, but rethrows the first error raised in the world (the
  // root cause: the error of the first rank to fail; other ranks' CommErrors
  // are consequences of it).
  void run(const std::function<void(int rank)>& fn) override;

 private:
  class RankComm;
  class SimWork;
  struct Call;
  struct Slot;
  struct Injection;

  // Runs rank `rank`'s part of its next collective (Note [Sim collective]);
  // returns the virtual time it ends (for an async one: when wait() may
  // return).
  double collective(int rank, Call call);

  // Faults. What the faults that hit (rank, seq) do, applied in order:
  // a straggle adds to *ready, a mismatch changes *described; stops at a
  // crash.
  Injection inject(int rank, int64_t seq, Call* described,
                   double* ready) const;
  // The rank dies entering collective t.seq: throws CommError.
  [[noreturn]] void crash(int rank, double ready, const Fault& fault,
                          CollectiveTiming t);
  // At the meeting: fails the slot if a rank's part was lost or a straggler
  // came more than timeout_s after the first rank; returns whether not.
  bool survives_faults(Slot& slot, double first, int first_rank, double last,
                       int last_rank);

  // Rendezvous. The rank's call joins slot `seq`; the last to arrive
  // meets: checks and moves the data.
  Slot& arrive(int rank, int64_t seq, const Call& described,
               const Call& actual, double ready, bool lost,
               const std::string& injected);
  void meet(Slot& slot);
  // After a meeting that split the reduction into parts: reduces parts
  // until none is left, then waits until every part is done.
  void reduce_parts(std::unique_lock<std::mutex>& lock, int rank, Slot& slot);
  bool check_same(Slot& slot, const std::vector<Call>& calls, double last);
  void fail_slot(Slot& slot, int failure, const std::string& error);
  // Until the slot is done, or a rank it still needs has exited.
  void await(std::unique_lock<std::mutex>& lock, Slot& slot,
             const Call& described);
  // The last rank to leave frees the slot.
  void depart(Slot& slot);

  // Clock (Note [Virtual clock]).
  CollectiveTiming issue(int rank, int64_t seq, const Call& call) const;
  double ready_time(int rank) const;
  // Charges the rank's clock for leaving `slot`; returns when it leaves.
  double leave(int rank, const Slot& slot, double ready, CollectiveTiming* t);
  void wait_until(int rank, double end_s);

  void mark_exited(int rank, const std::string& reason);

  // Waking (Note [Spin before sleeping] in sim_world.cc): notify() wakes
  // every waiting rank; wait() returns once ready() holds, under the lock;
  // acquire() takes mu_ into `lock` (with more ranks than cores, yielding
  // between tries first).
  void notify();
  void acquire(std::unique_lock<std::mutex>& lock);
  template <typename Ready>
  void wait(std::unique_lock<std::mutex>& lock, Ready ready);

  SimOptions options_;
  std::vector<std::unique_ptr<RankComm>> raw_comms_;
  std::vector<Ledger> ledgers_;
  std::vector<std::unique_ptr<RecordingCommunicator>> comms_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> notifications_{0};  // notify() calls
  bool spin_ = false;  // every rank can have a core: wait() spins, not yields
  std::map<int64_t, std::unique_ptr<Slot>> slots_;  // GUARDED_BY(mu_)
  std::vector<int64_t> next_seq_;                   // GUARDED_BY(mu_)
  std::vector<bool> exited_;                        // GUARDED_BY(mu_)
  std::vector<std::string> exit_reason_;            // GUARDED_BY(mu_)
  int first_failed_rank_ = -1;                      // GUARDED_BY(mu_)
  // (collective, rank) of every injected fault that fired in this run.
  std::vector<std::pair<int64_t, int>> fired_;      // GUARDED_BY(mu_)
  std::vector<double> comm_free_;                   // GUARDED_BY(mu_)
  std::vector<SimClock> clocks_;                    // GUARDED_BY(mu_)
  std::vector<std::vector<CollectiveTiming>> timeline_;  // GUARDED_BY(mu_)
  // The reductions' working memory (sim/reduction.h), reused.
  std::vector<unsigned char> scratch_;              // GUARDED_BY(mu_)
  // Rank r's working memory for the parts it reduces (reduce_parts), used
  // only by rank r's thread, without the lock.
  std::vector<std::vector<unsigned char>> part_scratch_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_SIM_SIM_WORLD_H_
