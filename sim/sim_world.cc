#include "sim/sim_world.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/errors.h"

namespace zerostep {

struct SimWorld::Arrival {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  Buffer input;
  Buffer output;
  int root = 0;
  Phase phase = Phase::kSetup;
};

struct SimWorld::Slot {
  int64_t seq = 0;
  std::vector<Arrival> arrivals;
  std::vector<bool> arrived;
  int num_arrived = 0;
  int num_left = 0;
  bool done = false;
  std::string error;  // non-empty: every participant throws CommError(error)
};

namespace {

std::string describe(CollectiveKind k, ReduceOp op, Buffer in, Buffer out,
                     int root) {
  std::ostringstream os;
  os << to_string(k) << "(";
  switch (k) {
    case CollectiveKind::kAllReduce:
      os << to_string(op) << ", " << to_string(in.dtype) << " x " << in.numel;
      break;
    case CollectiveKind::kReduceScatter:
      os << to_string(op) << ", " << to_string(in.dtype) << " x " << in.numel
         << " -> " << out.numel;
      break;
    case CollectiveKind::kAllGather:
      os << to_string(in.dtype) << " x " << in.numel << " -> " << out.numel;
      break;
    case CollectiveKind::kBroadcast:
      os << to_string(in.dtype) << " x " << in.numel << ", root " << root;
      break;
    case CollectiveKind::kBarrier:
      break;
  }
  os << ")";
  return os.str();
}

// acc[i] = op(acc[i], x[i]); the op is chosen once per call, not per
// element, so each loop is a plain elementwise pass.
template <typename T>
void fold(T* __restrict acc, const T* __restrict x, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], x[i]);
      return;
  }
}

// Reduces `count` elements at element offset `offset` of every rank's
// input, in rank order (Note [Reduction order]), into `out`, which must not
// overlap any input.
template <typename T>
void reduce_rank_order(const std::vector<const T*>& inputs, size_t offset,
                       size_t count, ReduceOp op, T* out) {
  const size_t world = inputs.size();
  std::memcpy(out, inputs[0] + offset, count * sizeof(T));
  for (size_t r = 1; r < world; ++r) fold(out, inputs[r] + offset, count, op);
  if (op == ReduceOp::kAvg) {
    const T w = static_cast<T>(world);
    for (size_t i = 0; i < count; ++i) out[i] = out[i] / w;
  }
}

}  // namespace

// Rank r's raw endpoint: forwards each call to the world's rendezvous.
class SimWorld::RankComm final : public Communicator {
 public:
  RankComm(SimWorld* world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_->world_size(); }
  std::string backend_name() const override { return "sim"; }

  void all_reduce(Buffer buf, const AllReduceOptions& opts) override {
    Arrival a;
    a.kind = CollectiveKind::kAllReduce;
    a.op = opts.op;
    a.input = buf;
    a.output = buf;
    a.phase = opts.phase;
    world_->collective(rank_, a);
  }
  void reduce_scatter(Buffer input, Buffer output,
                      const ReduceScatterOptions& opts) override {
    check_reduce_scatter_args(rank_, world_size(), input, output);
    Arrival a;
    a.kind = CollectiveKind::kReduceScatter;
    a.op = opts.op;
    a.input = input;
    a.output = output;
    a.phase = opts.phase;
    world_->collective(rank_, a);
  }
  // Completes inside the call (Note [Reduction order] needs every rank's
  // input at once anyway); overlap is a matter for the virtual clock.
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) override {
    reduce_scatter(input, output, opts);
    return std::make_shared<CompletedWork>();
  }
  void all_gather(Buffer input, Buffer output,
                  const AllGatherOptions& opts) override {
    check_all_gather_args(rank_, world_size(), input, output);
    Arrival a;
    a.kind = CollectiveKind::kAllGather;
    a.input = input;
    a.output = output;
    a.phase = opts.phase;
    world_->collective(rank_, a);
  }
  void broadcast(Buffer buf, const BroadcastOptions& opts) override {
    check_broadcast_root(opts.root, world_size());
    Arrival a;
    a.kind = CollectiveKind::kBroadcast;
    a.input = buf;
    a.output = buf;
    a.root = opts.root;
    a.phase = opts.phase;
    world_->collective(rank_, a);
  }
  void barrier() override {
    Arrival a;
    a.kind = CollectiveKind::kBarrier;
    world_->collective(rank_, a);
  }

 private:
  SimWorld* world_;
  int rank_;
};

SimWorld::SimWorld(const SimOptions& options) : options_(options) {
  if (options.world_size < 1) {
    throw UsageError("SimWorld world_size = " +
                     std::to_string(options.world_size) +
                     ": must be at least 1");
  }
  const int w = options.world_size;
  ledgers_.resize(w);
  for (int r = 0; r < w; ++r) {
    raw_comms_.push_back(std::make_unique<RankComm>(this, r));
    comms_.push_back(std::make_unique<RecordingCommunicator>(
        raw_comms_.back().get(), &ledgers_[r]));
  }
  next_seq_.assign(w, 0);
  exited_.assign(w, false);
  exit_reason_.assign(w, "");
}

SimWorld::~SimWorld() = default;

Communicator& SimWorld::comm(int rank) {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size());
  return *comms_[rank];
}

const Ledger& SimWorld::ledger(int rank) const {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size());
  return ledgers_[rank];
}

Ledger& SimWorld::mutable_ledger(int rank) {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size());
  return ledgers_[rank];
}

void SimWorld::collective(int rank, Arrival arrival) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t seq = next_seq_[rank]++;
  auto& slot_ptr = slots_[seq];
  if (!slot_ptr) {
    slot_ptr = std::make_unique<Slot>();
    slot_ptr->seq = seq;
    slot_ptr->arrivals.resize(world_size());
    slot_ptr->arrived.assign(world_size(), false);
  }
  Slot& slot = *slot_ptr;
  slot.arrivals[rank] = arrival;
  slot.arrived[rank] = true;
  ++slot.num_arrived;
  if (!slot.done && slot.num_arrived == world_size()) {
    execute(slot);
    slot.done = true;
    cv_.notify_all();
  }
  // Wait until the slot completes, or until a rank it still needs can never
  // arrive (it exited).
  cv_.wait(lock, [&] {
    if (slot.done) return true;
    for (int r = 0; r < world_size(); ++r) {
      if (!slot.arrived[r] && exited_[r]) {
        std::ostringstream os;
        os << "collective #" << seq << " ("
           << to_string(slot.arrivals[rank].kind) << ", phase "
           << to_string(slot.arrivals[rank].phase)
           << ") cannot complete: rank " << r << " left the world before "
           << "joining it (" << exit_reason_[r] << ")";
        slot.error = os.str();
        slot.done = true;
        cv_.notify_all();
        return true;
      }
    }
    return false;
  });
  std::string error = slot.error;
  if (++slot.num_left == world_size()) slots_.erase(seq);
  if (!error.empty()) {
    throw CommError("rank " + std::to_string(rank) + ": " + error);
  }
}

void SimWorld::execute(Slot& slot) {
  const int w = world_size();
  const Arrival& a0 = slot.arrivals[0];
  // Every rank must have called the same collective.
  for (int r = 1; r < w; ++r) {
    const Arrival& ar = slot.arrivals[r];
    const bool same = ar.kind == a0.kind && ar.op == a0.op &&
                      ar.input.dtype == a0.input.dtype &&
                      ar.input.numel == a0.input.numel &&
                      ar.output.numel == a0.output.numel &&
                      ar.root == a0.root;
    if (!same) {
      std::ostringstream os;
      os << "mismatched collective #" << slot.seq << ": rank 0 called "
         << describe(a0.kind, a0.op, a0.input, a0.output, a0.root)
         << " in phase " << to_string(a0.phase) << " but rank " << r
         << " called "
         << describe(ar.kind, ar.op, ar.input, ar.output, ar.root)
         << " in phase " << to_string(ar.phase)
         << ". Every rank must issue the same collectives in the same order "
            "(did the ranks run different numbers of backward() calls?)";
      slot.error = os.str();
      return;
    }
  }
  auto run = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> inputs(w);
    for (int r = 0; r < w; ++r)
      inputs[r] = static_cast<const T*>(slot.arrivals[r].input.data);
    switch (a0.kind) {
      case CollectiveKind::kAllReduce: {
        // In place: reduce into reused scratch, then copy to every rank.
        const size_t n = a0.input.numel;
        T* result = scratch<T>(n);
        reduce_rank_order<T>(inputs, 0, n, a0.op, result);
        for (int r = 0; r < w; ++r)
          std::memcpy(slot.arrivals[r].output.data, result, n * sizeof(T));
        break;
      }
      case CollectiveKind::kReduceScatter: {
        const size_t n = a0.output.numel;
        for (int r = 0; r < w; ++r)
          reduce_rank_order<T>(inputs, static_cast<size_t>(r) * n, n, a0.op,
                               static_cast<T*>(slot.arrivals[r].output.data));
        break;
      }
      case CollectiveKind::kAllGather: {
        const size_t n = a0.input.numel;
        // Stage first: an input may be a slice of its rank's output.
        T* staged = scratch<T>(n * w);
        for (int q = 0; q < w; ++q)
          std::memcpy(staged + q * n, inputs[q], n * sizeof(T));
        for (int r = 0; r < w; ++r)
          std::memcpy(slot.arrivals[r].output.data, staged,
                      n * w * sizeof(T));
        break;
      }
      case CollectiveKind::kBroadcast: {
        const size_t n = a0.input.numel;
        for (int r = 0; r < w; ++r)
          if (r != a0.root)
            std::memcpy(slot.arrivals[r].output.data, inputs[a0.root],
                        n * sizeof(T));
        break;
      }
      case CollectiveKind::kBarrier:
        break;
    }
  };
  switch (a0.input.dtype) {
    case DType::kFloat32:
      run(float{});
      break;
    case DType::kFloat64:
      run(double{});
      break;
    case DType::kInt64:
      run(int64_t{});
      break;
  }
}

void SimWorld::mark_exited(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  exited_[rank] = true;
  exit_reason_[rank] = reason;
  cv_.notify_all();
}

std::vector<std::exception_ptr> SimWorld::run_collect(
    const std::function<void(int rank)>& fn) {
  const int w = world_size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(exited_.begin(), exited_.end(), false);
    first_failed_rank_ = -1;
    // A previous run that failed may have left collectives half joined and
    // ranks at different sequence numbers; start clean.
    slots_.clear();
    std::fill(next_seq_.begin(), next_seq_.end(), 0);
  }
  std::vector<std::exception_ptr> errors(w);
  std::vector<std::thread> threads;
  threads.reserve(w);
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
        mark_exited(r, "it returned");
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (first_failed_rank_ < 0) first_failed_rank_ = r;
        }
        mark_exited(r, std::string("it failed: ") + e.what());
      } catch (...) {
        errors[r] = std::current_exception();
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (first_failed_rank_ < 0) first_failed_rank_ = r;
        }
        mark_exited(r, "it failed with a non-standard exception");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

void SimWorld::run(const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors = run_collect(fn);
  int first = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = first_failed_rank_;
  }
  if (first >= 0) std::rethrow_exception(errors[first]);
}

}  // namespace zerostep
