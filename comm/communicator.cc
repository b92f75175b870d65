#include "comm/communicator.h"

#include <string>

#include "common/errors.h"

namespace zerostep {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

void check_reduce_scatter_args(int rank, int world_size, Buffer input,
                               Buffer output) {
  if (input.numel != output.numel * static_cast<size_t>(world_size) ||
      input.dtype != output.dtype)
    throw UsageError("reduce_scatter on rank " + std::to_string(rank) +
                     ": input must hold world_size x output elements of the "
                     "output's dtype (input " + std::to_string(input.numel) +
                     ", output " + std::to_string(output.numel) + ")");
  const char* in = static_cast<const char*>(input.data);
  const char* out = static_cast<const char*>(output.data);
  if (output.numel > 0 && out < in + input.bytes() && in < out + output.bytes())
    throw UsageError("reduce_scatter on rank " + std::to_string(rank) +
                     ": the output buffer overlaps the input; give it a "
                     "buffer of its own");
}

void check_all_gather_args(int rank, int world_size, Buffer input,
                           Buffer output) {
  if (output.numel != input.numel * static_cast<size_t>(world_size) ||
      input.dtype != output.dtype)
    throw UsageError("all_gather on rank " + std::to_string(rank) +
                     ": output must hold world_size x input elements of the "
                     "input's dtype (input " + std::to_string(input.numel) +
                     ", output " + std::to_string(output.numel) + ")");
}

std::shared_ptr<Work> Communicator::all_gather_async(
    Buffer input, Buffer output, const AllGatherOptions& opts) {
  all_gather(input, output, opts);
  return std::make_shared<CompletedWork>();
}

std::shared_ptr<Work> Communicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  all_reduce(buf, opts);
  return std::make_shared<CompletedWork>();
}

void refuse_accumulate(const std::string& backend, int rank,
                       const ReduceScatterOptions& opts) {
  if (!opts.accumulate) return;
  throw UsageError(backend + " on rank " + std::to_string(rank) +
                   ": reduce_scatter with accumulate is not supported "
                   "(reduce_scatter_accumulates() is false). Fix: reduce "
                   "into a scratch buffer and add it");
}

void check_host_buffer(const std::string& backend, int rank, Buffer b) {
  if (!b.device) return;
  throw UsageError(backend + " on rank " + std::to_string(rank) +
                   " was given a device buffer; it reads host memory only. "
                   "Fix: wrap it in a StagingCommunicator "
                   "(zero/staging_comm.h; the Engine does this for a model "
                   "on a device), or use the nccl backend");
}

void check_broadcast_root(int root, int world_size) {
  if (root < 0 || root >= world_size)
    throw UsageError("broadcast root " + std::to_string(root) +
                     " is not a rank of this world of " +
                     std::to_string(world_size));
}

}  // namespace zerostep
