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

struct NcclCommunicator::Impl {
  int rank = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
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
  cuda_check(cudaStreamCreate(&impl_->stream), "cudaStreamCreate", rank);
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_->in) cudaFree(impl_->in);
  if (impl_->out) cudaFree(impl_->out);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
}

void NcclCommunicator::all_reduce(Buffer buf, const AllReduceOptions& opts) {
  if (buf.numel == 0) return;
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
  if (output.numel == 0) return;
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
  // Staged through host memory, so it completes here; a device-pointer
  // engine would record an event instead.
  reduce_scatter(input, output, opts);
  return std::make_shared<CompletedWork>();
}

void NcclCommunicator::all_gather(Buffer input, Buffer output,
                                  const AllGatherOptions&) {
  check_all_gather_args(rank_, world_size_, input, output);
  if (input.numel == 0) return;
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
