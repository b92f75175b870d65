// NodeLink: how the launchers of a job's nodes (hosts) tell each other
// that the job started, failed or ended (Note [Launchers of several
// nodes]).
//
// Note [Launchers of several nodes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With --nnodes=N > 1, node 0's launcher listens on the launcher port
// (MASTER_PORT + 1 unless given; rank 0's store takes MASTER_PORT) and every
// other node's launcher connects to it at MASTER_ADDR, retrying until the
// join timeout. Each says who it is ("hello <node> <nnodes> <nproc>
// <host>"); node 0 checks that the nodes agree on --nnodes and
// --nproc-per-node and, once all N joined, says "start": no rank starts
// before every node is there. Then, one text line per message:
//   ping                       every second, both ways; a node not heard of
//                              for the node timeout is lost;
//   fail <description>         a node's job failed (a rank's exit, or a
//                              signal the ranks did not survive);
//   done                       every rank of a node exited 0;
//   stop <node> <host> <addr> <description>   node 0 to every node, at the
//                              first failure anywhere (a node's fail, a
//                              node lost, or node 0's own);
//   end ok | end failed <description>   node 0, once every node has
//                              reported (or is lost): the job's outcome.
// A node that learns of a failure elsewhere (stop, or node 0 lost) gives
// its ranks a grace period to end on their own (in a collective with the
// failed node they do, within their timeout, naming the rank that did not
// answer), then stops them as after a local failure, and exits non-zero
// naming the node, its host and the rank.
//
// Thread safety: one NodeLink per launcher, used from its thread.
#ifndef ZEROSTEP_TOOLS_NODE_LINK_H_
#define ZEROSTEP_TOOLS_NODE_LINK_H_

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace zerostep {

struct NodeLinkOptions {
  int nnodes = 2;
  int node_rank = 0;
  int nproc = 1;            // ranks per node: every node must have the same
  std::string master_addr;  // node 0's address as this node reaches it
  int port = 0;             // node 0's launcher port
  std::chrono::milliseconds join_timeout = std::chrono::seconds(600);
  std::chrono::milliseconds node_timeout = std::chrono::seconds(60);
  FILE* out = stdout;  // progress lines ("launch: ...")
};

// A failure somewhere else, as this node learnt it.
struct RemoteFailure {
  int node = -1;
  std::string host;         // "vm (10.77.0.2)": host name and address
  std::string description;  // "rank 3 exited with status 4"
};

class NodeLink {
 public:
  // Meets every node's launcher (above). Returns once node 0 said "start".
  // Throws CommError naming the nodes that did not join, or node 0's
  // address when it cannot be reached, within the join timeout; UsageError
  // when the nodes disagree (two nodes with one --node-rank, another
  // --nnodes or --nproc-per-node).
  static std::unique_ptr<NodeLink> join(const NodeLinkOptions& options);
  ~NodeLink();

  // The sockets to poll for input (POLLIN).
  std::vector<int> fds() const;
  // Reads what arrived, sends pings, notices lost nodes. Returns the first
  // failure elsewhere that this node had not heard of (node == -1 if none).
  RemoteFailure service();
  // This node's outcome, once its ranks have all ended: "" if every rank
  // exited 0, else what failed.
  void report(const std::string& failure);
  // Whether the job has ended everywhere as far as this node can know:
  // node 0 once every node reported or was lost; another node once node 0
  // said "end" or was lost.
  bool settled() const;
  // The job's outcome as node 0 gave it ("" ok); meaningful once settled.
  const std::string& job_failure() const { return job_failure_; }
  // "node 1 (host vm, 10.77.0.2)".
  std::string describe_node(int node) const;

 private:
  struct Peer;
  explicit NodeLink(const NodeLinkOptions& options);
  void send(Peer& p, const std::string& line);
  void broadcast(const std::string& line, int except_node);
  void lose(Peer& p, const std::string& why, RemoteFailure* first);
  void first_failure(int node, const std::string& description,
                     RemoteFailure* first);
  void maybe_end();

  NodeLinkOptions options_;
  std::vector<std::unique_ptr<Peer>> peers_;  // node 0: one per node; else 1
  std::chrono::steady_clock::time_point last_ping_;
  bool reported_ = false;
  bool failure_known_ = false;  // a failure was announced (node 0) or heard
  bool settled_ = false;
  std::string job_failure_;
  std::string own_failure_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_NODE_LINK_H_
