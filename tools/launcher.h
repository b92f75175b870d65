// Launcher: runs N copies of a program as the ranks of one job on this
// machine, like `torchrun --standalone`, or as this node's share of a job
// over several nodes (hosts), like torchrun's --nnodes / --node-rank.
//
// Each child gets torchrun's variables: RANK (node_rank * nproc + its local
// rank), LOCAL_RANK, WORLD_SIZE (nnodes * nproc), LOCAL_WORLD_SIZE (nproc),
// GROUP_RANK (node_rank), GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE,
// MASTER_ADDR (127.0.0.1 on one node unless given) and MASTER_PORT
// (pick_master_port() on one node unless given; 29500 across nodes), runs
// in its own process group, and has every line of its stdout and stderr
// prefixed with "[rank r] ". The first child to fail (non-zero exit or a
// signal) ends the job: the others get SIGTERM (and SIGCONT, so that a
// stopped rank takes it), then SIGKILL after `kill_grace`, and launch()
// returns a result naming the failing rank.
//
// Across nodes, the launchers meet before any rank starts and tell each
// other of a failure (Note [Launchers of several nodes] in
// tools/node_link.h): when another node fails, this node's ranks get
// `remote_failure_grace` to end on their own, are then stopped as above,
// and launch() fails naming that node, its host and its failure.
// SIGTERM, SIGINT or SIGHUP sent to the launcher is forwarded, as the same
// signal, to every child's process group; the children get `stop_grace` to
// exit before SIGKILL, and the job succeeds if every one of them exits 0
// (a program that stops gracefully on the signal, like trainer_server). No
// child outlives launch().
//
// Thread safety: launch() forks; call it from a single-threaded point of
// the program (as tools/launch does).
#ifndef ZEROSTEP_TOOLS_LAUNCHER_H_
#define ZEROSTEP_TOOLS_LAUNCHER_H_

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace zerostep {

struct LaunchOptions {
  int nproc = 1;        // ranks on this node, >= 1
  int nnodes = 1;       // nodes of the job, >= 1
  int node_rank = 0;    // this node, 0 to nnodes - 1
  // Rank 0's host as this node reaches it ("" = 127.0.0.1; required when
  // nnodes > 1).
  std::string master_addr;
  int master_port = 0;  // 0 = pick a free port (one node) or 29500
  // Where node 0's launcher meets the others (0 = master_port + 1).
  int launcher_port = 0;
  // Across nodes: how long the launchers wait for each other to join
  // (default 600 s, torchrun's join timeout); how long a node may stay
  // silent before it counts as lost (default 60 s); how long this node's
  // ranks may run on after another node failed (default 10 s).
  std::chrono::milliseconds join_timeout = std::chrono::seconds(600);
  std::chrono::milliseconds node_timeout = std::chrono::seconds(60);
  std::chrono::milliseconds remote_failure_grace = std::chrono::seconds(10);
  // After a child failed: how long the others get between SIGTERM and
  // SIGKILL (default 5 s).
  std::chrono::milliseconds kill_grace = std::chrono::seconds(5);
  // After the launcher got a signal and forwarded it: how long the children
  // get to stop gracefully before SIGKILL (default 60 s; a graceful stop
  // may finish queued work).
  std::chrono::milliseconds stop_grace = std::chrono::seconds(60);
  FILE* out = stdout;  // where prefixed output goes
};

struct LaunchResult {
  // 0 if every rank exited 0, also after the launcher forwarded a signal;
  // else the first failure's status (1 for a rank killed by a signal), or
  // 128 + the signal when the launcher got SIGINT, SIGTERM or SIGHUP and
  // some rank then did not exit 0.
  int exit_code = 0;
  int failed_rank = -1;     // the first rank of this node to fail, -1 if none
  // Across nodes: the node whose failure ended the job here (this node
  // when its own rank failed first), -1 if none.
  int failed_node = -1;
  int signal = 0;           // the signal the launcher got and forwarded, or 0
  std::string description;  // e.g. "rank 1 exited with status 3"
};

// The range the kernel draws ports from when a socket binds port 0 or
// connects without binding (/proc/sys/net/ipv4/ip_local_port_range; Linux's
// default when that cannot be read).
struct EphemeralPorts {
  int low = 32768;
  int high = 60999;
};
EphemeralPorts ephemeral_ports();

// The rendezvous port when none is given: a random port of 127.0.0.1 that
// can be bound now, between 10000 and the start of the ephemeral range, so
// that no socket of another job (Gloo's pair connections, a test's server
// on port 0) can be handed it by the kernel between this choice and rank
// 0's store binding it. Only where that band is narrower than 1000 ports, or
// 64 random tries found none free, a port of the kernel's (bind to port 0).
int pick_master_port();

// Runs argv[0] (a path) with argv as its arguments on every rank. Throws
// UsageError for nproc < 1, a node_rank outside the nodes, nnodes > 1
// without master_addr, or an empty argv; IoError if a child cannot be
// started; across nodes, CommError or UsageError when the launchers cannot
// meet (NodeLink::join).
LaunchResult launch(const std::vector<std::string>& argv,
                    const LaunchOptions& options);

}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_LAUNCHER_H_
