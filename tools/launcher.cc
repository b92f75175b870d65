#include "tools/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>

#include "common/errors.h"
#include "tools/node_link.h"

namespace zerostep {
namespace {

// Set by SIGINT/SIGTERM/SIGHUP sent to the launcher, which forwards it: the
// children run in process groups of their own and would not get a
// terminal's Ctrl-C.
volatile sig_atomic_t interrupted = 0;
void on_signal(int sig) { interrupted = sig; }

// Whether 127.0.0.1:port can be bound now (without SO_REUSEADDR, so a port
// with connections in TIME_WAIT counts as taken too).
bool can_bind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// A port the kernel hands out itself (bind to port 0), as a last resort.
int kernel_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw IoError(std::string("socket(): ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string err = std::strerror(errno);
    close(fd);
    throw IoError("cannot find a free port on 127.0.0.1: " + err);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

EphemeralPorts ephemeral_ports() {
  EphemeralPorts range;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int low = 0, high = 0;
    if (std::fscanf(f, "%d %d", &low, &high) == 2 && 0 < low && low <= high &&
        high <= 65535)
      range = {low, high};
    std::fclose(f);
  }
  return range;
}

int pick_master_port() {
  const EphemeralPorts eph = ephemeral_ports();
  const int low = 10000, high = eph.low - 1;
  if (high - low >= 1000) {
    std::mt19937 rng(static_cast<uint32_t>(
        std::chrono::steady_clock::now().time_since_epoch().count() ^
        (static_cast<uint64_t>(getpid()) << 16)));
    std::uniform_int_distribution<int> pick(low, high);
    for (int tries = 0; tries < 64; ++tries) {
      const int port = pick(rng);
      if (can_bind(port)) return port;
    }
  }
  return kernel_port();
}

namespace {

struct Child {
  pid_t pid = -1;
  int fd = -1;          // read end of the child's stdout+stderr pipe
  std::string partial;  // an unfinished line
  bool running = true;
};

void emit(FILE* out, int rank, const std::string& line) {
  std::fprintf(out, "[rank %d] %s\n", rank, line.c_str());
  std::fflush(out);
}

// Reads what is available; prints whole lines with the rank prefix.
bool drain(Child& c, int rank, FILE* out) {
  char buf[4096];
  const ssize_t n = read(c.fd, buf, sizeof(buf));
  if (n <= 0) {
    if (!c.partial.empty()) emit(out, rank, c.partial);
    c.partial.clear();
    close(c.fd);
    c.fd = -1;
    return false;
  }
  c.partial.append(buf, static_cast<size_t>(n));
  size_t nl;
  while ((nl = c.partial.find('\n')) != std::string::npos) {
    emit(out, rank, c.partial.substr(0, nl));
    c.partial.erase(0, nl + 1);
  }
  return true;
}

std::string describe_status(int rank, int status) {
  if (WIFEXITED(status))
    return "rank " + std::to_string(rank) + " exited with status " +
           std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "rank " + std::to_string(rank) + " was killed by signal " +
           std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "rank " + std::to_string(rank) + " ended with status " +
         std::to_string(status);
}

}  // namespace

LaunchResult launch(const std::vector<std::string>& argv,
                    const LaunchOptions& options) {
  if (options.nproc < 1)
    throw UsageError("--nproc-per-node=" + std::to_string(options.nproc) +
                     ": must be at least 1");
  if (options.nnodes < 1)
    throw UsageError("--nnodes=" + std::to_string(options.nnodes) +
                     ": must be at least 1");
  if (options.node_rank < 0 || options.node_rank >= options.nnodes)
    throw UsageError("--node-rank=" + std::to_string(options.node_rank) +
                     ": must be 0 to --nnodes - 1 = " +
                     std::to_string(options.nnodes - 1));
  if (options.nnodes > 1 && options.master_addr.empty())
    throw UsageError("--nnodes=" + std::to_string(options.nnodes) +
                     " needs --master-addr: node 0's address as every node "
                     "reaches it (the ranks meet at rank 0's store there, "
                     "the launchers beside it)");
  if (argv.empty()) throw UsageError("no program to launch");
  const int port = options.master_port > 0 ? options.master_port
                   : options.nnodes > 1    ? 29500
                                           : pick_master_port();
  const std::string master_addr =
      options.master_addr.empty() ? "127.0.0.1" : options.master_addr;
  std::unique_ptr<NodeLink> link;
  if (options.nnodes > 1) {
    NodeLinkOptions lo;
    lo.nnodes = options.nnodes;
    lo.node_rank = options.node_rank;
    lo.nproc = options.nproc;
    lo.master_addr = master_addr;
    lo.port = options.launcher_port > 0 ? options.launcher_port : port + 1;
    lo.join_timeout = options.join_timeout;
    lo.node_timeout = options.node_timeout;
    lo.out = options.out;
    link = NodeLink::join(lo);
    std::fprintf(options.out,
                 "launch: node %d of %d joined; starting ranks %d to %d of "
                 "%d\n",
                 options.node_rank, options.nnodes,
                 options.node_rank * options.nproc,
                 (options.node_rank + 1) * options.nproc - 1,
                 options.nnodes * options.nproc);
    std::fflush(options.out);
  }
  const int world = options.nnodes * options.nproc;
  const int first_rank = options.node_rank * options.nproc;
  std::vector<Child> children(options.nproc);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  for (int r = 0; r < options.nproc; ++r) {
    int fds[2];
    if (pipe(fds) != 0)
      throw IoError(std::string("pipe(): ") + std::strerror(errno));
    const pid_t pid = fork();
    if (pid < 0) throw IoError(std::string("fork(): ") + std::strerror(errno));
    if (pid == 0) {
      setpgid(0, 0);
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      const std::string rank = std::to_string(first_rank + r);
      setenv("RANK", rank.c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(options.nproc).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(options.node_rank).c_str(), 1);
      setenv("GROUP_WORLD_SIZE", std::to_string(options.nnodes).c_str(), 1);
      setenv("ROLE_RANK", rank.c_str(), 1);
      setenv("ROLE_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", master_addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      execv(args[0], args.data());
      std::fprintf(stderr, "cannot start %s: %s\n", args[0],
                   std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);
    close(fds[1]);
    children[r].pid = pid;
    children[r].fd = fds[0];
  }

  LaunchResult result;
  int alive = options.nproc;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  struct sigaction old_int {
  }, old_term{}, old_hup{};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  interrupted = 0;
  auto kill_all = [&](int sig) {
    for (const Child& c : children)
      if (c.running) {
        kill(-c.pid, sig);
        // A stopped rank takes SIGTERM only once it runs again.
        if (sig == SIGTERM) kill(-c.pid, SIGCONT);
      }
  };
  using Clock = std::chrono::steady_clock;
  Clock::time_point kill_deadline{};
  Clock::time_point remote_deadline = Clock::time_point::max();
  bool terminating = false;
  bool reported = false;
  std::string local_failure;  // the first rank of this node that failed
  while (alive > 0 || (link && !link->settled())) {
    std::vector<pollfd> pfds;
    std::vector<int> ranks;
    for (int r = 0; r < options.nproc; ++r)
      if (children[r].fd >= 0) {
        pfds.push_back({children[r].fd, POLLIN, 0});
        ranks.push_back(r);
      }
    const size_t child_fds = pfds.size();
    if (link)
      for (int fd : link->fds()) pfds.push_back({fd, POLLIN, 0});
    if (!pfds.empty())
      poll(pfds.data(), pfds.size(), 100);
    else
      usleep(20000);
    for (size_t i = 0; i < child_fds; ++i)
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
        drain(children[ranks[i]], first_rank + ranks[i], options.out);
    for (int r = 0; r < options.nproc; ++r) {
      Child& c = children[r];
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      --alive;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && local_failure.empty())
        local_failure = describe_status(first_rank + r, status);
      if (!ok && result.failed_rank < 0 && result.signal != 0) {
        // Stopping on the launcher's signal: the first rank that did not
        // stop cleanly is the failure.
        result.failed_rank = first_rank + r;
        result.exit_code = 128 + result.signal;
        result.description = "after the launcher got signal " +
                             std::string(strsignal(result.signal)) + ", " +
                             describe_status(first_rank + r, status);
      } else if (!ok && result.failed_rank < 0 && result.failed_node < 0 &&
                 !terminating) {
        result.failed_rank = first_rank + r;
        result.failed_node = options.node_rank;
        result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        result.description = describe_status(first_rank + r, status);
        std::fprintf(options.out, "launch: %s; stopping the other ranks\n",
                     result.description.c_str());
        std::fflush(options.out);
        terminating = true;
        kill_all(SIGTERM);
        kill_deadline = Clock::now() + options.kill_grace;
      }
    }
    if (link) {
      const RemoteFailure f = link->service();
      if (f.node >= 0 && result.failed_node < 0 && result.signal == 0) {
        // A failure elsewhere first (Note [Launchers of several nodes]).
        result.failed_node = f.node;
        result.exit_code = 1;
        result.description = f.host + " failed: " + f.description;
        if (alive > 0) {
          std::fprintf(options.out,
                       "launch: %s; stopping this node's ranks in %.1f s "
                       "unless they end first\n",
                       result.description.c_str(),
                       options.remote_failure_grace.count() / 1000.0);
          remote_deadline = Clock::now() + options.remote_failure_grace;
        } else {
          std::fprintf(options.out, "launch: %s\n",
                       result.description.c_str());
        }
        std::fflush(options.out);
      }
      if (alive > 0 && !terminating && Clock::now() > remote_deadline) {
        terminating = true;
        kill_all(SIGTERM);
        kill_deadline = Clock::now() + options.kill_grace;
      }
      if (alive == 0 && !reported) {
        reported = true;
        link->report(local_failure);
      }
    }
    // A signal while only the other nodes' outcome is awaited ends the
    // wait: this node's ranks have ended and its outcome was reported.
    if (interrupted != 0 && alive == 0 && reported) {
      if (result.exit_code == 0 && link && !link->settled()) {
        result.exit_code = 128 + interrupted;
        result.signal = interrupted;
        result.description = "the launcher got signal " +
                             std::string(strsignal(interrupted)) +
                             " while waiting for the other nodes to end";
      }
      break;
    }
    if (interrupted != 0 && !terminating) {
      result.signal = interrupted;
      std::fprintf(options.out,
                   "launch: got signal %d (%s); forwarding it to every rank\n",
                   result.signal, strsignal(result.signal));
      std::fflush(options.out);
      terminating = true;
      kill_all(result.signal);
      kill_deadline = Clock::now() + options.stop_grace;
      interrupted = 0;  // forwarded; a later signal is a new one
    }
    if (terminating && alive > 0 && Clock::now() > kill_deadline) {
      kill_all(SIGKILL);
      kill_deadline = Clock::time_point::max();
    }
  }
  for (int r = 0; r < options.nproc; ++r)
    while (children[r].fd >= 0)
      drain(children[r], first_rank + r, options.out);
  if (link && result.exit_code == 0 && !link->job_failure().empty()) {
    // Every rank here exited 0, but the job failed elsewhere.
    result.exit_code = 1;
    result.description = link->job_failure();
  }
  if (result.signal != 0 && result.failed_rank < 0 && result.exit_code == 0) {
    result.description = "every rank exited 0 after the launcher got signal " +
                         std::string(strsignal(result.signal));
    std::fprintf(options.out, "launch: %s\n", result.description.c_str());
    std::fflush(options.out);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  return result;
}

}  // namespace zerostep
