// The "gloo" Communicator backend: LibTorch's c10d ProcessGroupGloo (TCP
// transport), behind zerostep's Communicator interface.
//
//   GlooCommunicator::from_environment()   one rank per process, on one
//       host or several, configured from torchrun's variables (RANK,
//       WORLD_SIZE, MASTER_ADDR, MASTER_PORT; comm/torchrun_env.h) through
//       a c10d TCPStore (comm/rendezvous.h): for tools/launch, torchrun,
//       mpirun or a cluster scheduler. The transport binds where the other
//       hosts reach it: GLOO_SOCKET_IFNAME, else the interface that routes
//       to MASTER_ADDR (Note [Binding where the other hosts can reach] in
//       comm/net_interface.h); each rank logs its choice once.
//   GlooLocalWorld(W)                      W ranks as threads of this
//       process over loopback TCP, sharing an in-memory store: for tests,
//       the conformance suite and the harness (--backend=gloo).
//
// Semantics as the Communicator contract (comm/communicator.h), with these
// backend facts:
//   - reduce-scatter and all-gather move their data by Gloo's
//     point-to-point send/recv between every pair of ranks (Note [Gloo
//     reduce-scatter and all-gather] in gloo_world.cc: c10d's own are 2-3x
//     slower on the CPU). The reduce-scatter folds in rank order, so its
//     results are sim's bits; it keeps (W-1)/W of its largest input as
//     reusable scratch.
//   - all-reduce is c10d's (Gloo's ring): its float results can differ from
//     sim's in the last bits, never between ranks. kAvg is a sum divided
//     by W.
//   - Every wait is bounded by GlooOptions::timeout: the rendezvous, the
//     connection of the ranks (Note [Bounding what the libraries do not] in
//     comm/bounded_call.h) and every collective. A collective that fails or
//     does not complete (a rank died, stopped or diverged, a host went
//     down) raises CommError on the ranks waiting in it; from_environment's
//     ranks then probe their peers and name those that did not answer
//     (Note [Naming the rank that did not answer] in comm/peer_probe.h),
//     which adds at most 1 s.
//   - reduce_scatter_async, all_gather_async and all_reduce_async return
//     at once; the data moves on Gloo's threads until wait().
//
// The header is free of LibTorch; the implementation is not.
#ifndef ZEROSTEP_COMM_GLOO_WORLD_H_
#define ZEROSTEP_COMM_GLOO_WORLD_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/ledger.h"
#include "comm/local_world.h"

namespace zerostep {

struct GlooOptions {
  // How long the rendezvous, the connection and each collective may wait
  // for the peers before CommError.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // The address the transport binds. "" (default): GlooLocalWorld binds
  // 127.0.0.1, and from_environment follows GLOO_SOCKET_IFNAME or the route
  // to MASTER_ADDR. An address given here wins over both.
  std::string hostname;
};

class GlooCommunicator final : public Communicator {
 public:
  // Reads torchrun's variables (comm/torchrun_env.h); rank 0 hosts the
  // TCPStore unless torchrun's agent does. Throws UsageError naming a
  // missing or malformed variable (GLOO_SOCKET_IFNAME and MASTER_ADDR
  // included), CommError naming the store or the ranks missing if the
  // rendezvous or the connection does not complete within the timeout.
  static std::unique_ptr<GlooCommunicator> from_environment(
      const GlooOptions& options = GlooOptions());
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "gloo"; }
  bool overlaps_async() const override { return true; }
  bool reduce_scatter_accumulates() const override { return true; }
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

  struct Impl;  // the c10d process group

 private:
  friend class GlooLocalWorld;
  GlooCommunicator(std::unique_ptr<Impl> impl, int rank, int world_size);
  std::unique_ptr<Impl> impl_;
  int rank_;
  int world_size_;
};

class GlooLocalWorld final : public LocalWorld {
 public:
  // Connects `world_size` ranks (one thread each, concurrently). Throws
  // UsageError for world_size < 1, CommError if Gloo cannot connect.
  explicit GlooLocalWorld(int world_size,
                          const GlooOptions& options = GlooOptions());
  ~GlooLocalWorld() override;

  int world_size() const override { return world_size_; }
  Communicator& comm(int rank) override;
  const Ledger& ledger(int rank) const override;
  Ledger& mutable_ledger(int rank) override;
  std::vector<std::exception_ptr> run_collect(
      const std::function<void(int rank)>& fn) override;

 private:
  int world_size_;
  std::vector<std::unique_ptr<GlooCommunicator>> raw_;
  std::vector<Ledger> ledgers_;
  std::vector<std::unique_ptr<RecordingCommunicator>> comms_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_GLOO_WORLD_H_
