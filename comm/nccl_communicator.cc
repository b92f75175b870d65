#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "comm/bounded_call.h"
#include "comm/net_interface.h"
#include "comm/rendezvous.h"
#include "comm/torchrun_env.h"
#include "common/errors.h"
#include "common/log.h"

namespace zerostep {
namespace {

void cuda_check(cudaError_t e, const char* call, int rank) {
  if (e != cudaSuccess)
    throw CommError(std::string("nccl backend, rank ") + std::to_string(rank) +
                    ": " + call + " failed: " + cudaGetErrorString(e));
}

void nccl_check(ncclResult_t r, const char* call, int rank) {
  if (r != ncclSuccess)
    throw CommError(std::string("nccl backend, rank ") + std::to_string(rank) +
                    ": " + call + " failed: " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

}  // namespace

namespace {
// Completes when the compute stream has been told to wait for the
// collective's event (no host wait); the event is this work's own.
class DeviceWork final : public Work {
 public:
  DeviceWork(cudaEvent_t event, cudaStream_t compute, int rank)
      : event_(event), compute_(compute), rank_(rank) {}
  ~DeviceWork() override { cudaEventDestroy(event_); }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    cuda_check(cudaStreamWaitEvent(compute_, event_, 0),
               "cudaStreamWaitEvent", rank_);
  }

 private:
  cudaEvent_t event_;
  cudaStream_t compute_;
  int rank_;
  bool waited_ = false;
};
}  // namespace

// Note [Bounded NCCL waits]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A blocking NCCL communicator waits inside ncclCommInitRank, and
// cudaStreamSynchronize waits for a collective, for as long as a peer takes,
// which is forever for a peer that died or stopped. So from_environment's
// communicator is non-blocking (ncclConfig_t::blocking = 0): its calls may
// return ncclInProgress, and every wait of the host polls, until the
// timeout: the event it waits for (cudaEventQuery) and the communicator's
// state (ncclCommGetAsyncError, which also reports a peer's failure). At
// the timeout, or on an error, the communicator is aborted (ncclCommAbort
// ends its kernels, so the stream can be used for the error path) and the
// call throws CommError naming the call, and, after a rendezvous, the peers
// that do not answer a probe. The id-file constructor's communicator stays
// blocking (its initialization is NCCL's), but its host waits are the same
// bounded polls.
struct NcclCommunicator::Impl {
  int rank = 0;
  ncclComm_t comm = nullptr;
  std::chrono::milliseconds timeout{60000};
  // from_environment's ranks: the peers to probe when a wait fails.
  std::shared_ptr<const Rendezvous> rendezvous;
  cudaStream_t stream = nullptr;   // the collectives', non-blocking
  cudaStream_t compute = nullptr;  // the rank's kernels'
  cudaEvent_t ready = nullptr;     // recorded on compute before a collective
  cudaEvent_t uploaded = nullptr;  // recorded on stream after a host input
  cudaEvent_t waited = nullptr;    // recorded where the host waits
  void* in = nullptr;
  void* out = nullptr;
  size_t capacity = 0;  // bytes of each staging buffer

  // Note [Bounded NCCL waits]: aborts the communicator and throws.
  [[noreturn]] void fail(const std::string& what) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    throw CommError("nccl backend, rank " + std::to_string(rank) + ": " + what +
                    (rendezvous ? rendezvous->diagnosis() : std::string()));
  }
  // The communicator's state: fails on an error; true while in progress.
  bool in_progress(const char* call) {
    if (comm == nullptr)
      throw CommError("nccl backend, rank " + std::to_string(rank) + ": " +
                      call + " after the communicator was aborted");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclInProgress) return true;
    if (state != ncclSuccess)
      fail(std::string(call) + " failed: " + ncclGetErrorString(state) +
           " (" + ncclGetLastError(comm) + ")");
    return false;
  }
  // An NCCL call's result; ncclInProgress (non-blocking mode) is waited
  // for, until the timeout.
  void check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) {
      if (comm == nullptr) nccl_check(r, call, rank);
      fail(std::string(call) + " failed: " + ncclGetErrorString(r));
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (in_progress(call)) {
      if (std::chrono::steady_clock::now() > deadline)
        fail(std::string(call) + " did not complete within " +
             std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  // Waits until the work queued on `stream` so far is done, polling until
  // the timeout (Note [Bounded NCCL waits]).
  void wait_for(cudaStream_t on, const char* what) {
    cuda_check(cudaEventRecord(waited, on), "cudaEventRecord", rank);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const cudaError_t q = cudaEventQuery(waited);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, "cudaEventQuery", rank);
      in_progress(what);
      if (std::chrono::steady_clock::now() > deadline)
        fail(std::string(what) + " did not complete within " +
             std::to_string(timeout.count()) +
             " ms (a peer stopped or died, or the ranks' collectives differ)");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void create_streams(void* compute_stream) {
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags", rank);
    compute = static_cast<cudaStream_t>(compute_stream);
    for (cudaEvent_t* e : {&ready, &uploaded, &waited})
      cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming),
                 "cudaEventCreateWithFlags", rank);
  }

  void reserve(size_t bytes) {
    if (bytes <= capacity) return;
    // A collective still queued may read or write the old buffers.
    wait_for(stream, "a queued collective");
    if (in) cudaFree(in);
    if (out) cudaFree(out);
    in = out = nullptr;
    capacity = 0;
    cuda_check(cudaMalloc(&in, bytes), "cudaMalloc", rank);
    cuda_check(cudaMalloc(&out, bytes), "cudaMalloc", rank);
    capacity = bytes;
  }
  // The collectives' stream waits for the compute stream's work so far
  // (what was computed into a device input, or still reads a device output).
  void begin_device() {
    cuda_check(cudaEventRecord(ready, compute), "cudaEventRecord", rank);
    cuda_check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent",
               rank);
  }
  // Note [NCCL buffers in host memory]: `issue(src, dst)` queues one NCCL
  // call on `stream` with device pointers; a host side goes through the
  // staging buffers. Returns whether the output is device memory, i.e.
  // whether the result is still to come on `stream` (the caller makes the
  // compute stream wait for it, now or in a Work); a host output has been
  // written when this returns.
  template <typename Issue>
  bool run(Buffer input, Buffer output, Issue issue) {
    if (!input.device || !output.device)
      reserve(std::max(input.bytes(), output.bytes()));
    if (input.device || output.device) begin_device();
    const void* src = input.data;
    if (!input.device) {
      cuda_check(cudaMemcpyAsync(in, input.data, input.bytes(),
                                 cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync", rank);
      // The host input is the caller's again when this returns (pinned
      // memory is read by the copy engine later).
      // The copy is queued after the stream's earlier collectives.
      wait_for(stream, "the upload of a host input");
      src = in;
    }
    issue(src, output.device ? output.data : out);
    if (output.device) return true;
    cuda_check(cudaMemcpyAsync(output.data, out, output.bytes(),
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync", rank);
    wait_for(stream, "a collective into a host buffer");
    return false;
  }
  // A collective's Work: with a device output, its own event, which the
  // compute stream waits for in wait() (a blocking collective waits at
  // once: the host does not); a host output is complete.
  std::shared_ptr<Work> work(bool on_device) {
    if (!on_device) return std::make_shared<CompletedWork>();
    cudaEvent_t event = nullptr;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
               "cudaEventCreateWithFlags", rank);
    auto w = std::make_shared<DeviceWork>(event, compute, rank);
    cuda_check(cudaEventRecord(event, stream), "cudaEventRecord", rank);
    return w;
  }
};

NcclCommunicator::NcclCommunicator(int rank, int world_size,
                                   const NcclOptions& options)
    : impl_(std::make_unique<Impl>()), rank_(rank), world_size_(world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw UsageError("NcclCommunicator: rank " + std::to_string(rank) +
                     " of world " + std::to_string(world_size) +
                     " is not a rank of that world");
  if (options.id_path.empty())
    throw UsageError("NcclCommunicator: NcclOptions.id_path is empty: rank 0 "
                     "publishes the NCCL unique id there");
  impl_->rank = rank;
  cuda_check(cudaSetDevice(options.device), "cudaSetDevice", rank);
  ncclUniqueId id;
  if (rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", rank);
    const std::string tmp = options.id_path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(id.internal, sizeof(id.internal));
      if (!f) throw IoError("cannot write NCCL id to '" + tmp + "'");
    }
    if (std::rename(tmp.c_str(), options.id_path.c_str()) != 0)
      throw IoError("cannot publish NCCL id at '" + options.id_path + "'");
  } else {
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    for (;;) {
      std::ifstream f(options.id_path, std::ios::binary);
      if (f.read(id.internal, sizeof(id.internal))) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw CommError("nccl backend, rank " + std::to_string(rank) +
                        ": rank 0 did not publish the NCCL id at '" +
                        options.id_path + "' within the timeout");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  nccl_check(ncclCommInitRank(&impl_->comm, world_size, id, rank),
             "ncclCommInitRank", rank);
  impl_->timeout = options.timeout;
  impl_->create_streams(options.compute_stream);
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Impl> impl, int rank,
                                   int world_size)
    : impl_(std::move(impl)), rank_(rank), world_size_(world_size) {}

std::unique_ptr<NcclCommunicator> NcclCommunicator::from_environment(
    const NcclOptions& options) {
  const TorchrunEnv env = read_torchrun_env();
  const int rank = env.rank, world = env.world_size;
  const NcclSocketChoice socket = choose_nccl_socket_ifname(
      std::getenv("NCCL_SOCKET_IFNAME"), env.master_addr, world,
      env.local_world_size, HostNetwork::of_this_host());
  // Before NCCL reads it (its first call below).
  if (!socket.set_by_user)
    setenv("NCCL_SOCKET_IFNAME", socket.ifname.c_str(), 1);
  log_message(LogLevel::kInfo,
              "nccl: rank " + std::to_string(rank) + " on device " +
                  std::to_string(env.local_rank) + " (LOCAL_RANK) binds " +
                  socket.address + ", NCCL_SOCKET_IFNAME=" + socket.ifname +
                  " (" + socket.why + ")");
  RendezvousOptions ro;
  ro.backend = "nccl";
  ro.address = socket.address;
  ro.timeout = options.timeout;
  auto rendezvous = std::make_shared<const Rendezvous>(env, ro);
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->timeout = options.timeout;
  impl->rendezvous = rendezvous;
  cuda_check(cudaSetDevice(env.local_rank), "cudaSetDevice", rank);
  ncclUniqueId id;
  c10::intrusive_ptr<c10d::Store> store = rendezvous->store();
  if (rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", rank);
    store->set("nccl_id", std::vector<uint8_t>(id.internal,
                                               id.internal + sizeof(id.internal)));
  } else {
    // Shared with the thread, which may outlive this call (Note [Bounding
    // what the libraries do not] in comm/bounded_call.h).
    struct Got {
      std::mutex m;
      std::vector<uint8_t> bytes;  // guarded by m
    };
    auto got = std::make_shared<Got>();
    run_bounded(
        [store, got] {
          store->wait({"nccl_id"});
          std::vector<uint8_t> b = store->get("nccl_id");
          std::lock_guard<std::mutex> hold(got->m);
          got->bytes = std::move(b);
        },
        options.timeout,
        [&] {
          return "nccl backend, rank " + std::to_string(rank) +
                 ": rank 0 did not publish the NCCL id within " +
                 std::to_string(options.timeout.count()) + " ms" +
                 rendezvous->diagnosis();
        });
    std::lock_guard<std::mutex> hold(got->m);
    if (got->bytes.size() != sizeof(id.internal))
      throw CommError("nccl backend, rank " + std::to_string(rank) +
                      ": the NCCL id in the store has " +
                      std::to_string(got->bytes.size()) + " bytes, not " +
                      std::to_string(sizeof(id.internal)));
    std::memcpy(id.internal, got->bytes.data(), sizeof(id.internal));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // Note [Bounded NCCL waits]
  const ncclResult_t r =
      ncclCommInitRankConfig(&impl->comm, world, id, rank, &config);
  if (impl->comm == nullptr) nccl_check(r, "ncclCommInitRankConfig", rank);
  impl->check(r, "ncclCommInitRankConfig");
  impl->create_streams(options.compute_stream);
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(impl), rank, world));
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->in) cudaFree(impl_->in);
  if (impl_->out) cudaFree(impl_->out);
  if (impl_->ready) cudaEventDestroy(impl_->ready);
  if (impl_->uploaded) cudaEventDestroy(impl_->uploaded);
  if (impl_->waited) cudaEventDestroy(impl_->waited);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
}

void NcclCommunicator::all_reduce(Buffer buf, const AllReduceOptions& opts) {
  all_reduce_async(buf, opts)->wait();
}

std::shared_ptr<Work> NcclCommunicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  if (buf.numel == 0) return std::make_shared<CompletedWork>();
  return impl_->work(impl_->run(buf, buf, [&](const void* src, void* dst) {
    impl_->check(ncclAllReduce(src, dst, buf.numel, nccl_type(buf.dtype),
                             nccl_op(opts.op), impl_->comm, impl_->stream),
                 "ncclAllReduce");
  }));
}

void NcclCommunicator::reduce_scatter(Buffer input, Buffer output,
                                      const ReduceScatterOptions& opts) {
  reduce_scatter_async(input, output, opts)->wait();
}

std::shared_ptr<Work> NcclCommunicator::reduce_scatter_async(
    Buffer input, Buffer output, const ReduceScatterOptions& opts) {
  check_reduce_scatter_args(rank_, world_size_, input, output);
  refuse_accumulate("nccl", rank_, opts);
  if (output.numel == 0) return std::make_shared<CompletedWork>();
  return impl_->work(impl_->run(input, output, [&](const void* src, void* dst) {
    impl_->check(ncclReduceScatter(src, dst, output.numel, nccl_type(input.dtype),
                                 nccl_op(opts.op), impl_->comm, impl_->stream),
                 "ncclReduceScatter");
  }));
}

void NcclCommunicator::all_gather(Buffer input, Buffer output,
                                  const AllGatherOptions& opts) {
  all_gather_async(input, output, opts)->wait();
}

std::shared_ptr<Work> NcclCommunicator::all_gather_async(
    Buffer input, Buffer output, const AllGatherOptions&) {
  check_all_gather_args(rank_, world_size_, input, output);
  if (input.numel == 0) return std::make_shared<CompletedWork>();
  // NCCL allows the input to be this rank's chunk of the output.
  return impl_->work(impl_->run(input, output, [&](const void* src, void* dst) {
    impl_->check(ncclAllGather(src, dst, input.numel, nccl_type(input.dtype),
                             impl_->comm, impl_->stream),
                 "ncclAllGather");
  }));
}

void NcclCommunicator::broadcast(Buffer buf, const BroadcastOptions& opts) {
  check_broadcast_root(opts.root, world_size_);
  if (buf.numel == 0) return;
  auto issue = [&](const void* src, void* dst) {
    impl_->check(ncclBroadcast(src, dst, buf.numel, nccl_type(buf.dtype),
                             opts.root, impl_->comm, impl_->stream),
                 "ncclBroadcast");
  };
  impl_->work(impl_->run(buf, buf, issue))->wait();
}

void NcclCommunicator::barrier() {
  float x = 0.0f;
  all_reduce(Buffer::of(&x, 1), {ReduceOp::kSum, kBarrierLabel});
}

}  // namespace zerostep
