// The Communicator conformance suite: one set of tests that every backend
// registers into (sim always; gloo in CI; nccl on a GPU node).
//
// A backend provides a runner that executes a rank body on every rank of a
// world of the given size (threads for sim, processes for gloo) and reports
// each rank's failures through GoogleTest assertions, which are thread-safe.
//
//   register_communicator_conformance("sim", [] { return make_sim_runner(); });
//
// registers tests named CommConformance/sim.<case>/world<W>. Call it before
// RUN_ALL_TESTS (e.g. from a static initializer in the backend's test).
#ifndef ZEROSTEP_COMM_CONFORMANCE_H_
#define ZEROSTEP_COMM_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace zerostep {

using RankBody = std::function<void(Communicator& comm)>;

class ConformanceRunner {
 public:
  virtual ~ConformanceRunner() = default;
  // Runs `body` once on every rank of a world of `world_size` ranks.
  virtual void run(int world_size, const RankBody& body) = 0;
  // World sizes the suite is run at for this backend.
  virtual std::vector<int> world_sizes() const = 0;
};

void register_communicator_conformance(
    const std::string& backend,
    std::function<std::unique_ptr<ConformanceRunner>()> make_runner);

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_CONFORMANCE_H_
