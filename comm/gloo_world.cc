#include "comm/gloo_world.h"

#include <torch/torch.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/bounded_call.h"
#include "comm/net_interface.h"
#include "comm/rank_order.h"
#include "comm/rendezvous.h"
#include "comm/torchrun_env.h"
#include "common/cli.h"
#include "common/errors.h"
#include "common/log.h"

namespace zerostep {

namespace {

// Receive buffers of the point-to-point reduce-scatter (Note [Gloo
// reduce-scatter and all-gather]), kept for reuse so that a training loop's
// collectives stop allocating (and page-faulting) after the first window.
// Shared with the Works that hold a buffer, which may outlive the
// communicator.
class ScratchPool {
 public:
  // A buffer of at least `bytes`, the smallest free one that fits, else a
  // new one.
  at::Tensor take(size_t bytes) {
    std::lock_guard<std::mutex> hold(m_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].nbytes() >= bytes &&
          (best == free_.size() || free_[i].nbytes() < free_[best].nbytes()))
        best = i;
    if (best == free_.size())
      return at::empty({static_cast<int64_t>(bytes)}, at::kByte);
    at::Tensor t = std::move(free_[best]);
    free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
    return t;
  }
  void give_back(at::Tensor t) {
    std::lock_guard<std::mutex> hold(m_);
    free_.push_back(std::move(t));
  }

 private:
  std::mutex m_;
  std::vector<at::Tensor> free_;
};

}  // namespace

struct GlooCommunicator::Impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::chrono::milliseconds timeout{0};
  // The tag of the next point-to-point collective. Every rank issues the
  // same collectives in the same order, so the ranks' counters agree and a
  // tag names one collective on every rank.
  uint32_t next_tag = 0;
  std::shared_ptr<ScratchPool> scratch = std::make_shared<ScratchPool>();
  // from_environment's ranks: the peers to probe when a collective fails
  // (null in a GlooLocalWorld, whose ranks share a process).
  std::shared_ptr<const Rendezvous> rendezvous;
};

namespace {

at::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kInt64:
      return at::kLong;
  }
  return at::kFloat;
}

at::Tensor wrap(Buffer b) {
  // c10d's Gloo takes CUDA tensors for some collectives only, and stages
  // them through the host itself: the engine's StagingCommunicator does
  // that for every collective, so this backend stays host-only.
  if (b.device)
    throw UsageError(
        "gloo was given a device buffer; it reads host memory only. Fix: "
        "wrap it in a StagingCommunicator (zero/staging_comm.h; the Engine "
        "does this for a model on a device), or use the nccl backend");
  return torch::from_blob(b.data, {static_cast<int64_t>(b.numel)},
                          torch::TensorOptions().dtype(scalar_type(b.dtype)));
}

c10d::ReduceOp c10d_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// The end of a failed collective's message: which peers did not answer a
// probe (Note [Naming the rank that did not answer]); "" without peers to
// probe.
std::string diagnose(const std::shared_ptr<const Rendezvous>& rendezvous) {
  return rendezvous ? rendezvous->diagnosis() : "";
}

// Runs a c10d call; any failure (timeout, peer gone) becomes CommError,
// naming the peers that do not answer.
template <typename F>
void guarded(const char* what, int rank,
             const std::shared_ptr<const Rendezvous>& rendezvous, F&& f) {
  try {
    f();
  } catch (const CommError& e) {
    throw CommError(e.what() + diagnose(rendezvous));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(std::string("gloo ") + what + " on rank " +
                    std::to_string(rank) +
                    " failed: " + message_without_backtrace(e) +
                    diagnose(rendezvous));
  }
}

// Note [Issuing under one lock]
// LibTorch 2.11's ProcessGroupGloo records every collective it enqueues in
// c10d's process-wide FlightRecorder, whose recordWithResetEnabled inserts a
// process group's status into a std::map before it takes its own mutex
// (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp). Two process groups
// of one process that issue collectives from two threads at once, as the
// ranks of a GlooLocalWorld do, corrupt that map: under --config=cuda
// parity:scenario_test's gloo cases crashed there in 22 of 100 runs. So every
// GlooCommunicator enqueues under one process-wide lock and waits outside it;
// Gloo's enqueue only queues the work, so the ranks still meet in the
// collective. LibTorch 1.13 has no flight recorder; the lock costs it nothing
// that matters.
template <typename F>
c10::intrusive_ptr<c10d::Work> issue(F&& enqueue) {
  static std::mutex m;
  std::lock_guard<std::mutex> hold(m);
  return enqueue();
}

// One Gloo device per address (several: c10d spreads the pairs over them).
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_pg(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
    std::chrono::milliseconds timeout,
    const std::vector<std::string>& addresses) {
  auto o = c10d::ProcessGroupGloo::Options::create();
  o->timeout = timeout;
  for (const std::string& a : addresses)
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(a));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, o);
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::unique_ptr<Impl> impl, int rank,
                                   int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}

GlooCommunicator::~GlooCommunicator() = default;

std::unique_ptr<GlooCommunicator> GlooCommunicator::from_environment(
    const GlooOptions& options) {
  const TorchrunEnv env = read_torchrun_env();
  const int rank = env.rank, world = env.world_size;
  std::vector<BindAddress> binds;
  if (!options.hostname.empty())
    binds.push_back({options.hostname, "", "GlooOptions::hostname"});
  else
    binds = choose_gloo_addresses(std::getenv("GLOO_SOCKET_IFNAME"),
                                  env.master_addr, world, env.local_world_size,
                                  HostNetwork::of_this_host());
  std::vector<std::string> addresses;
  std::string chosen;
  for (const BindAddress& b : binds) {
    addresses.push_back(b.address);
    chosen += (chosen.empty() ? "" : ", ") + b.address +
              (b.interface.empty() ? "" : " on " + b.interface);
  }
  log_message(LogLevel::kInfo, "gloo: rank " + std::to_string(rank) +
                                   " binds " + chosen + " (" + binds[0].why +
                                   ")");
  RendezvousOptions ro;
  ro.backend = "gloo";
  ro.address = addresses[0];
  ro.timeout = options.timeout;
  auto rendezvous = std::make_shared<const Rendezvous>(env, ro);
  // Note [Bounding what the libraries do not]: the thread may outlive this
  // call, so it shares what it uses.
  struct Connected {
    std::mutex m;
    c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;  // guarded by m
  };
  auto connected = std::make_shared<Connected>();
  const std::chrono::milliseconds timeout = options.timeout;
  const std::string on_rank = "gloo connect on rank " + std::to_string(rank);
  try {
    run_bounded(
        [connected, rendezvous, rank, world, timeout, addresses] {
          auto pg = make_pg(rendezvous->store(), rank, world, timeout,
                            addresses);
          std::lock_guard<std::mutex> hold(connected->m);
          connected->pg = pg;
        },
        timeout,
        [&] {
          return on_rank + ": the transport's connections to the other " +
                 "ranks did not complete within " +
                 std::to_string(timeout.count()) + " ms" +
                 rendezvous->diagnosis() +
                 ". The ranks bind: " + rendezvous->addresses();
        });
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(on_rank + " failed: " + message_without_backtrace(e) +
                    rendezvous->diagnosis() +
                    ". The ranks bind: " + rendezvous->addresses());
  }
  auto impl = std::make_unique<Impl>();
  {
    std::lock_guard<std::mutex> hold(connected->m);
    impl->pg = connected->pg;
  }
  impl->timeout = options.timeout;
  impl->rendezvous = rendezvous;
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(impl), rank, world));
}

void GlooCommunicator::all_reduce(Buffer buf, const AllReduceOptions& opts) {
  if (buf.numel == 0) return;
  guarded("all_reduce", rank_, impl_->rendezvous, [&] {
    std::vector<at::Tensor> t = {wrap(buf)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(opts.op);
    issue([&] { return impl_->pg->allreduce(t, o); })->wait();
    if (opts.op == ReduceOp::kAvg) t[0].div_(world_size_);
  });
}

void GlooCommunicator::reduce_scatter(Buffer input, Buffer output,
                                      const ReduceScatterOptions& opts) {
  reduce_scatter_async(input, output, opts)->wait();
}

namespace {

// A Work whose wait() finishes the collective once: later calls return at
// once, or rethrow the first call's error.
class OnceWork : public Work {
 public:
  void wait() final {
    if (done_) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    done_ = true;
    try {
      finish();
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }

 protected:
  virtual void finish() = 0;
  bool done() const { return done_; }

 private:
  bool done_ = false;
  std::exception_ptr error_;
};

// An all-reduce in flight on Gloo's threads; wait() waits for it and
// averages where asked.
class GlooWork final : public OnceWork {
 public:
  GlooWork(const char* what, c10::intrusive_ptr<c10d::Work> work,
           at::Tensor sum, int rank, int world, bool average,
           std::shared_ptr<const Rendezvous> rendezvous)
      : what_(what),
        work_(std::move(work)),
        sum_(std::move(sum)),
        rank_(rank),
        world_(world),
        average_(average),
        rendezvous_(std::move(rendezvous)) {}

 private:
  void finish() override {
    guarded(what_, rank_, rendezvous_, [&] {
      work_->wait();
      if (average_) sum_.div_(world_);
    });
  }

  const char* what_;
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor sum_;
  int rank_, world_;
  bool average_;
  std::shared_ptr<const Rendezvous> rendezvous_;
};

}  // namespace

// Note [Gloo reduce-scatter and all-gather]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// c10d's Gloo reduce-scatter and all-gather are slow on the CPU: with 2
// processes and 105 MB of float32 (a 26M-parameter gradient) on a 2-core
// Xeon, LibTorch 2.11's reduce_scatter_tensor took 126 ms and
// all_gather_into_tensor 103 ms, against 58 ms for an all-reduce of the
// whole buffer and 37 ms / 31 ms for the same data moved by Gloo's
// point-to-point send/recv (docs/benchmarks.md). LibTorch 1.13 has no
// Gloo reduce-scatter at all (it was an all-reduce of a copy). So this
// backend moves both by point-to-point, directly between every pair of
// ranks, every transfer posted when the collective is issued:
//   - reduce-scatter: rank r sends chunk p of its input to every rank p,
//     receives chunk r of every other rank's input into a scratch buffer
//     of (W-1) chunks (ScratchPool, reused), and wait() folds the W chunks
//     in rank order (comm/rank_order.h), exactly as the simulator does:
//     gloo's reduce-scatter gives sim's bits. Each rank sends and receives
//     (W-1)/W of its input, as in a ring.
//   - all-gather: rank r copies its input into its chunk of the output,
//     sends that chunk to every rank and receives every other rank's chunk
//     straight into its place in the output: no staging copy.
// Every transfer of one collective carries the same tag, the collective's
// number in issue order (Impl::next_tag), so asynchronous collectives in
// flight at once, and c10d's own collectives between them (which use Gloo
// slots of their own), never take each other's data. Nothing waits on a
// peer between issue and wait(), so any wait order completes. A peer that
// never sends fails the recv after GlooOptions::timeout (CommError).
namespace {

// Point-to-point transfers in flight; wait() waits for the receives, runs
// `finish` (the fold), then waits for the sends (the caller's input is its
// own again after wait()).
class PointToPointWork final : public OnceWork {
 public:
  // recvs[i] and sends[i] are the transfers with rank peers[i].
  PointToPointWork(const char* what, int rank,
                   std::chrono::milliseconds timeout, std::vector<int> peers,
                   std::vector<c10::intrusive_ptr<c10d::Work>> recvs,
                   std::vector<c10::intrusive_ptr<c10d::Work>> sends,
                   std::function<void()> finish,
                   std::shared_ptr<const Rendezvous> rendezvous)
      : what_(what),
        rank_(rank),
        timeout_(timeout),
        peers_(std::move(peers)),
        recvs_(std::move(recvs)),
        sends_(std::move(sends)),
        finish_(std::move(finish)),
        rendezvous_(std::move(rendezvous)) {}
  ~PointToPointWork() override {
    // A Work dropped unwaited still lets its transfers end before the
    // buffers they read and write go away.
    if (!done()) try {
        wait();
      } catch (...) {
      }
  }

 private:
  void finish() override {
    // Released (with the scratch buffer it holds) however this ends.
    std::function<void()> fold = std::move(finish_);
    finish_ = nullptr;
    guarded(what_, rank_, rendezvous_, [&] {
      for (size_t i = 0; i < recvs_.size(); ++i)
        complete(*recvs_[i], "receive from", peers_[i]);
      if (fold) fold();
      for (size_t i = 0; i < sends_.size(); ++i)
        complete(*sends_[i], "send to", peers_[i]);
    });
  }

  // Waits for one transfer; a timeout is a CommError naming the peer
  // whether Gloo throws or reports it.
  void complete(c10d::Work& w, const char* direction, int peer) {
    bool done = false;
    try {
      done = w.wait(timeout_);
    } catch (const std::exception& e) {
      throw CommError(std::string("gloo ") + what_ + " on rank " +
                      std::to_string(rank_) + ": the " + direction +
                      " rank " + std::to_string(peer) +
                      " failed: " + message_without_backtrace(e));
    }
    if (!done)
      throw CommError(std::string("gloo ") + what_ + " on rank " +
                      std::to_string(rank_) + ": the " + direction +
                      " rank " + std::to_string(peer) +
                      " did not complete within the timeout (" +
                      std::to_string(timeout_.count()) + " ms)");
  }

  const char* what_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::vector<int> peers_;
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs_, sends_;
  std::function<void()> finish_;
  std::shared_ptr<const Rendezvous> rendezvous_;
};

// `numel` elements of `b` from element `offset`.
at::Tensor slice(Buffer b, size_t offset, size_t numel) {
  Buffer s = b;
  s.data = static_cast<char*>(b.data) + offset * dtype_size(b.dtype);
  s.numel = numel;
  return wrap(s);
}

}  // namespace

namespace {

// Posts, for every peer p, a receive into recv_into(p) and a send of
// send_from(p), all under `tag` (Note [Gloo reduce-scatter and
// all-gather]); `peers` gets each transfer's peer.
void exchange(c10d::ProcessGroupGloo& pg, int rank, int world, int tag,
              const std::function<at::Tensor(int peer)>& recv_into,
              const std::function<at::Tensor(int peer)>& send_from,
              std::vector<int>* peers,
              std::vector<c10::intrusive_ptr<c10d::Work>>* recvs,
              std::vector<c10::intrusive_ptr<c10d::Work>>* sends) {
  issue([&] {
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      peers->push_back(p);
      std::vector<at::Tensor> r = {recv_into(p)};
      recvs->push_back(pg.recv(r, p, tag));
      std::vector<at::Tensor> s = {send_from(p)};
      sends->push_back(pg.send(s, p, tag));
    }
    return c10::intrusive_ptr<c10d::Work>();
  });
}

}  // namespace

std::shared_ptr<Work> GlooCommunicator::reduce_scatter_async(
    Buffer input, Buffer output, const ReduceScatterOptions& opts) {
  check_reduce_scatter_args(rank_, world_size_, input, output);
  const size_t n = output.numel;
  if (n == 0) return std::make_shared<CompletedWork>();
  wrap(input);  // refuses device buffers
  wrap(output);
  std::shared_ptr<Work> out;
  guarded("reduce_scatter", rank_, impl_->rendezvous, [&] {
    const int tag = static_cast<int>(impl_->next_tag++ & 0x7fffffff);
    const size_t elem = dtype_size(input.dtype);
    std::shared_ptr<ScratchPool> pool = impl_->scratch;
    at::Tensor scratch = world_size_ > 1
                             ? pool->take((world_size_ - 1) * n * elem)
                             : at::Tensor();
    Buffer from_peers = output;  // (W-1) chunks: rank p's at p - (p > rank)
    from_peers.data = scratch.defined() ? scratch.data_ptr() : nullptr;
    from_peers.numel = (world_size_ - 1) * n;
    std::vector<int> peers;
    std::vector<c10::intrusive_ptr<c10d::Work>> recvs, sends;
    exchange(
        *impl_->pg, rank_, world_size_, tag,
        [&](int p) { return slice(from_peers, (p - (p > rank_)) * n, n); },
        [&](int p) { return slice(input, p * n, n); }, &peers, &recvs,
        &sends);
    const int rank = rank_, world = world_size_;
    const ReduceOp op = opts.op;
    const bool accumulate = opts.accumulate;
    auto finish = [=]() mutable {
      rank_order::with_type(input.dtype, [&](auto type) {
        using T = decltype(type);
        std::vector<const T*> parts(world);
        for (int p = 0; p < world; ++p)
          parts[p] = p == rank ? static_cast<const T*>(input.data) + p * n
                               : static_cast<const T*>(from_peers.data) +
                                     (p - (p > rank)) * n;
        if (accumulate) {
          std::vector<T> tile(rank_order::kChunkBytes / sizeof(T));
          rank_order::reduce_add_chunked<T>(
              parts, 0, n, op, static_cast<T*>(output.data), tile.data());
        } else {
          rank_order::reduce_chunked<T>(parts, 0, n, op,
                                        static_cast<T*>(output.data));
        }
      });
      if (scratch.defined()) pool->give_back(std::move(scratch));
    };
    out = std::make_shared<PointToPointWork>(
        "reduce_scatter", rank_, impl_->timeout, std::move(peers),
        std::move(recvs), std::move(sends), finish, impl_->rendezvous);
  });
  return out;
}

// In place on the caller's buffer, finished in wait().
std::shared_ptr<Work> GlooCommunicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  if (buf.numel == 0) return std::make_shared<CompletedWork>();
  std::shared_ptr<Work> out;
  guarded("all_reduce", rank_, impl_->rendezvous, [&] {
    at::Tensor t = wrap(buf);
    std::vector<at::Tensor> ts = {t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(opts.op);
    auto work = issue([&] { return impl_->pg->allreduce(ts, o); });
    out = std::make_shared<GlooWork>("all_reduce", std::move(work), t, rank_,
                                     world_size_, opts.op == ReduceOp::kAvg,
                                     impl_->rendezvous);
  });
  return out;
}

void GlooCommunicator::all_gather(Buffer input, Buffer output,
                                  const AllGatherOptions& opts) {
  all_gather_async(input, output, opts)->wait();
}

// Point to point (Note [Gloo reduce-scatter and all-gather]).
std::shared_ptr<Work> GlooCommunicator::all_gather_async(
    Buffer input, Buffer output, const AllGatherOptions&) {
  check_all_gather_args(rank_, world_size_, input, output);
  const size_t n = input.numel;
  if (n == 0) return std::make_shared<CompletedWork>();
  wrap(input);  // refuses device buffers
  wrap(output);
  std::shared_ptr<Work> out;
  guarded("all_gather", rank_, impl_->rendezvous, [&] {
    // The input may be this rank's chunk of the output already.
    at::Tensor mine = slice(output, rank_ * n, n);
    if (mine.data_ptr() != input.data) mine.copy_(wrap(input));
    const int tag = static_cast<int>(impl_->next_tag++ & 0x7fffffff);
    std::vector<int> peers;
    std::vector<c10::intrusive_ptr<c10d::Work>> recvs, sends;
    exchange(
        *impl_->pg, rank_, world_size_, tag,
        [&](int p) { return slice(output, p * n, n); },
        [&](int) { return mine; }, &peers, &recvs, &sends);
    out = std::make_shared<PointToPointWork>(
        "all_gather", rank_, impl_->timeout, std::move(peers),
        std::move(recvs), std::move(sends), nullptr, impl_->rendezvous);
  });
  return out;
}

void GlooCommunicator::broadcast(Buffer buf, const BroadcastOptions& opts) {
  check_broadcast_root(opts.root, world_size_);
  if (buf.numel == 0) return;
  guarded("broadcast", rank_, impl_->rendezvous, [&] {
    std::vector<at::Tensor> t = {wrap(buf)};
    c10d::BroadcastOptions o;
    o.rootRank = opts.root;
    issue([&] { return impl_->pg->broadcast(t, o); })->wait();
  });
}

void GlooCommunicator::barrier() {
  guarded("barrier", rank_, impl_->rendezvous,
          [&] { issue([&] { return impl_->pg->barrier(); })->wait(); });
}

GlooLocalWorld::GlooLocalWorld(int world_size, const GlooOptions& options)
    : world_size_(world_size) {
  if (world_size < 1)
    throw UsageError("GlooLocalWorld world_size = " +
                     std::to_string(world_size) + ": must be at least 1");
  auto store = c10::make_intrusive<c10d::HashStore>();
  raw_.resize(world_size);
  // The ranks started wait in the rendezvous for the ones that could not
  // be, until options.timeout (Note [A rank whose thread cannot start]).
  const std::vector<std::exception_ptr> errors =
      run_thread_per_rank(world_size, [&](int r) {
        auto impl = std::make_unique<GlooCommunicator::Impl>();
        guarded("connect", r, nullptr, [&] {
          impl->pg = make_pg(
              store, r, world_size, options.timeout,
              {options.hostname.empty() ? "127.0.0.1" : options.hostname});
          impl->timeout = options.timeout;
        });
        raw_[r].reset(new GlooCommunicator(std::move(impl), r, world_size));
      });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  ledgers_.resize(world_size);
  for (int r = 0; r < world_size; ++r)
    comms_.push_back(
        std::make_unique<RecordingCommunicator>(raw_[r].get(), &ledgers_[r]));
}

GlooLocalWorld::~GlooLocalWorld() = default;

Communicator& GlooLocalWorld::comm(int rank) {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size_);
  return *comms_[rank];
}

const Ledger& GlooLocalWorld::ledger(int rank) const {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size_);
  return ledgers_[rank];
}

Ledger& GlooLocalWorld::mutable_ledger(int rank) {
  ZS_CHECK(rank >= 0);
  ZS_CHECK(rank < world_size_);
  return ledgers_[rank];
}

std::vector<std::exception_ptr> GlooLocalWorld::run_collect(
    const std::function<void(int rank)>& fn) {
  return run_thread_per_rank(world_size_, fn);
}

}  // namespace zerostep
