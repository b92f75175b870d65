// The "nccl" Communicator backend: NCCL collectives on one CUDA device,
// built only with --config=cuda (needs /usr/local/cuda; see
// docs/design/devices_and_offload.md and tools/gpu_check.sh).
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
// Rendezvous, two ways:
//   - from_environment(): torchrun's variables, as the gloo backend
//     (comm/torchrun_env.h, comm/rendezvous.h): the ranks meet at
//     MASTER_ADDR:MASTER_PORT, rank 0 publishes the NCCL unique id in that
//     store, and each rank's device is its LOCAL_RANK. NCCL's sockets bind
//     where the other hosts reach them: NCCL_SOCKET_IFNAME if set (checked
//     against this host's interfaces with NCCL's rules: UsageError naming
//     the variable), else this process sets it to the interface that routes
//     to MASTER_ADDR (Note [Binding where the other hosts can reach] in
//     comm/net_interface.h); each rank logs its choice once. Works across
//     hosts without a shared file system.
//   - the constructor: rank 0 creates the id and writes it to `id_path`
//     (atomically); the other ranks wait for that file (one host, or a
//     shared file system).
//
// Errors: every CUDA or NCCL failure (no device, a peer gone) raises
// CommError naming the call and NCCL's or CUDA's message. Every host-side
// wait is bounded by `timeout` (Note [Bounded NCCL waits] in
// nccl_communicator.cc): the id, the communicator's initialization (NCCL's
// non-blocking mode, aborted at the timeout) and every collective whose
// result the host waits for (a host buffer). A collective whose output
// stays on the device is not waited for by the host; a peer that stopped
// is found at the next host-side wait on this communicator's stream (the
// engine makes one every step: its agreements and norms are host buffers).
// From from_environment(), a timeout or a failure also names the peers
// that do not answer a probe (comm/peer_probe.h).
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
  // How long the rendezvous, the initialization and each host-side wait
  // may take before CommError.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int world_size, const NcclOptions& options);
  // One rank per process, on one host or several, from torchrun's
  // variables (above); options.device and options.id_path are not used (the
  // device is LOCAL_RANK). UsageError naming a missing or malformed
  // variable (NCCL_SOCKET_IFNAME and MASTER_ADDR included); CommError
  // naming the store, the ranks missing or the peers that do not answer
  // when the rendezvous or the initialization does not complete within
  // options.timeout.
  static std::unique_ptr<NcclCommunicator> from_environment(
      const NcclOptions& options = NcclOptions());
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
  NcclCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size);
  std::unique_ptr<Impl> impl_;
  int rank_;
  int world_size_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_NCCL_COMMUNICATOR_H_
