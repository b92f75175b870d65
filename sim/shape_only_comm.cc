#include "sim/shape_only_comm.h"

#include <algorithm>

#include "common/errors.h"

namespace zerostep {

class ShapeOnlyCommunicator::ShapeWork final : public Work {
 public:
  ShapeWork(ShapeOnlyCommunicator* comm, double end_s)
      : comm_(comm), end_s_(end_s) {}
  void wait() override {
    SimClock& c = comm_->clock_;
    if (end_s_ > c.now_s) {
      c.exposed_comm_s += end_s_ - c.now_s;
      c.now_s = end_s_;
    }
  }

 private:
  ShapeOnlyCommunicator* comm_;
  double end_s_;
};

namespace {

void check_multiple(const char* op, size_t big, size_t small, int world) {
  if (big != small * static_cast<size_t>(world))
    throw UsageError(std::string(op) + " on the shape-only communicator: " +
                     std::to_string(big) + " elements are not world_size " +
                     std::to_string(world) + " x " + std::to_string(small));
}

}  // namespace

ShapeOnlyCommunicator::ShapeOnlyCommunicator(int world_size,
                                             const CostModel& cost)
    : world_size_(world_size), cost_(cost) {
  if (world_size < 1)
    throw UsageError("ShapeOnlyCommunicator world_size = " +
                     std::to_string(world_size) + ": must be at least 1");
}

double ShapeOnlyCommunicator::charge(CollectiveKind kind, uint64_t bytes,
                                     const char* label, bool async) {
  CollectiveTiming t;
  t.seq = seq_++;
  t.kind = kind;
  t.label = label;
  t.bytes = bytes;
  t.async = async;
  t.issue_s = clock_.now_s;
  t.start_s = std::max(clock_.now_s, comm_free_s_);
  const double cost = cost_.collective_seconds(kind, bytes, world_size_);
  t.end_s = t.start_s + cost;
  clock_.comm_s += cost;
  if (!async) {
    clock_.exposed_comm_s += t.end_s - clock_.now_s;
    clock_.now_s = t.end_s;
  }
  comm_free_s_ = t.end_s;
  timeline_.push_back(t);
  return t.end_s;
}

void ShapeOnlyCommunicator::all_reduce(Buffer buf,
                                       const AllReduceOptions& opts) {
  charge(CollectiveKind::kAllReduce, buf.bytes(), opts.label, false);
}

void ShapeOnlyCommunicator::reduce_scatter(Buffer input, Buffer output,
                                           const ReduceScatterOptions& opts) {
  refuse_accumulate("shape_only", 0, opts);
  check_multiple("reduce_scatter", input.numel, output.numel, world_size_);
  charge(CollectiveKind::kReduceScatter, input.bytes(), opts.label, false);
}

std::shared_ptr<Work> ShapeOnlyCommunicator::reduce_scatter_async(
    Buffer input, Buffer output, const ReduceScatterOptions& opts) {
  refuse_accumulate("shape_only", 0, opts);
  check_multiple("reduce_scatter", input.numel, output.numel, world_size_);
  const double end =
      charge(CollectiveKind::kReduceScatter, input.bytes(), opts.label, true);
  return std::make_shared<ShapeWork>(this, end);
}

std::shared_ptr<Work> ShapeOnlyCommunicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  const double end =
      charge(CollectiveKind::kAllReduce, buf.bytes(), opts.label, true);
  return std::make_shared<ShapeWork>(this, end);
}

void ShapeOnlyCommunicator::all_gather(Buffer input, Buffer output,
                                       const AllGatherOptions& opts) {
  check_multiple("all_gather", output.numel, input.numel, world_size_);
  charge(CollectiveKind::kAllGather, output.bytes(), opts.label, false);
}

void ShapeOnlyCommunicator::broadcast(Buffer buf,
                                      const BroadcastOptions& opts) {
  check_broadcast_root(opts.root, world_size_);
  charge(CollectiveKind::kBroadcast, buf.bytes(), opts.label, false);
}

void ShapeOnlyCommunicator::barrier() {
  charge(CollectiveKind::kBarrier, 0, kBarrierLabel, false);
}

void ShapeOnlyCommunicator::compute(double seconds) {
  ZS_CHECK(seconds >= 0.0);
  clock_.now_s += seconds;
}

}  // namespace zerostep
