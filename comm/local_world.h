// LocalWorld: W ranks of one backend inside this process, one thread per
// rank, each with its own Communicator and traffic ledger. SimWorld (the
// simulator) and GlooLocalWorld (real Gloo over loopback TCP) implement it,
// so the parity runner, the engine tests and the conformance suite run on
// either.
//
// Thread safety: run_collect() must not be called concurrently with itself;
// comm(r) belongs to rank r's thread inside run_collect().
#ifndef ZEROSTEP_COMM_LOCAL_WORLD_H_
#define ZEROSTEP_COMM_LOCAL_WORLD_H_

#include <exception>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "comm/ledger.h"

namespace zerostep {

class LocalWorld {
 public:
  virtual ~LocalWorld() = default;
  virtual int world_size() const = 0;
  // Rank r's communicator; records into ledger(r).
  virtual Communicator& comm(int rank) = 0;
  virtual const Ledger& ledger(int rank) const = 0;
  virtual Ledger& mutable_ledger(int rank) = 0;
  // Runs fn(rank) on one thread per rank and joins them all. Returns the
  // error each rank ended with (nullptr for success).
  virtual std::vector<std::exception_ptr> run_collect(
      const std::function<void(int rank)>& fn) = 0;
  // As run_collect, but rethrows the root cause: the first rank's error
  // that is not a CommError (a consequence of another rank's failure), else
  // the first CommError, in rank order unless the backend knows better.
  virtual void run(const std::function<void(int rank)>& fn);
};

// Runs fn(rank) on one new thread per rank, 0 to world_size - 1, and joins
// them all; returns what each rank's fn threw (nullptr where it returned).
// Where the process cannot start rank r's thread (Note [A rank whose thread
// cannot start] in local_world.cc), the ranks from r on get a UsageError
// that says why and how to fix it, and `not_started(r)` runs (when given)
// before the started threads are joined, so that a backend can release
// them from collectives that wait for the missing ranks.
std::vector<std::exception_ptr> run_thread_per_rank(
    int world_size, const std::function<void(int rank)>& fn,
    const std::function<void(int first_not_started)>& not_started = nullptr);

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_LOCAL_WORLD_H_
