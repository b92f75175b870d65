#include "comm/local_world.h"

#include <string>
#include <system_error>
#include <thread>

#include "common/errors.h"

namespace zerostep {

void LocalWorld::run(const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors = run_collect(fn);
  std::exception_ptr first_comm;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommError&) {
      if (!first_comm) first_comm = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first_comm) std::rethrow_exception(first_comm);
}

// Note [A rank whose thread cannot start]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every rank of a local world is a thread, so a world larger than the
// process may start (RLIMIT_NPROC, kernel.threads-max, address space for
// the stacks) fails where std::thread throws std::system_error. Left
// alone, the started threads stay joinable when the vector holding them
// unwinds, and the process ends in std::terminate (or first hangs, with
// the started ranks waiting for the missing ones in a collective). Here
// the ranks not started get a UsageError, the backend releases the
// started ones (SimWorld marks the missing ranks exited, so their
// collectives fail with CommError; Gloo's fail at its timeout), and every
// started thread is joined.
std::vector<std::exception_ptr> run_thread_per_rank(
    int world_size, const std::function<void(int rank)>& fn,
    const std::function<void(int first_not_started)>& not_started) {
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    try {
      threads.emplace_back([&errors, &fn, r] {
        try {
          fn(r);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    } catch (const std::system_error& e) {
      const UsageError why(
          "could not start the thread of rank " + std::to_string(r) + " of " +
          std::to_string(world_size) + " (" + e.what() +
          "): each rank of a local world is a thread of this process, and "
          "it may start no more (ulimit -u, /proc/sys/kernel/threads-max, or "
          "memory for their stacks). Fix: run fewer ranks (the harness's "
          "--simulate-scale models thousands of ranks without a thread "
          "each)");
      for (int q = r; q < world_size; ++q)
        errors[q] = std::make_exception_ptr(why);
      if (not_started) not_started(r);
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace zerostep
