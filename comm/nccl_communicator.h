// The "nccl" Communicator backend: NCCL collectives on one CUDA device,
// built only with --config=cuda (needs /usr/local/cuda; see
// docs/architecture.md and tools/gpu_check.sh).
//
// Buffers marked `device` (an engine on the device, Note [Device kernels]
// in zero/kernels.h) are given to NCCL as they are: each collective runs on
// this communicator's own non-blocking stream, after an event recorded on
// the compute stream (NcclOptions::compute_stream: what was computed into
// the buffer is complete), and the compute stream waits for the collective's
// event before its next kernel; the host never waits.
// The *_async collectives return a Work whose wait() makes the compute
// stream wait for that event, so later kernels (the next backward's
// compute, stage 3's next block) overlap the collective until then; so
// overlaps_async() is true (Note [Stage 3 prefetch] in zero/stage3.h).
//
// Note [NCCL buffers in host memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A host buffer (the agreements, the norm; and one side of stage 3's
// collectives with offload from a device: host partitions gathered into
// device storage, device gradients reduce-scattered into host chunks,
// Note [Stage 3 offload from a device]) goes through device staging
// buffers on the same stream (grown, never shrunk): a host input is
// uploaded, and the call waits until the copy has read it; a host output
// is downloaded and waited for, so the collective is complete when the
// call returns (its Work too). A device side is used in place. Reduction
// order is NCCL's (ring or tree by message size): float results may differ
// from sim's in the last bits.
//
// Rendezvous: rank 0 creates an NCCL unique id and writes it to
// `id_path` (atomically); the other ranks wait for that file.
//
// Errors: every CUDA or NCCL failure (no device, a peer gone) raises
// CommError naming the call and NCCL's or CUDA's message; nothing hangs
// past `timeout` while waiting for the id.
//
// Thread safety: one NcclCommunicator per rank, used from one thread.
#ifndef ZEROSTEP_COMM_NCCL_COMMUNICATOR_H_
#define ZEROSTEP_COMM_NCCL_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace zerostep {

struct NcclOptions {
  int device = 0;  // CUDA device ordinal for this rank
  // The stream the rank's kernels run on (a cudaStream_t; nullptr: the
  // legacy default stream, which LibTorch uses unless told otherwise).
  void* compute_stream = nullptr;
  std::string id_path;  // where rank 0 publishes the NCCL unique id
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world_size, const NcclOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "nccl"; }
  void all_reduce(Buffer buf, const AllReduceOptions& opts) override;
  void reduce_scatter(Buffer input, Buffer output,
                      const ReduceScatterOptions& opts) override;
  std::shared_ptr<Work> all_reduce_async(Buffer buf,
                                         const AllReduceOptions& opts) override;
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) override;
  void all_gather(Buffer input, Buffer output,
                  const AllGatherOptions& opts) override;
  std::shared_ptr<Work> all_gather_async(Buffer input, Buffer output,
                                         const AllGatherOptions& opts) override;
  void broadcast(Buffer buf, const BroadcastOptions& opts) override;
  void barrier() override;
  bool overlaps_async() const override { return true; }
  bool reads_device_memory() const override { return true; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_;
  int world_size_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_NCCL_COMMUNICATOR_H_
