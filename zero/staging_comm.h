// StagingCommunicator: lets a host-memory backend (sim, gloo) carry the
// device buffers of an engine on a device (Note [Device kernels] in
// zero/kernels.h).
//
// Every collective whose buffers are marked `device` is run on host copies:
// the inputs are downloaded through the Kernels, the wrapped communicator
// runs the collective on them, and the outputs are uploaded back. Host
// buffers pass straight through. The wrapped backend's reduction is
// unchanged, so the results are its bits (the simulator's fixed rank order
// stays deterministic with ranks on a device). Cost: a host round trip and
// a device wait per collective; reduce_scatter_async waits for the device
// when it is issued and uploads in wait(). A backend that reads device
// memory itself (NCCL) needs no wrapper.
//
// Ownership: `inner` and `kernels` must outlive the wrapper.
// Thread safety: none; one per rank, like the communicator it wraps.
#ifndef ZEROSTEP_ZERO_STAGING_COMM_H_
#define ZEROSTEP_ZERO_STAGING_COMM_H_

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "zero/kernels.h"

namespace zerostep {

class StagingCommunicator final : public Communicator {
 public:
  StagingCommunicator(Communicator* inner, Kernels* kernels);

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return inner_->backend_name(); }

  void all_reduce(Buffer buf, const AllReduceOptions& opts) override;
  void reduce_scatter(Buffer input, Buffer output,
                      const ReduceScatterOptions& opts) override;
  void all_gather(Buffer input, Buffer output,
                  const AllGatherOptions& opts) override;
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) override;
  std::shared_ptr<Work> all_reduce_async(Buffer buf,
                                         const AllReduceOptions& opts) override;
  void broadcast(Buffer buf, const BroadcastOptions& opts) override;
  void barrier() override { inner_->barrier(); }

 private:
  // A host copy of `b` (downloaded when `read`), in one of the reusable
  // staging vectors; host buffers are returned as they are.
  Buffer stage(Buffer b, std::vector<float>* host, bool read);
  // Writes a staged output back to `device`.
  void unstage(Buffer device, Buffer host);

  Communicator* inner_;
  Kernels* k_;
  std::vector<float> in_, out_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGING_COMM_H_
