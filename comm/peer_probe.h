// Peer probes: after a collective failed or timed out, which of the other
// ranks is alive, gone, stopped or unreachable (Note [Naming the rank that
// did not answer]).
//
// Note [Naming the rank that did not answer]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Gloo collective that fails says which socket failed, and one that times
// out says nothing of who is missing: in a ring, rank 0 waits for rank 3,
// which waits for the rank that stopped. So each rank of a multi-process
// world runs a ProbeListener, a thread that answers every connection with
// the rank's identity at once, on the address its transport binds; the
// rendezvous publishes each rank's listener. When a collective fails, the
// rank probes every peer for a short window, in parallel, and the CommError
// lists the peers that did not answer and how:
//   gone          the connection was refused or closed: the process died
//                 (kill -9, a crash, its own exit), its host is up;
//   not answering the host accepted the connection but the process did not
//                 answer: stopped (SIGSTOP), hung or swapping;
//   unreachable   no connection within the window: the host is down, or
//                 the network between the hosts.
// A peer that answers is alive; if every peer answers, the failure was
// another rank's error or a mismatch (its own message says which).
// A peer that binds a loopback address in another network stack (another
// host, or another network namespace: network_id()) is unreachable without
// a probe: the probe would reach this host's own loopback, where nothing of
// that rank listens, and read as "gone" (issue 42's ranks all bound
// 127.0.0.1 on two hosts).
//
// Thread safety: a ProbeListener is used from the thread that owns it; its
// own thread only answers. probe() is reentrant.
#ifndef ZEROSTEP_COMM_PEER_PROBE_H_
#define ZEROSTEP_COMM_PEER_PROBE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace zerostep {

class ProbeListener {
 public:
  // Listens on `address` (numeric IPv4 or IPv6) at a port of the kernel's
  // choice and answers each connection with `identity` (8 bytes). IoError
  // if the address cannot be bound.
  ProbeListener(const std::string& address, uint64_t identity);
  // Stops answering and joins the thread.
  ~ProbeListener();
  ProbeListener(const ProbeListener&) = delete;
  ProbeListener& operator=(const ProbeListener&) = delete;

  int port() const { return port_; }

 private:
  void serve();
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};
  int port_ = 0;
  uint64_t identity_;
  std::thread thread_;
};

// A peer's listener, as the rendezvous published it.
struct ProbeTarget {
  int rank = -1;
  std::string host;     // its host name, for messages
  std::string address;  // where its listener (and transport) binds
  int port = 0;
  uint64_t identity = 0;
  int pid = 0;
  std::string network;  // its network_id(): where its loopback is
};

enum class ProbeOutcome { kAnswered, kGone, kNotAnswering, kUnreachable };

struct ProbeReply {
  ProbeTarget target;
  ProbeOutcome outcome = ProbeOutcome::kUnreachable;
  std::string detail;  // e.g. "connection refused"
};

// Connects to every target at once and waits at most `window` for their
// answers. One reply per target, in the targets' order.
std::vector<ProbeReply> probe(const std::vector<ProbeTarget>& targets,
                              std::chrono::milliseconds window);

// probe() from a rank whose network_id() is `network`: a target that binds
// a loopback address and whose network differs is kUnreachable without a
// probe (Note [Naming the rank that did not answer]); the others are
// probed. One reply per target, in the targets' order.
std::vector<ProbeReply> probe_from(const std::string& network,
                                   const std::vector<ProbeTarget>& targets,
                                   std::chrono::milliseconds window);

// The network stack this process runs in: the kernel's boot id and the
// network namespace ("<boot id>/net:[4026531840]"). Two processes reach
// each other's loopback addresses exactly when theirs are equal. The host
// name where /proc does not tell.
std::string network_id();

// "rank 2 (host b, 10.77.0.2, pid 77): gone (connection refused); rank 3
// (...): not answering (...)"; "" if every target answered.
std::string describe_unanswered(const std::vector<ProbeReply>& replies);

// "rank 2 (host b, 10.77.0.2, pid 77)".
std::string describe_peer(const ProbeTarget& t);

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_PEER_PROBE_H_
