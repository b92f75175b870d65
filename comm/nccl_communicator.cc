#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

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
  cudaEvent_t done = nullptr;      // recorded on stream after a blocking one
  void* in = nullptr;
  void* out = nullptr;
  size_t capacity = 0;  // bytes of each staging buffer

  void reserve(size_t bytes) {
    if (bytes <= capacity) return;
    if (in) cudaFree(in);
    if (out) cudaFree(out);
    in = out = nullptr;
    capacity = 0;
    cuda_check(cudaMalloc(&in, bytes), "cudaMalloc", rank);
    cuda_check(cudaMalloc(&out, bytes), "cudaMalloc", rank);
    capacity = bytes;
  }
  void to_device(void* dev, const void* host, size_t bytes) {
    cuda_check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync", rank);
  }
  // A collective on device buffers: after the compute stream's work so far.
  void begin_device() {
    cuda_check(cudaEventRecord(ready, compute), "cudaEventRecord", rank);
    cuda_check(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent",
               rank);
  }
  // A reduce-scatter of device buffers on the collectives' stream, after
  // the compute stream's work so far.
  void reduce_scatter_device(Buffer input, Buffer output, ReduceOp op) {
    begin_device();
    nccl_check(ncclReduceScatter(input.data, output.data, output.numel,
                                 nccl_type(input.dtype), nccl_op(op), comm,
                                 stream),
               "ncclReduceScatter", rank);
  }
  // The compute stream's next work waits for `event`, recorded now on the
  // collectives' stream.
  void end_device(cudaEvent_t event) {
    cuda_check(cudaEventRecord(event, stream), "cudaEventRecord", rank);
    cuda_check(cudaStreamWaitEvent(compute, event, 0), "cudaStreamWaitEvent",
               rank);
  }
  // A Work for the collective just issued on `stream`: its own event,
  // which the compute stream waits for in wait().
  std::shared_ptr<Work> record_work() {
    cudaEvent_t event = nullptr;
    cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
               "cudaEventCreateWithFlags", rank);
    auto work = std::make_shared<DeviceWork>(event, compute, rank);
    cuda_check(cudaEventRecord(event, stream), "cudaEventRecord", rank);
    return work;
  }
  void to_host(void* host, const void* dev, size_t bytes) {
    cuda_check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync", rank);
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", rank);
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
  cuda_check(cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming),
             "cudaEventCreateWithFlags", rank);
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->in) cudaFree(impl_->in);
  if (impl_->out) cudaFree(impl_->out);
  if (impl_->ready) cudaEventDestroy(impl_->ready);
  if (impl_->done) cudaEventDestroy(impl_->done);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
}

namespace {
// Both buffers of a collective must be in the same memory.
void check_same_memory(int rank, Buffer a, Buffer b) {
  if (a.device != b.device)
    throw UsageError("nccl on rank " + std::to_string(rank) +
                     ": one buffer of a collective is device memory and the "
                     "other host memory; give both in the same memory");
}
}  // namespace

void NcclCommunicator::all_reduce(Buffer buf, const AllReduceOptions& opts) {
  if (buf.numel == 0) return;
  if (buf.device) {
    impl_->begin_device();
    nccl_check(ncclAllReduce(buf.data, buf.data, buf.numel,
                             nccl_type(buf.dtype), nccl_op(opts.op),
                             impl_->comm, impl_->stream),
               "ncclAllReduce", rank_);
    impl_->end_device(impl_->done);
    return;
  }
  impl_->reserve(buf.bytes());
  impl_->to_device(impl_->in, buf.data, buf.bytes());
  nccl_check(ncclAllReduce(impl_->in, impl_->out, buf.numel,
                           nccl_type(buf.dtype), nccl_op(opts.op), impl_->comm,
                           impl_->stream),
             "ncclAllReduce", rank_);
  impl_->to_host(buf.data, impl_->out, buf.bytes());
}

void NcclCommunicator::reduce_scatter(Buffer input, Buffer output,
                                      const ReduceScatterOptions& opts) {
  check_reduce_scatter_args(rank_, world_size_, input, output);
  check_same_memory(rank_, input, output);
  if (output.numel == 0) return;
  if (input.device) {
    impl_->reduce_scatter_device(input, output, opts.op);
    impl_->end_device(impl_->done);
    return;
  }
  impl_->reserve(input.bytes());
  impl_->to_device(impl_->in, input.data, input.bytes());
  nccl_check(ncclReduceScatter(impl_->in, impl_->out, output.numel,
                               nccl_type(input.dtype), nccl_op(opts.op),
                               impl_->comm, impl_->stream),
             "ncclReduceScatter", rank_);
  impl_->to_host(output.data, impl_->out, output.bytes());
}

std::shared_ptr<Work> NcclCommunicator::reduce_scatter_async(
    Buffer input, Buffer output, const ReduceScatterOptions& opts) {
  check_reduce_scatter_args(rank_, world_size_, input, output);
  check_same_memory(rank_, input, output);
  if (!input.device || output.numel == 0) {
    // Host buffers are staged and waited for: complete here.
    reduce_scatter(input, output, opts);
    return std::make_shared<CompletedWork>();
  }
  impl_->reduce_scatter_device(input, output, opts.op);
  return impl_->record_work();
}

std::shared_ptr<Work> NcclCommunicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  if (!buf.device || buf.numel == 0) {
    all_reduce(buf, opts);  // host buffers are staged and waited for
    return std::make_shared<CompletedWork>();
  }
  impl_->begin_device();
  nccl_check(ncclAllReduce(buf.data, buf.data, buf.numel, nccl_type(buf.dtype),
                           nccl_op(opts.op), impl_->comm, impl_->stream),
             "ncclAllReduce", rank_);
  return impl_->record_work();
}

void NcclCommunicator::all_gather(Buffer input, Buffer output,
                                  const AllGatherOptions&) {
  check_all_gather_args(rank_, world_size_, input, output);
  check_same_memory(rank_, input, output);
  if (input.numel == 0) return;
  if (input.device) {
    // NCCL allows the input to be this rank's chunk of the output.
    impl_->begin_device();
    nccl_check(ncclAllGather(input.data, output.data, input.numel,
                             nccl_type(input.dtype), impl_->comm,
                             impl_->stream),
               "ncclAllGather", rank_);
    impl_->end_device(impl_->done);
    return;
  }
  impl_->reserve(output.bytes());
  impl_->to_device(impl_->in, input.data, input.bytes());
  nccl_check(ncclAllGather(impl_->in, impl_->out, input.numel,
                           nccl_type(input.dtype), impl_->comm, impl_->stream),
             "ncclAllGather", rank_);
  impl_->to_host(output.data, impl_->out, output.bytes());
}

void NcclCommunicator::broadcast(Buffer buf, const BroadcastOptions& opts) {
  check_broadcast_root(opts.root, world_size_);
  if (buf.numel == 0) return;
  if (buf.device) {
    impl_->begin_device();
    nccl_check(ncclBroadcast(buf.data, buf.data, buf.numel,
                             nccl_type(buf.dtype), opts.root, impl_->comm,
                             impl_->stream),
               "ncclBroadcast", rank_);
    impl_->end_device(impl_->done);
    return;
  }
  impl_->reserve(buf.bytes());
  impl_->to_device(impl_->in, buf.data, buf.bytes());
  nccl_check(ncclBroadcast(impl_->in, impl_->out, buf.numel,
                           nccl_type(buf.dtype), opts.root, impl_->comm,
                           impl_->stream),
             "ncclBroadcast", rank_);
  impl_->to_host(buf.data, impl_->out, buf.bytes());
}

void NcclCommunicator::barrier() {
  float x = 0.0f;
  all_reduce(Buffer::of(&x, 1), {ReduceOp::kSum, kBarrierLabel});
}

}  // namespace zerostep
