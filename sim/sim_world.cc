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
  const char* label = kBarrierLabel;
  bool async = false;
};

// How a failed slot charges virtual time to the ranks that leave it.
enum SlotFailure : int {
  kNoFailure = 0,
  kMet,          // every rank arrived and saw the error: at the meeting time
  kPeerMissing,  // a peer never came: each rank waited timeout_s
  kTimedOut      // a straggler came too late: the collective aborted
};

struct SimWorld::Slot {
  int64_t seq = 0;
  // What each rank called, as the mismatch check sees it (an injected
  // mismatch changes it), and what it really passed (what execute() moves:
  // a mismatch that every rank shares is no mismatch, and the real buffers
  // are moved).
  std::vector<Arrival> arrivals;
  std::vector<Arrival> actual;
  std::vector<bool> arrived;
  std::vector<bool> lost;      // injected lost peer: arrived, never delivered
  std::vector<double> ready;   // virtual time the rank was ready
  int num_arrived = 0;
  int num_left = 0;
  bool done = false;
  std::string error;  // non-empty: every participant throws CommError(error)
  int failure = kNoFailure;
  double start_s = 0.0;  // ready on every rank (success, kMet)
  double end_s = 0.0;
  double cost_s = 0.0;   // the cost model's charge (success)
  double abort_s = 0.0;  // kTimedOut: when the first rank gave up
  std::string injected;  // "; injected fault ..." for every fault that hit
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

// The ledger's payload of a call (comm/ledger.h).
uint64_t payload_bytes(CollectiveKind k, Buffer in, Buffer out) {
  switch (k) {
    case CollectiveKind::kAllGather:
      return out.bytes();
    case CollectiveKind::kBarrier:
      return 0;
    default:
      return in.bytes();
  }
}

std::string where(int64_t seq, CollectiveKind k, const char* label) {
  return "collective #" + std::to_string(seq) + " (" + to_string(k) +
         ", phase " + label + ")";
}

std::string seconds(double s) {
  std::ostringstream os;
  os << "t=" << s << " s";
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

// An async collective's handle: the data is already in place (the sim
// completes every collective inside the issuing call); wait() charges the
// virtual time still outstanding (Note [Virtual clock]).
class SimWorld::SimWork final : public Work {
 public:
  SimWork(SimWorld* world, int rank, double end_s)
      : world_(world), rank_(rank), end_s_(end_s) {}
  void wait() override {
    if (waited_) return;
    waited_ = true;
    world_->wait_until(rank_, end_s_);
  }

 private:
  SimWorld* world_;
  int rank_;
  double end_s_;
  bool waited_ = false;
};

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
    a.label = opts.label;
    world_->collective(rank_, a);
  }
  void reduce_scatter(Buffer input, Buffer output,
                      const ReduceScatterOptions& opts) override {
    world_->collective(rank_, reduce_scatter_arrival(input, output, opts));
  }
  // The data moves inside the call (Note [Reduction order] needs every
  // rank's input at once anyway); the virtual clock models the overlap.
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) override {
    Arrival a = reduce_scatter_arrival(input, output, opts);
    a.async = true;
    const double end_s = world_->collective(rank_, a);
    return std::make_shared<SimWork>(world_, rank_, end_s);
  }
  void all_gather(Buffer input, Buffer output,
                  const AllGatherOptions& opts) override {
    check_all_gather_args(rank_, world_size(), input, output);
    Arrival a;
    a.kind = CollectiveKind::kAllGather;
    a.input = input;
    a.output = output;
    a.label = opts.label;
    world_->collective(rank_, a);
  }
  void broadcast(Buffer buf, const BroadcastOptions& opts) override {
    check_broadcast_root(opts.root, world_size());
    Arrival a;
    a.kind = CollectiveKind::kBroadcast;
    a.input = buf;
    a.output = buf;
    a.root = opts.root;
    a.label = opts.label;
    world_->collective(rank_, a);
  }
  void barrier() override {
    Arrival a;
    a.kind = CollectiveKind::kBarrier;
    world_->collective(rank_, a);
  }

 private:
  Arrival reduce_scatter_arrival(Buffer input, Buffer output,
                                 const ReduceScatterOptions& opts) {
    check_reduce_scatter_args(rank_, world_size(), input, output);
    Arrival a;
    a.kind = CollectiveKind::kReduceScatter;
    a.op = opts.op;
    a.input = input;
    a.output = output;
    a.label = opts.label;
    return a;
  }

  SimWorld* world_;
  int rank_;
};

SimWorld::SimWorld(const SimOptions& options) : options_(options) {
  if (options.world_size < 1) {
    throw UsageError("SimWorld world_size = " +
                     std::to_string(options.world_size) +
                     ": must be at least 1");
  }
  validate(options.faults, options.world_size);
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
  comm_free_.assign(w, 0.0);
  clocks_.assign(w, SimClock{});
  timeline_.assign(w, {});
}

SimWorld::~SimWorld() = default;

std::string SimWorld::describe() const {
  std::ostringstream os;
  os << "seed=" << options_.seed << " world=" << options_.world_size
     << " faults=" << options_.faults.to_string()
     << " cost: " << options_.cost.to_string();
  return os.str();
}

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

void SimWorld::compute(int rank, double seconds) {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size());
  ZS_CHECK(seconds >= 0.0);
  std::lock_guard<std::mutex> lock(mu_);
  clocks_[rank].now_s += seconds;
}

SimClock SimWorld::clock(int rank) const {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size());
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(mu_));
  return clocks_[rank];
}

const std::vector<CollectiveTiming>& SimWorld::timeline(int rank) const {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size());
  return timeline_[rank];
}

void SimWorld::reset_clocks() {
  std::lock_guard<std::mutex> lock(mu_);
  std::fill(comm_free_.begin(), comm_free_.end(), 0.0);
  std::fill(clocks_.begin(), clocks_.end(), SimClock{});
  for (auto& t : timeline_) t.clear();
}

void SimWorld::wait_until(int rank, double end_s) {
  std::lock_guard<std::mutex> lock(mu_);
  SimClock& c = clocks_[rank];
  if (end_s > c.now_s) {
    c.exposed_comm_s += end_s - c.now_s;
    c.now_s = end_s;
  }
}

namespace {

// What an injected mismatch makes rank R call instead.
void mutate(CollectiveKind* kind, Buffer* in, Buffer* out, MismatchField f) {
  switch (f) {
    case MismatchField::kOp:
      *kind = *kind == CollectiveKind::kAllReduce ? CollectiveKind::kBroadcast
                                                  : CollectiveKind::kAllReduce;
      break;
    case MismatchField::kDtype: {
      const DType d = in->dtype == DType::kFloat32 ? DType::kFloat64
                                                   : DType::kFloat32;
      in->dtype = d;
      out->dtype = d;
      break;
    }
    case MismatchField::kCount:
      in->numel += 1;
      out->numel += 1;
      break;
  }
}

}  // namespace

double SimWorld::collective(int rank, Arrival arrival) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t seq = next_seq_[rank]++;
  const double timeout = options_.faults.timeout_s;
  SimClock& clock = clocks_[rank];
  CollectiveTiming t;
  t.seq = seq;
  t.kind = arrival.kind;
  t.label = arrival.label;
  t.bytes = payload_bytes(arrival.kind, arrival.input, arrival.output);
  t.async = arrival.async;
  t.issue_s = clock.now_s;
  double ready = std::max(clock.now_s, comm_free_[rank]);
  bool lost = false;
  std::string injected;
  const Arrival actual = arrival;
  for (const Fault& f : options_.faults.faults) {
    if (!f.hits(rank, seq)) continue;
    injected += "; injected fault " + f.to_string();
    fired_.push_back({seq, rank});
    switch (f.kind) {
      case FaultKind::kStraggle:
        ready += f.delay_s;
        break;
      case FaultKind::kLostPeer:
        lost = true;
        break;
      case FaultKind::kMismatch:
        mutate(&arrival.kind, &arrival.input, &arrival.output, f.field);
        break;
      case FaultKind::kCrash: {
        // The rank dies here: it never joins, and its peers find out when
        // they give up waiting (kPeerMissing).
        const std::string what =
            "rank " + std::to_string(rank) + " crashed on entering its " +
            where(seq, t.kind, t.label) + " at " + seconds(ready) +
            " [injected fault " + f.to_string() + "]";
        clock.now_s = ready;
        t.start_s = t.end_s = ready;
        t.failed = true;
        timeline_[rank].push_back(t);
        exited_[rank] = true;
        exit_reason_[rank] = what;
        cv_.notify_all();
        throw CommError(what);
      }
    }
  }
  auto& slot_ptr = slots_[seq];
  if (!slot_ptr) {
    slot_ptr = std::make_unique<Slot>();
    slot_ptr->seq = seq;
    slot_ptr->arrivals.resize(world_size());
    slot_ptr->actual.resize(world_size());
    slot_ptr->arrived.assign(world_size(), false);
    slot_ptr->lost.assign(world_size(), false);
    slot_ptr->ready.assign(world_size(), 0.0);
  }
  Slot& slot = *slot_ptr;
  slot.arrivals[rank] = arrival;
  slot.actual[rank] = actual;
  slot.arrived[rank] = true;
  slot.lost[rank] = lost;
  slot.ready[rank] = ready;
  slot.injected += injected;
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
        fail_slot(slot, kPeerMissing,
                  where(seq, arrival.kind, arrival.label) +
                      " cannot complete: rank " + std::to_string(r) +
                      " left the world before joining it (" +
                      exit_reason_[r] + "); the ranks waiting for it gave " +
                      "up after the timeout of " + seconds(timeout).substr(2) +
                      " of virtual time");
        cv_.notify_all();
        return true;
      }
    }
    return false;
  });
  const std::string error = slot.error;
  double end = slot.end_s;
  if (!error.empty()) {
    switch (slot.failure) {
      case kMet:
        end = std::max(ready, slot.start_s);
        break;
      case kPeerMissing:
        end = ready + timeout;
        break;
      default:
        end = std::max(ready, slot.abort_s);
        break;
    }
    t.start_s = t.end_s = end;
    t.failed = true;
  } else {
    t.start_s = slot.start_s;
    t.end_s = slot.end_s;
    clock.comm_s += slot.cost_s;
  }
  if (!arrival.async || !error.empty()) {
    clock.exposed_comm_s += end - clock.now_s;
    clock.now_s = end;
  }
  comm_free_[rank] = end;
  timeline_[rank].push_back(t);
  if (++slot.num_left == world_size()) slots_.erase(seq);
  if (!error.empty()) {
    throw CommError("rank " + std::to_string(rank) + ": " + error);
  }
  return end;
}

void SimWorld::fail_slot(Slot& slot, int failure, const std::string& error) {
  slot.failure = failure;
  slot.error = error + slot.injected;
  slot.done = true;
}

// Whether every rank called the same collective; if not, fails the slot
// (kMet) with the calls grouped by what they were, the smallest group (the
// odd one out) first.
bool SimWorld::check_same(Slot& slot, const std::vector<Arrival>& arrivals,
                          double last) {
  const int w = world_size();
  const Arrival& a0 = arrivals[0];
  std::vector<std::string> calls(w);
  for (int r = 0; r < w; ++r) {
    const Arrival& ar = arrivals[r];
    calls[r] = zerostep::describe(ar.kind, ar.op, ar.input, ar.output, ar.root) +
               " in phase " + ar.label;
  }
  bool same = true;
  for (int r = 1; r < w; ++r) {
    const Arrival& ar = arrivals[r];
    same = same && ar.kind == a0.kind && ar.op == a0.op &&
           ar.input.dtype == a0.input.dtype &&
           ar.input.numel == a0.input.numel &&
           ar.output.numel == a0.output.numel && ar.root == a0.root;
  }
  if (!same) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r = 0; r < w; ++r) {
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == calls[r]; });
      if (it == groups.end()) groups.push_back({calls[r], {r}});
      else it->second.push_back(r);
    }
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) {
                       return a.second.size() < b.second.size();
                     });
    std::ostringstream os;
    os << "mismatched collective #" << slot.seq << " at " << seconds(last)
       << ": ";
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<int>& ranks = groups[g].second;
      os << (g == 0 ? "" : g + 1 == groups.size() ? ", but " : ", ")
         << (ranks.size() == 1 ? "rank " : "ranks ");
      for (size_t i = 0; i < ranks.size(); ++i)
        os << (i ? ", " : "") << ranks[i];
      os << " called " << groups[g].first;
    }
    os << ". Every rank must issue the same collectives in the same order "
          "(did the ranks run different numbers of backward() calls?)";
    fail_slot(slot, kMet, os.str());
    return false;
  }
  return true;
}

void SimWorld::execute(Slot& slot) {
  const int w = world_size();
  const double timeout = options_.faults.timeout_s;
  const Arrival& a0 = slot.arrivals[0];
  double first = slot.ready[0], last = slot.ready[0];
  int first_rank = 0, last_rank = 0;
  for (int r = 1; r < w; ++r) {
    if (slot.ready[r] < first) first = slot.ready[r], first_rank = r;
    if (slot.ready[r] > last) last = slot.ready[r], last_rank = r;
  }
  slot.start_s = last;
  for (int r = 0; r < w; ++r) {
    if (!slot.lost[r]) continue;
    fail_slot(slot, kPeerMissing,
              where(slot.seq, slot.arrivals[r].kind, slot.arrivals[r].label) +
                  " never completed: rank " + std::to_string(r) +
                  "'s part of it was lost (an unreachable peer); every rank "
                  "gave up after the timeout of " +
                  seconds(timeout).substr(2) + " of virtual time");
    return;
  }
  if (last - first > timeout) {
    std::ostringstream os;
    os << where(slot.seq, slot.arrivals[last_rank].kind,
                slot.arrivals[last_rank].label)
       << " timed out at " << seconds(first + timeout) << ": rank "
       << last_rank << " arrived at " << seconds(last) << ", "
       << (last - first) << " virtual seconds after rank " << first_rank
       << " (a straggler), beyond the timeout of " << timeout << " s";
    slot.abort_s = first + timeout;
    fail_slot(slot, kTimedOut, os.str());
    return;
  }
  // Every rank must have called the same collective: first as described
  // (with injected mismatches), then as really passed, which is what moves.
  for (std::vector<Arrival>* calls_of : {&slot.arrivals, &slot.actual}) {
    if (!check_same(slot, *calls_of, last)) return;
  }
  for (int r = 0; r < w; ++r) slot.arrivals[r] = slot.actual[r];
  slot.cost_s = options_.cost.collective_seconds(
      a0.kind, payload_bytes(a0.kind, a0.input, a0.output), w);
  slot.end_s = last + slot.cost_s;
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
  // A crashed rank already said why it left.
  if (!exited_[rank]) exit_reason_[rank] = reason;
  exited_[rank] = true;
  cv_.notify_all();
}

std::vector<std::exception_ptr> SimWorld::run_collect(
    const std::function<void(int rank)>& fn) {
  const int w = world_size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::fill(exited_.begin(), exited_.end(), false);
    first_failed_rank_ = -1;
    fired_.clear();
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
    // With injected faults the root cause is the rank of the earliest
    // fault that fired (and failed it): deterministic, unlike which thread
    // failed first.
    std::vector<std::pair<int64_t, int>> fired = fired_;
    std::sort(fired.begin(), fired.end());
    for (const auto& f : fired) {
      if (errors[f.second]) {
        first = f.second;
        break;
      }
    }
  }
  if (first >= 0) std::rethrow_exception(errors[first]);
}

}  // namespace zerostep
