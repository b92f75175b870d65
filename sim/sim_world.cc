#include "sim/sim_world.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "sim/reduction.h"

namespace zerostep {

// One rank's call of a collective.
struct SimWorld::Call {
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  Buffer input;
  Buffer output;
  int root = 0;
  const char* label = kBarrierLabel;
  bool async = false;
  bool accumulate = false;  // ReduceScatterOptions::accumulate
};

// How a failed slot charges virtual time to the ranks that leave it.
enum SlotFailure : int {
  kNoFailure = 0,
  kMet,          // every rank arrived and saw the error: at the meeting time
  kPeerMissing,  // a peer never came: each rank waited timeout_s
  kTimedOut      // a straggler came too late: the collective aborted
};

// Where the ranks meet for one collective (Note [Sim collective]).
struct SimWorld::Slot {
  int64_t seq = 0;
  // What each rank called, as the mismatch check sees it (an injected
  // mismatch changes it), and what it really passed (what the reduction
  // moves: a mismatch that every rank shares is no mismatch, and the real
  // buffers are moved).
  std::vector<Call> described;
  std::vector<Call> actual;
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
  // A reduction split into parts (Note [Parallel reduction] in
  // sim/reduction.cc), reduced by the rank threads after the meeting:
  // what it moves, how many parts, the next part not yet taken (taken
  // without the lock), and how many are finished.
  std::vector<Buffer> inputs, outputs;
  size_t parts = 0;
  std::atomic<size_t> next_part{0};
  size_t parts_done = 0;
  // Per rank: "; injected fault ..." for every fault that hit it. An error
  // lists them in rank order, not arrival order, which depends on thread
  // timing.
  std::vector<std::string> injected;
};

// What the faults that hit one rank's collective do to it.
struct SimWorld::Injection {
  int fired = 0;                 // faults that hit, a crash included
  bool lost = false;             // its part is never delivered
  const Fault* crash = nullptr;  // the rank dies on entering
  std::string text;              // "; injected fault ..." for each
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

// The messages name a collective's label as its phase: the engine's labels
// are its training phases (zero/phase.h).
std::string where(int64_t seq, CollectiveKind k, const char* label) {
  return "collective #" + std::to_string(seq) + " (" + to_string(k) +
         ", phase " + label + ")";
}

std::string seconds(double s) {
  std::ostringstream os;
  os << "t=" << s << " s";
  return os.str();
}

// The CPUs this process may run on (its affinity mask, which taskset and
// container limits narrow), at least 1.
int usable_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
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

// Rank r's raw endpoint: forwards each call to the world's collective().
class SimWorld::RankComm final : public Communicator {
 public:
  RankComm(SimWorld* world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_->world_size(); }
  std::string backend_name() const override { return "sim"; }
  bool reduce_scatter_accumulates() const override { return true; }

  void all_reduce(Buffer buf, const AllReduceOptions& opts) override {
    world_->collective(rank_, all_reduce_call(buf, opts));
  }
  void reduce_scatter(Buffer input, Buffer output,
                      const ReduceScatterOptions& opts) override {
    world_->collective(rank_, reduce_scatter_call(input, output, opts));
  }
  // As reduce_scatter_async: the data moves inside the call, the clock
  // models the overlap.
  std::shared_ptr<Work> all_reduce_async(
      Buffer buf, const AllReduceOptions& opts) override {
    Call c = all_reduce_call(buf, opts);
    c.async = true;
    const double end_s = world_->collective(rank_, c);
    return std::make_shared<SimWork>(world_, rank_, end_s);
  }
  // The data moves inside the call (Note [Reduction order] needs every
  // rank's input at once anyway); the virtual clock models the overlap.
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) override {
    Call c = reduce_scatter_call(input, output, opts);
    c.async = true;
    const double end_s = world_->collective(rank_, c);
    return std::make_shared<SimWork>(world_, rank_, end_s);
  }
  void all_gather(Buffer input, Buffer output,
                  const AllGatherOptions& opts) override {
    check_all_gather_args(rank_, world_size(), input, output);
    Call c;
    c.kind = CollectiveKind::kAllGather;
    c.input = input;
    c.output = output;
    c.label = opts.label;
    world_->collective(rank_, c);
  }
  void broadcast(Buffer buf, const BroadcastOptions& opts) override {
    check_broadcast_root(opts.root, world_size());
    Call c;
    c.kind = CollectiveKind::kBroadcast;
    c.input = buf;
    c.output = buf;
    c.root = opts.root;
    c.label = opts.label;
    world_->collective(rank_, c);
  }
  void barrier() override {
    Call c;
    c.kind = CollectiveKind::kBarrier;
    world_->collective(rank_, c);
  }

 private:
  static Call all_reduce_call(Buffer buf, const AllReduceOptions& opts) {
    Call c;
    c.kind = CollectiveKind::kAllReduce;
    c.op = opts.op;
    c.input = buf;
    c.output = buf;
    c.label = opts.label;
    return c;
  }
  Call reduce_scatter_call(Buffer input, Buffer output,
                           const ReduceScatterOptions& opts) {
    check_reduce_scatter_args(rank_, world_size(), input, output);
    Call c;
    c.kind = CollectiveKind::kReduceScatter;
    c.op = opts.op;
    c.input = input;
    c.output = output;
    c.label = opts.label;
    c.accumulate = opts.accumulate;
    return c;
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
  part_scratch_.resize(w);
  spin_ = w <= usable_cpus();
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

// ----- One collective: Note [Sim collective] ---------------------------------

double SimWorld::collective(int rank, Call call) {
  ZS_CHECK(call.label != nullptr);
  check_host_buffer("sim", rank, call.input);
  check_host_buffer("sim", rank, call.output);
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  acquire(lock);
  // Numbering: the rank's k-th call of the run is collective #k.
  const int64_t seq = next_seq_[rank]++;
  CollectiveTiming t = issue(rank, seq, call);
  double ready = ready_time(rank);
  const Call actual = call;
  const Injection faults = inject(rank, seq, &call, &ready);
  for (int i = 0; i < faults.fired; ++i) fired_.push_back({seq, rank});
  if (faults.crash != nullptr) crash(rank, ready, *faults.crash, t);
  Slot& slot = arrive(rank, seq, call, actual, ready, faults.lost, faults.text);
  await(lock, slot, call);
  if (slot.parts > 0) reduce_parts(lock, rank, slot);
  const std::string error = slot.error;
  const double end = leave(rank, slot, ready, &t);
  depart(slot);
  if (!error.empty()) {
    throw CommError("rank " + std::to_string(rank) + ": " + error);
  }
  return end;
}

// ----- Faults: sim/faults.h, Note [Fault model] ------------------------------

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

SimWorld::Injection SimWorld::inject(int rank, int64_t seq, Call* described,
                                     double* ready) const {
  Injection in;
  for (const Fault& f : options_.faults.faults) {
    if (!f.hits(rank, seq)) continue;
    in.text += "; injected fault " + f.to_string();
    ++in.fired;
    switch (f.kind) {
      case FaultKind::kStraggle:
        *ready += f.delay_s;
        break;
      case FaultKind::kLostPeer:
        in.lost = true;
        break;
      case FaultKind::kMismatch:
        mutate(&described->kind, &described->input, &described->output,
               f.field);
        break;
      case FaultKind::kCrash:
        in.crash = &f;
        return in;
    }
  }
  return in;
}

void SimWorld::crash(int rank, double ready, const Fault& fault,
                     CollectiveTiming t) {
  const std::string what =
      "rank " + std::to_string(rank) + " crashed on entering its " +
      where(t.seq, t.kind, t.label) + " at " + seconds(ready) +
      " [injected fault " + fault.to_string() + "]";
  // Its clock stops where it was ready.
  clocks_[rank].now_s = ready;
  t.start_s = t.end_s = ready;
  t.failed = true;
  timeline_[rank].push_back(t);
  // It never joins; its peers find out when they give up waiting
  // (kPeerMissing).
  exited_[rank] = true;
  exit_reason_[rank] = what;
  notify();
  throw CommError(what);
}

bool SimWorld::survives_faults(Slot& slot, double first, int first_rank,
                               double last, int last_rank) {
  const int w = world_size();
  const double timeout = options_.faults.timeout_s;
  for (int r = 0; r < w; ++r) {
    if (!slot.lost[r]) continue;
    fail_slot(slot, kPeerMissing,
              where(slot.seq, slot.described[r].kind, slot.described[r].label) +
                  " never completed: rank " + std::to_string(r) +
                  "'s part of it was lost (an unreachable peer); every rank "
                  "gave up after the timeout of " +
                  seconds(timeout).substr(2) + " of virtual time");
    return false;
  }
  if (last - first > timeout) {
    std::ostringstream os;
    os << where(slot.seq, slot.described[last_rank].kind,
                slot.described[last_rank].label)
       << " timed out at " << seconds(first + timeout) << ": rank "
       << last_rank << " arrived at " << seconds(last) << ", "
       << (last - first) << " virtual seconds after rank " << first_rank
       << " (a straggler), beyond the timeout of " << timeout << " s";
    slot.abort_s = first + timeout;
    fail_slot(slot, kTimedOut, os.str());
    return false;
  }
  return true;
}

// ----- Waking: Note [Spin before sleeping] -----------------------------------

// Note [Spin before sleeping]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A rank that waits for its peers (to meet, or for the last part of a
// reduction) would sleep on cv_, and being woken costs it tens of
// microseconds of the OS's time: two wake-ups are a large part of a 1 MiB
// collective (about 0.1 ms). So a waiting rank first spins, outside the
// lock, until notify() counts a change (any change: it then checks under
// the lock, and sleeps if its own wait is not over) or kSpinNs has passed,
// and sleeps on cv_ only then. How it spins depends on the cores:
//   - every rank can have a core of its own (world size at most the CPUs
//     this process may run on): it spins on the CPU (`pause`);
//   - more ranks than cores: spinning on the CPU would take the core a
//     peer needs to arrive, so it yields the core instead (sched_yield) on
//     every turn. A peer that can run gets the core at once, and nobody
//     pays for a sleep and a wake-up while the others are still runnable.
// With more ranks than cores, taking the lock (after the spin, on entering
// a collective, after its parts) also first tries it kLockTries times,
// yielding between tries: notify() is called under the lock, so the ranks
// it releases find it held, and blocking on it costs another sleep and
// wake-up. Only when a rank wakes changes; what it then sees, under the
// lock, and so every bit of every result, does not.
// Measured in docs/benchmarks.md as of fee84cc (sim_comm_bench, 1 MiB at
// world 4 on 2 cores).
constexpr int64_t kSpinNs = 50'000;
constexpr int kLockTries = 64;

void SimWorld::acquire(std::unique_lock<std::mutex>& lock) {
  for (int i = 0; !spin_ && i < kLockTries; ++i) {
    if (lock.try_lock()) return;
    sched_yield();
  }
  lock.lock();
}

void SimWorld::notify() {
  notifications_.fetch_add(1, std::memory_order_release);
  cv_.notify_all();
}

template <typename Ready>
void SimWorld::wait(std::unique_lock<std::mutex>& lock, Ready ready) {
  if (ready()) return;
  const uint64_t seen = notifications_.load(std::memory_order_acquire);
  lock.unlock();
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::nanoseconds(kSpinNs);
  while (notifications_.load(std::memory_order_acquire) == seen &&
         std::chrono::steady_clock::now() < until) {
    if (!spin_) {
      sched_yield();
      continue;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  acquire(lock);
  cv_.wait(lock, ready);
}

// ----- Rendezvous ------------------------------------------------------------

SimWorld::Slot& SimWorld::arrive(int rank, int64_t seq, const Call& described,
                                 const Call& actual, double ready, bool lost,
                                 const std::string& injected) {
  auto& slot_ptr = slots_[seq];
  if (!slot_ptr) {
    slot_ptr = std::make_unique<Slot>();
    slot_ptr->seq = seq;
    slot_ptr->described.resize(world_size());
    slot_ptr->actual.resize(world_size());
    slot_ptr->arrived.assign(world_size(), false);
    slot_ptr->lost.assign(world_size(), false);
    slot_ptr->ready.assign(world_size(), 0.0);
    slot_ptr->injected.assign(world_size(), "");
  }
  Slot& slot = *slot_ptr;
  slot.described[rank] = described;
  slot.actual[rank] = actual;
  slot.arrived[rank] = true;
  slot.lost[rank] = lost;
  slot.ready[rank] = ready;
  slot.injected[rank] = injected;
  ++slot.num_arrived;
  if (!slot.done && slot.num_arrived == world_size()) {
    meet(slot);
    slot.done = true;
    notify();
  }
  return slot;
}

void SimWorld::meet(Slot& slot) {
  const int w = world_size();
  double first = slot.ready[0], last = slot.ready[0];
  int first_rank = 0, last_rank = 0;
  for (int r = 1; r < w; ++r) {
    if (slot.ready[r] < first) first = slot.ready[r], first_rank = r;
    if (slot.ready[r] > last) last = slot.ready[r], last_rank = r;
  }
  slot.start_s = last;
  if (!survives_faults(slot, first, first_rank, last, last_rank)) return;
  // Every rank must have called the same collective: first as described
  // (with injected mismatches), then as really passed, which is what moves.
  for (const std::vector<Call>* calls : {&slot.described, &slot.actual}) {
    if (!check_same(slot, *calls, last)) return;
  }
  const Call& a0 = slot.actual[0];
  slot.cost_s = options_.cost.collective_seconds(
      a0.kind, payload_bytes(a0.kind, a0.input, a0.output), w);
  slot.end_s = last + slot.cost_s;
  std::vector<Buffer> inputs(w), outputs(w);
  for (int r = 0; r < w; ++r) {
    inputs[r] = slot.actual[r].input;
    outputs[r] = slot.actual[r].output;
  }
  const size_t parts = reduction_parts(a0.kind, inputs, outputs);
  if (parts == 1) {
    move_collective_data(a0.kind, a0.op, a0.root, inputs, outputs, &scratch_,
                         a0.accumulate);
    return;
  }
  // Every rank reduces parts once it wakes (reduce_parts).
  slot.inputs = std::move(inputs);
  slot.outputs = std::move(outputs);
  slot.parts = parts;
}

void SimWorld::reduce_parts(std::unique_lock<std::mutex>& lock, int rank,
                            Slot& slot) {
  // Outside the lock: the slot's buffers belong to this collective until
  // every part is done, and no rank leaves before that. Whichever rank
  // thread runs takes the next part, so the ranks that the OS has not yet
  // woken do not hold the others up.
  lock.unlock();
  const Call& a0 = slot.actual[0];
  size_t done = 0;
  for (size_t p = slot.next_part++; p < slot.parts; p = slot.next_part++) {
    reduce_part_in_rank_order(a0.kind, a0.op, slot.inputs, slot.outputs, p,
                              &part_scratch_[rank], a0.accumulate);
    ++done;
  }
  acquire(lock);
  slot.parts_done += done;
  if (slot.parts_done == slot.parts) notify();
  wait(lock, [&] { return slot.parts_done == slot.parts; });
}

void SimWorld::fail_slot(Slot& slot, int failure, const std::string& error) {
  slot.failure = failure;
  slot.error = error;
  for (const std::string& text : slot.injected) slot.error += text;
  slot.done = true;
}

// Whether every rank called the same collective; if not, fails the slot
// (kMet) with the calls grouped by what they were, the smallest group (the
// odd one out) first. The labels are named, not compared.
bool SimWorld::check_same(Slot& slot, const std::vector<Call>& calls,
                          double last) {
  const int w = world_size();
  const Call& a0 = calls[0];
  bool same = true;
  for (int r = 1; r < w; ++r) {
    const Call& c = calls[r];
    same = same && c.kind == a0.kind && c.op == a0.op &&
           c.accumulate == a0.accumulate && c.input.dtype == a0.input.dtype &&
           c.input.numel == a0.input.numel &&
           c.output.numel == a0.output.numel && c.root == a0.root;
  }
  if (!same) {
    // Only now the descriptions: a match, every collective but a failing
    // one, builds no strings under the lock.
    std::vector<std::string> text(w);
    for (int r = 0; r < w; ++r) {
      const Call& c = calls[r];
      text[r] = zerostep::describe(c.kind, c.op, c.input, c.output, c.root) +
                (c.accumulate ? " accumulating" : "") + " in phase " + c.label;
    }
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r = 0; r < w; ++r) {
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == text[r]; });
      if (it == groups.end()) groups.push_back({text[r], {r}});
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

void SimWorld::await(std::unique_lock<std::mutex>& lock, Slot& slot,
                     const Call& described) {
  const double timeout = options_.faults.timeout_s;
  wait(lock, [&] {
    if (slot.done) return true;
    for (int r = 0; r < world_size(); ++r) {
      if (!slot.arrived[r] && exited_[r]) {
        fail_slot(slot, kPeerMissing,
                  where(slot.seq, described.kind, described.label) +
                      " cannot complete: rank " + std::to_string(r) +
                      " left the world before joining it (" +
                      exit_reason_[r] + "); the ranks waiting for it gave " +
                      "up after the timeout of " + seconds(timeout).substr(2) +
                      " of virtual time");
        notify();
        return true;
      }
    }
    return false;
  });
}

void SimWorld::depart(Slot& slot) {
  if (++slot.num_left == world_size()) slots_.erase(slot.seq);
}

// ----- Clock: Note [Virtual clock] -------------------------------------------

CollectiveTiming SimWorld::issue(int rank, int64_t seq,
                                 const Call& call) const {
  CollectiveTiming t;
  t.seq = seq;
  t.kind = call.kind;
  t.label = call.label;
  t.bytes = payload_bytes(call.kind, call.input, call.output);
  t.async = call.async;
  t.issue_s = clocks_[rank].now_s;
  return t;
}

double SimWorld::ready_time(int rank) const {
  return std::max(clocks_[rank].now_s, comm_free_[rank]);
}

double SimWorld::leave(int rank, const Slot& slot, double ready,
                       CollectiveTiming* t) {
  const double timeout = options_.faults.timeout_s;
  SimClock& clock = clocks_[rank];
  double end = slot.end_s;
  if (!slot.error.empty()) {
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
    t->start_s = t->end_s = end;
    t->failed = true;
  } else {
    t->start_s = slot.start_s;
    t->end_s = slot.end_s;
    clock.comm_s += slot.cost_s;
  }
  if (!t->async || !slot.error.empty()) {
    clock.exposed_comm_s += end - clock.now_s;
    clock.now_s = end;
  }
  comm_free_[rank] = end;
  timeline_[rank].push_back(*t);
  return end;
}

void SimWorld::wait_until(int rank, double end_s) {
  std::lock_guard<std::mutex> lock(mu_);
  SimClock& c = clocks_[rank];
  if (end_s > c.now_s) {
    c.exposed_comm_s += end_s - c.now_s;
    c.now_s = end_s;
  }
}

// ----- Ranks -----------------------------------------------------------------

void SimWorld::mark_exited(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  // A crashed rank already said why it left.
  if (!exited_[rank]) exit_reason_[rank] = reason;
  exited_[rank] = true;
  notify();
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
  auto fail = [&](int r) {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_failed_rank_ < 0) first_failed_rank_ = r;
  };
  return run_thread_per_rank(
      w,
      [&](int r) {
        try {
          fn(r);
          mark_exited(r, "it returned");
        } catch (const std::exception& e) {
          fail(r);
          mark_exited(r, std::string("it failed: ") + e.what());
          throw;
        } catch (...) {
          fail(r);
          mark_exited(r, "it failed with a non-standard exception");
          throw;
        }
      },
      // The ranks not started leave the world, as a crashed rank does.
      [&](int first) {
        fail(first);
        for (int q = first; q < w; ++q)
          mark_exited(q, "its thread could not be started");
      });
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
