// Rendezvous: how the ranks of a multi-process world (one rank per process,
// on one host or several) find each other, for the gloo and nccl backends.
//
// Every rank connects to a c10d TCPStore at MASTER_ADDR:MASTER_PORT (rank 0
// hosts it, unless torchrun's agent does: comm/torchrun_env.h), starts its
// ProbeListener on the address its transport binds (comm/net_interface.h),
// and publishes there its host name, address, pid and probe port; rank 0
// collects the W entries into one table that every rank reads. Each step
// is bounded by the timeout (Note [Bounding what the libraries do not] in
// comm/bounded_call.h), and a failure is a CommError that names what was
// missing: the store ("rank 0's store at 10.0.0.1:29500 did not answer"),
// or the ranks that did not join ("ranks 2, 3 of 4 did not join").
//
// Note [torchrun's agent store]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torchrun 2.x's agents host the store at MASTER_ADDR:MASTER_PORT
// themselves and tell the workers so (TORCHELASTIC_USE_AGENT_STORE=True);
// every rank then connects as a client, as PyTorch's init_process_group
// does. The store's protocol changed in torch 2 (a validation query first,
// renumbered queries): a zerostep built against Debian's LibTorch 1.13
// cannot talk to it (its connection ends in "Broken pipe", seen with
// torchrun 2.11). The error then says so and gives the way out, run on
// 2026-12-03 with torchrun 2.11 over two network namespaces:
// TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 with --rdzv-backend=c10d makes the
// agents hand the workers a free port of node 0 instead, where rank 0
// hosts a store of its own. A build against torch 2.11 (--config=cuda)
// speaks the agent store's protocol.
//
// After the rendezvous, unanswered_peers() probes every other rank (Note
// [Naming the rank that did not answer] in comm/peer_probe.h): the backends
// add its answer to every CommError.
//
// Thread safety: one Rendezvous per rank, used from one thread at a time;
// the store may be shared with the backend's threads (c10d stores are).
#ifndef ZEROSTEP_COMM_RENDEZVOUS_H_
#define ZEROSTEP_COMM_RENDEZVOUS_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "comm/peer_probe.h"
#include "comm/torchrun_env.h"

namespace zerostep {

struct RendezvousOptions {
  // "gloo" or "nccl": in messages and in the keys, so that both may meet in
  // one store.
  std::string backend = "gloo";
  // The address this rank's transport binds (and its probe listener).
  std::string address;
  // How long each step may wait for the others.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

class Rendezvous {
 public:
  // Meets every rank of `env`'s world. CommError naming the store or the
  // ranks missing after options.timeout; IoError if the probe listener
  // cannot bind options.address.
  Rendezvous(const TorchrunEnv& env, const RendezvousOptions& options);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // A store for the backend's own keys (under this attempt's prefix).
  c10::intrusive_ptr<c10d::Store> store() const;
  // Every rank's entry, rank order, this rank's included.
  const std::vector<ProbeTarget>& peers() const { return peers_; }
  int rank() const { return env_.rank; }
  const TorchrunEnv& env() const { return env_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }

  // Probes every other rank for at most `window`: describe_unanswered's
  // text, or "" if every one answered.
  std::string unanswered_peers(std::chrono::milliseconds window) const;

  // ". Ranks that did not answer a probe: <unanswered_peers>" or ". Every
  // other rank answers a probe (...)": the end of a CommError's message
  // (which, as every CommError's, has no final period).
  std::string diagnosis() const;

  // Where the ranks' transports bind, for a failed connection: "rank 0
  // 10.0.0.1 (host a), rank 1 127.0.0.1 (host b)", with a hint when some
  // bind a loopback address and others do not.
  std::string addresses() const;

 private:
  TorchrunEnv env_;
  RendezvousOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<ProbeListener> listener_;
  std::vector<ProbeTarget> peers_;
};

// How long a failed rank probes its peers (Note [Naming the rank that did
// not answer]): 1 s, or the timeout if shorter.
std::chrono::milliseconds probe_window(std::chrono::milliseconds timeout);

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_RENDEZVOUS_H_
