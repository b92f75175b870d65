// ShapeOnlyCommunicator: one rank of a world of `world_size` identical
// ranks, whose collectives carry shapes and dtypes but no data, charged to
// a virtual clock. The simulator's scale mode (scale/scale_sim.h) drives it
// with the stages' schedule (zero/schedule.h) to time thousands of ranks in
// one process.
//
// Note [Symmetric ranks]
// ~~~~~~~~~~~~~~~~~~~~~~
// In data-parallel training without faults every rank issues the same
// collectives with the same sizes and does the same compute (ZeRO pads
// every partition to the same length), so every rank's clock is the same
// function of the call sequence: a collective is ready everywhere at the
// moment it is ready here. One rank therefore stands for all of them, with
// SimWorld's clock rules (Note [Virtual clock]) under that symmetry: start
// = max(now, comm_free), end = start + CostModel::collective_seconds().
// sim/shape_only_comm_test.cc checks that this clock equals SimWorld's on
// the same call sequence. What symmetry leaves out: data-dependent
// behaviour (there is none in the schedule), stragglers and faults
// (SimWorld models those), and contention between concurrent collectives
// (neither clock models it: an async collective occupies the rank's one
// communication stream).
//
// Buffers may have data == nullptr; nothing is read or written.
//
// Thread safety: none; one thread.
#ifndef ZEROSTEP_SIM_SHAPE_ONLY_COMM_H_
#define ZEROSTEP_SIM_SHAPE_ONLY_COMM_H_

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "sim/cost_model.h"
#include "sim/sim_world.h"

namespace zerostep {

class ShapeOnlyCommunicator final : public Communicator {
 public:
  // UsageError if world_size < 1.
  ShapeOnlyCommunicator(int world_size, const CostModel& cost);

  int rank() const override { return 0; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "sim-shape-only"; }

  // Sizes are checked as on every backend (UsageError); data is not used.
  void all_reduce(Buffer buf, const AllReduceOptions& opts) override;
  void reduce_scatter(Buffer input, Buffer output,
                      const ReduceScatterOptions& opts) override;
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) override;
  std::shared_ptr<Work> all_reduce_async(Buffer buf,
                                         const AllReduceOptions& opts) override;
  void all_gather(Buffer input, Buffer output,
                  const AllGatherOptions& opts) override;
  void broadcast(Buffer buf, const BroadcastOptions& opts) override;
  void barrier() override;

  // Advances the compute time (Note [Virtual clock]).
  void compute(double seconds);
  const SimClock& clock() const { return clock_; }
  const std::vector<CollectiveTiming>& timeline() const { return timeline_; }

 private:
  class ShapeWork;
  // Charges one collective; returns its end.
  double charge(CollectiveKind kind, uint64_t bytes, const char* label,
                bool async);

  int world_size_;
  CostModel cost_;
  SimClock clock_;
  double comm_free_s_ = 0.0;
  int64_t seq_ = 0;
  std::vector<CollectiveTiming> timeline_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_SIM_SHAPE_ONLY_COMM_H_
