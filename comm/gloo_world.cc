#include "comm/gloo_world.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/errors.h"

namespace zerostep {

struct GlooCommunicator::Impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
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

// Runs a c10d call; any failure (timeout, peer gone) becomes CommError.
template <typename F>
void guarded(const char* what, int rank, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(std::string("gloo ") + what + " on rank " +
                    std::to_string(rank) + " failed: " + e.what());
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

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_pg(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
    const GlooOptions& options) {
  auto o = c10d::ProcessGroupGloo::Options::create();
  o->timeout = options.timeout;
  o->devices.push_back(
      c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, o);
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0')
    throw UsageError(std::string("environment variable ") + name +
                     " is not set: the gloo backend reads torchrun's "
                     "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Fix: "
                     "start the program with tools/launch, torchrun or your "
                     "scheduler, or set them");
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0)
    throw UsageError(std::string("environment variable ") + name + "=" + v +
                     " is not a non-negative integer");
  return static_cast<int>(x);
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::unique_ptr<Impl> impl, int rank,
                                   int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}

GlooCommunicator::~GlooCommunicator() = default;

std::unique_ptr<GlooCommunicator> GlooCommunicator::from_environment(
    const GlooOptions& options) {
  const int rank = env_int("RANK");
  const int world = env_int("WORLD_SIZE");
  const int port = env_int("MASTER_PORT");
  const char* addr = std::getenv("MASTER_ADDR");
  if (world < 1 || rank >= world)
    throw UsageError("RANK=" + std::to_string(rank) + " WORLD_SIZE=" +
                     std::to_string(world) +
                     ": need WORLD_SIZE >= 1 and RANK < WORLD_SIZE");
  if (addr == nullptr || *addr == '\0')
    throw UsageError("environment variable MASTER_ADDR is not set (the "
                     "address of rank 0's store, e.g. 127.0.0.1)");
  auto impl = std::make_unique<Impl>();
  guarded("rendezvous", rank, [&] {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = world;
    so.timeout = options.timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(addr, so);
    impl->pg = make_pg(store, rank, world, options);
  });
  return std::unique_ptr<GlooCommunicator>(
      new GlooCommunicator(std::move(impl), rank, world));
}

void GlooCommunicator::all_reduce(Buffer buf, const AllReduceOptions& opts) {
  if (buf.numel == 0) return;
  guarded("all_reduce", rank_, [&] {
    std::vector<at::Tensor> t = {wrap(buf)};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(opts.op);
    issue([&] { return impl_->pg->allreduce(t, o); })->wait();
    if (opts.op == ReduceOp::kAvg) t[0].div_(world_size_);
  });
}

void GlooCommunicator::reduce_scatter(Buffer input, Buffer output,
                                      const ReduceScatterOptions& opts) {
  check_reduce_scatter_args(rank_, world_size_, input, output);
#if TORCH_VERSION_MAJOR >= 2
  reduce_scatter_async(input, output, opts)->wait();
  return;
#endif
  guarded("reduce_scatter", rank_, [&] {
    // Gloo has none: all-reduce a copy, keep this rank's chunk.
    at::Tensor copy = wrap(input).clone();
    std::vector<at::Tensor> t = {copy};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(opts.op);
    issue([&] { return impl_->pg->allreduce(t, o); })->wait();
    if (opts.op == ReduceOp::kAvg) copy.div_(world_size_);
    wrap(output).copy_(copy.narrow(0, rank_ * static_cast<int64_t>(output.numel),
                                   static_cast<int64_t>(output.numel)));
  });
}

namespace {
// An all-reduce in flight on Gloo's threads; wait() waits for it, averages
// where asked and, for a reduce-scatter (an all-reduce of a copy of the
// input), puts this rank's chunk in `output` (undefined for an all-reduce,
// which reduces in place).
class GlooWork final : public Work {
 public:
  GlooWork(const char* what, c10::intrusive_ptr<c10d::Work> work,
           at::Tensor sum, at::Tensor output, int rank, int world,
           bool average)
      : what_(what),
        work_(std::move(work)),
        sum_(std::move(sum)),
        output_(std::move(output)),
        rank_(rank),
        world_(world),
        average_(average) {}
  void wait() override {
    if (done_) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    done_ = true;
    try {
      guarded(what_, rank_, [&] {
        work_->wait();
        if (average_) sum_.div_(world_);
        if (!output_.defined()) return;
        const int64_t n = output_.numel();
        output_.copy_(sum_.narrow(0, rank_ * n, n));
      });
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }

 private:
  const char* what_;
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor sum_, output_;
  int rank_, world_;
  bool average_;
  bool done_ = false;
  std::exception_ptr error_;
};
}  // namespace

// Issued now and finished in wait(), so the caller computes while Gloo's
// threads move the data (stage 2's overlap_comm). LibTorch 2.x's Gloo has a
// reduce-scatter (each rank receives its chunk's sum: half an all-reduce's
// traffic); 1.13's has none, so there it is an all-reduce of a copy of the
// input, of which this rank keeps its chunk.
std::shared_ptr<Work> GlooCommunicator::reduce_scatter_async(
    Buffer input, Buffer output, const ReduceScatterOptions& opts) {
  check_reduce_scatter_args(rank_, world_size_, input, output);
  std::shared_ptr<Work> out;
#if TORCH_VERSION_MAJOR >= 2
  if (output.numel == 0) return std::make_shared<CompletedWork>();
  guarded("reduce_scatter", rank_, [&] {
    at::Tensor in_t = wrap(input);
    at::Tensor out_t = wrap(output);
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d_op(opts.op);
    auto work =
        issue([&] { return impl_->pg->_reduce_scatter_base(out_t, in_t, o); });
    // wait() averages the output in place; nothing to copy.
    out = std::make_shared<GlooWork>("reduce_scatter", std::move(work), out_t,
                                     at::Tensor(), rank_, world_size_,
                                     opts.op == ReduceOp::kAvg);
  });
  return out;
#endif
  guarded("reduce_scatter", rank_, [&] {
    at::Tensor copy = wrap(input).clone();
    at::Tensor out_t = wrap(output);
    std::vector<at::Tensor> t = {copy};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(opts.op);
    auto work = issue([&] { return impl_->pg->allreduce(t, o); });
    out = std::make_shared<GlooWork>("reduce_scatter", std::move(work), copy,
                                     out_t, rank_, world_size_,
                                     opts.op == ReduceOp::kAvg);
  });
  return out;
}

// In place on the caller's buffer, finished in wait().
std::shared_ptr<Work> GlooCommunicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  if (buf.numel == 0) return std::make_shared<CompletedWork>();
  std::shared_ptr<Work> out;
  guarded("all_reduce", rank_, [&] {
    at::Tensor t = wrap(buf);
    std::vector<at::Tensor> ts = {t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(opts.op);
    auto work = issue([&] { return impl_->pg->allreduce(ts, o); });
    out = std::make_shared<GlooWork>("all_reduce", std::move(work), t,
                                     at::Tensor(), rank_, world_size_,
                                     opts.op == ReduceOp::kAvg);
  });
  return out;
}

void GlooCommunicator::all_gather(Buffer input, Buffer output,
                                  const AllGatherOptions&) {
  check_all_gather_args(rank_, world_size_, input, output);
  if (input.numel == 0) return;
  guarded("all_gather", rank_, [&] {
    // The input may be this rank's chunk of the output: copy it first.
    std::vector<at::Tensor> in = {wrap(input).clone()};
    at::Tensor out = wrap(output);
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < world_size_; ++r)
      outs[0].push_back(out.narrow(0, r * static_cast<int64_t>(input.numel),
                                   static_cast<int64_t>(input.numel)));
    issue([&] { return impl_->pg->allgather(outs, in); })->wait();
  });
}

void GlooCommunicator::broadcast(Buffer buf, const BroadcastOptions& opts) {
  check_broadcast_root(opts.root, world_size_);
  if (buf.numel == 0) return;
  guarded("broadcast", rank_, [&] {
    std::vector<at::Tensor> t = {wrap(buf)};
    c10d::BroadcastOptions o;
    o.rootRank = opts.root;
    issue([&] { return impl_->pg->broadcast(t, o); })->wait();
  });
}

void GlooCommunicator::barrier() {
  guarded("barrier", rank_,
          [&] { issue([&] { return impl_->pg->barrier(); })->wait(); });
}

GlooLocalWorld::GlooLocalWorld(int world_size, const GlooOptions& options)
    : world_size_(world_size) {
  if (world_size < 1)
    throw UsageError("GlooLocalWorld world_size = " +
                     std::to_string(world_size) + ": must be at least 1");
  auto store = c10::make_intrusive<c10d::HashStore>();
  raw_.resize(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto impl = std::make_unique<GlooCommunicator::Impl>();
        guarded("connect", r, [&] {
          impl->pg = make_pg(store, r, world_size, options);
        });
        raw_[r].reset(new GlooCommunicator(std::move(impl), r, world_size));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
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
  std::vector<std::exception_ptr> errors(world_size_);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size_; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace zerostep
