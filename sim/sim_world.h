// SimWorld: N simulated ranks in one process, connected by a deterministic
// Communicator backend ("sim"), with a traffic ledger per rank.
//
// A run is defined by its seed: SimWorld itself draws nothing at random today
// (the seed is carried for the engine's data and for fault injection), and
// every result is independent of how the OS schedules the rank threads:
//
// Note [Reduction order]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every reduction is computed by one thread, once all ranks have arrived,
// elementwise in rank order: acc = x[0]; acc = acc (op) x[1]; ...;
// acc = acc (op) x[W-1], in the buffer's dtype. kAvg is the kSum result
// divided by W (a true division, not a multiplication by 1/W). All ranks
// receive the same bits. Real backends (ring, tree) sum in other orders, so
// their float results may differ from sim's in the last bits; zerostep's
// managed/unmanaged parity does not depend on the order, only on it being
// the same for both modes.
//
// Failure model: if a rank's function throws, the rank is marked exited and
// every other rank blocked in (or later entering) a collective that needs it
// gets CommError naming that rank and its error. Ranks that issue mismatched
// collectives (op, reduce op, dtype, count or root) all get CommError
// describing both calls. Nothing hangs.
//
// Thread safety: run() must not be called concurrently with itself. comm(r)
// must only be used from rank r's thread inside run().
#ifndef ZEROSTEP_SIM_SIM_WORLD_H_
#define ZEROSTEP_SIM_SIM_WORLD_H_

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

namespace zerostep {

struct SimOptions {
  int world_size = 1;  // number of simulated ranks, >= 1
  uint64_t seed = 0;   // identifies the run; printed by tools
};

class SimWorld final : public LocalWorld {
 public:
  // Throws UsageError if options.world_size < 1.
  explicit SimWorld(const SimOptions& options);
  ~SimWorld();
  SimWorld(const SimWorld&) = delete;
  SimWorld& operator=(const SimWorld&) = delete;

  int world_size() const override { return options_.world_size; }
  uint64_t seed() const { return options_.seed; }

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
  struct Arrival;
  struct Slot;

  void collective(int rank, Arrival arrival);
  void execute(Slot& slot);
  void mark_exited(int rank, const std::string& reason);
  // `n` elements of reusable scratch (grown, never shrunk), so collectives
  // do not allocate and first-touch fresh pages on every call.
  template <typename T>
  T* scratch(size_t n) {
    if (scratch_.size() < n * sizeof(T)) scratch_.resize(n * sizeof(T));
    return reinterpret_cast<T*>(scratch_.data());
  }

  SimOptions options_;
  std::vector<std::unique_ptr<RankComm>> raw_comms_;
  std::vector<Ledger> ledgers_;
  std::vector<std::unique_ptr<RecordingCommunicator>> comms_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, std::unique_ptr<Slot>> slots_;  // GUARDED_BY(mu_)
  std::vector<int64_t> next_seq_;                   // GUARDED_BY(mu_)
  std::vector<bool> exited_;                        // GUARDED_BY(mu_)
  std::vector<std::string> exit_reason_;            // GUARDED_BY(mu_)
  int first_failed_rank_ = -1;                      // GUARDED_BY(mu_)
  std::vector<unsigned char> scratch_;              // GUARDED_BY(mu_)
};

}  // namespace zerostep

#endif  // ZEROSTEP_SIM_SIM_WORLD_H_
