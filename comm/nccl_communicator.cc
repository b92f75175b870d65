#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/errors.h"

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

struct NcclCommunicator::Impl {
  int rank = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;   // the collectives', non-blocking
  cudaStream_t compute = nullptr;  // the rank's kernels'
  cudaEvent_t ready = nullptr;     // recorded on compute before a collective
  cudaEvent_t uploaded = nullptr;  // recorded on stream after a host input
  void* in = nullptr;
  void* out = nullptr;
  size_t capacity = 0;  // bytes of each staging buffer

  void reserve(size_t bytes) {
    if (bytes <= capacity) return;
    // A collective still queued may read or write the old buffers.
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", rank);
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
      cuda_check(cudaEventRecord(uploaded, stream), "cudaEventRecord", rank);
      cuda_check(cudaEventSynchronize(uploaded), "cudaEventSynchronize", rank);
      src = in;
    }
    issue(src, output.device ? output.data : out);
    if (output.device) return true;
    cuda_check(cudaMemcpyAsync(output.data, out, output.bytes(),
                               cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync", rank);
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", rank);
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
  cuda_check(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags", rank);
  impl_->compute = static_cast<cudaStream_t>(options.compute_stream);
  cuda_check(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming),
             "cudaEventCreateWithFlags", rank);
  cuda_check(cudaEventCreateWithFlags(&impl_->uploaded, cudaEventDisableTiming),
             "cudaEventCreateWithFlags", rank);
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->in) cudaFree(impl_->in);
  if (impl_->out) cudaFree(impl_->out);
  if (impl_->ready) cudaEventDestroy(impl_->ready);
  if (impl_->uploaded) cudaEventDestroy(impl_->uploaded);
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
    nccl_check(ncclAllReduce(src, dst, buf.numel, nccl_type(buf.dtype),
                             nccl_op(opts.op), impl_->comm, impl_->stream),
               "ncclAllReduce", rank_);
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
    nccl_check(ncclReduceScatter(src, dst, output.numel, nccl_type(input.dtype),
                                 nccl_op(opts.op), impl_->comm, impl_->stream),
               "ncclReduceScatter", rank_);
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
    nccl_check(ncclAllGather(src, dst, input.numel, nccl_type(input.dtype),
                             impl_->comm, impl_->stream),
               "ncclAllGather", rank_);
  }));
}

void NcclCommunicator::broadcast(Buffer buf, const BroadcastOptions& opts) {
  check_broadcast_root(opts.root, world_size_);
  if (buf.numel == 0) return;
  auto issue = [&](const void* src, void* dst) {
    nccl_check(ncclBroadcast(src, dst, buf.numel, nccl_type(buf.dtype),
                             opts.root, impl_->comm, impl_->stream),
               "ncclBroadcast", rank_);
  };
  impl_->work(impl_->run(buf, buf, issue))->wait();
}

void NcclCommunicator::barrier() {
  float x = 0.0f;
  all_reduce(Buffer::of(&x, 1), {ReduceOp::kSum, kBarrierLabel});
}

}  // namespace zerostep
