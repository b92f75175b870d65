#include "tools/node_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "common/errors.h"

namespace zerostep {
namespace {

using Clock = std::chrono::steady_clock;

std::string this_host() {
  char h[256] = {0};
  if (gethostname(h, sizeof(h) - 1) != 0) return "?";
  return h;
}

std::string peer_address(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf,
              sizeof(buf));
  else
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr, buf,
              sizeof(buf));
  return buf;
}

// One line of a message: no newline inside.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

std::string list(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    out += (i == 0              ? ""
            : i + 1 == v.size() ? " and "
                                : ", ") +
           std::to_string(v[i]);
  return out;
}

void set_nonblocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// Reads what is available into `buf`; false at EOF or error.
bool read_some(int fd, std::string* buf) {
  char tmp[4096];
  for (;;) {
    const ssize_t n = recv(fd, tmp, sizeof(tmp), MSG_DONTWAIT);
    if (n > 0) {
      buf->append(tmp, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
}

// Takes the first whole line out of `buf`.
bool take_line(std::string* buf, std::string* line) {
  const size_t nl = buf->find('\n');
  if (nl == std::string::npos) return false;
  *line = buf->substr(0, nl);
  buf->erase(0, nl + 1);
  return true;
}

int connect_once(const std::string& host, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc =
      getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    hints.ai_family = AF_UNSPEC;
    rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  }
  if (rc != 0) {
    *error = std::string("cannot resolve it: ") + gai_strerror(rc);
    return -1;
  }
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    freeaddrinfo(res);
    return fd;
  }
  *error = std::strerror(errno);
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return -1;
}

}  // namespace

struct NodeLink::Peer {
  enum State { kRunning, kDone, kFailed, kLost };
  int node = -1;
  int fd = -1;
  std::string host, address;
  std::string in;
  Clock::time_point last_heard;
  State state = kRunning;
};

NodeLink::NodeLink(const NodeLinkOptions& options) : options_(options) {}

NodeLink::~NodeLink() {
  for (auto& p : peers_)
    if (p->fd >= 0) close(p->fd);
}

std::unique_ptr<NodeLink> NodeLink::join(const NodeLinkOptions& options) {
  std::unique_ptr<NodeLink> link(new NodeLink(options));
  const auto deadline = Clock::now() + options.join_timeout;
  const std::string secs =
      std::to_string(options.join_timeout.count() / 1000) + " s";
  const std::string host = this_host();
  if (options.node_rank == 0) {
    const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(options.port));
    if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(lfd, 64) != 0) {
      const std::string why = std::strerror(errno);
      if (lfd >= 0) close(lfd);
      throw CommError(
          "node 0 cannot listen for the other nodes' launchers "
          "on port " +
          std::to_string(options.port) + ": " + why +
          ". Fix: choose another --master-port (the launchers "
          "meet at --master-port + 1 unless --launcher-port says "
          "otherwise)");
    }
    std::vector<std::unique_ptr<Peer>> pending;
    std::vector<std::unique_ptr<Peer>> joined(options.nnodes);
    int count = 1;
    auto fail_all = [&](const std::string& why) {
      for (auto& p : pending)
        if (p) link->send(*p, "error " + one_line(why));
      for (auto& p : joined)
        if (p) link->send(*p, "error " + one_line(why));
      close(lfd);
      throw UsageError(why);
    };
    while (count < options.nnodes) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      if (left.count() <= 0) {
        std::vector<int> missing;
        for (int n = 1; n < options.nnodes; ++n)
          if (!joined[n]) missing.push_back(n);
        close(lfd);
        throw CommError(
            "node 0 waited " + secs + " for the launcher" +
            (missing.size() > 1 ? "s of nodes " : " of node ") + list(missing) +
            " of " + std::to_string(options.nnodes) + " to join at port " +
            std::to_string(options.port) +
            ". Fix: start launch on every node with --nnodes=" +
            std::to_string(options.nnodes) +
            ", its own --node-rank, and --master-addr set to this host's "
            "address as the others reach it");
      }
      std::vector<pollfd> p = {{lfd, POLLIN, 0}};
      for (auto& q : pending) p.push_back({q->fd, POLLIN, 0});
      poll(p.data(), p.size(),
           static_cast<int>(std::min<int64_t>(left.count(), 200)));
      if (p[0].revents & POLLIN) {
        const int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          auto q = std::make_unique<Peer>();
          q->fd = fd;
          q->address = peer_address(fd);
          q->last_heard = Clock::now();
          set_nonblocking(fd);
          pending.push_back(std::move(q));
        }
      }
      for (size_t i = 0; i < pending.size();) {
        Peer& q = *pending[i];
        const bool open = read_some(q.fd, &q.in);
        std::string line;
        if (take_line(&q.in, &line)) {
          std::istringstream is(line);
          std::string word;
          int node = -1, nnodes = 0, nproc = 0;
          is >> word >> node >> nnodes >> nproc >> q.host;
          if (word != "hello" || !is) {
            close(q.fd);  // not a launcher: ignore it
            pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
          }
          q.node = node;
          const std::string who = "the launcher on " + q.host + " (" +
                                  q.address +
                                  ") with --node-rank=" + std::to_string(node);
          if (nnodes != options.nnodes)
            fail_all(who + " has --nnodes=" + std::to_string(nnodes) +
                     ", node 0 has --nnodes=" + std::to_string(options.nnodes) +
                     ". Fix: give every node the same --nnodes");
          if (nproc != options.nproc)
            fail_all(who + " has --nproc-per-node=" + std::to_string(nproc) +
                     ", node 0 has " + std::to_string(options.nproc) +
                     ". Fix: give every node the same --nproc-per-node");
          if (node < 1 || node >= options.nnodes || joined[node])
            fail_all(who + ": " +
                     (node < 1 || node >= options.nnodes
                          ? "must be 1 to " +
                                std::to_string(options.nnodes - 1) +
                                " (node 0 is this one)"
                          : "another node (" + joined[node]->host + ", " +
                                joined[node]->address + ") has it already") +
                     ". Fix: give each node its own --node-rank");
          joined[node] = std::move(pending[i]);
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          ++count;
          continue;
        }
        if (!open) {
          close(q.fd);
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
        ++i;
      }
    }
    close(lfd);
    for (auto& p : pending) close(p->fd);
    for (int n = 1; n < options.nnodes; ++n) {
      joined[n]->last_heard = Clock::now();
      link->send(*joined[n], "start " + host);
      link->peers_.push_back(std::move(joined[n]));
    }
  } else {
    std::string error;
    int fd = -1;
    while ((fd = connect_once(options.master_addr, options.port, &error)) < 0) {
      if (Clock::now() > deadline)
        throw CommError(
            "node " + std::to_string(options.node_rank) +
            " could not reach node 0's launcher at " + options.master_addr +
            ":" + std::to_string(options.port) + " within " + secs + " (" +
            error +
            "). Fix: start launch on node 0 with the same --master-addr and "
            "--master-port, and check that this host reaches that address");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    auto q = std::make_unique<Peer>();
    q->node = 0;
    q->fd = fd;
    q->host = "?";
    q->address = peer_address(fd);
    link->send(*q, "hello " + std::to_string(options.node_rank) + " " +
                       std::to_string(options.nnodes) + " " +
                       std::to_string(options.nproc) + " " + host);
    set_nonblocking(fd);
    std::string line;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - Clock::now());
      if (left.count() <= 0)
        throw CommError("node " + std::to_string(options.node_rank) +
                        " joined node 0's launcher at " + options.master_addr +
                        ":" + std::to_string(options.port) +
                        " but the other nodes did not all join within " + secs +
                        " (node 0's launcher names them)");
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
      const bool open = read_some(fd, &q->in);
      if (take_line(&q->in, &line)) {
        if (line.rfind("start ", 0) == 0 || line == "start") {
          std::istringstream is(line);
          std::string word;
          is >> word >> q->host;
          if (q->host.empty()) q->host = "?";
          break;
        }
        if (line.rfind("error ", 0) == 0)
          throw UsageError("node 0's launcher refused this node: " +
                           line.substr(6));
        continue;
      }
      if (!open)
        throw CommError("node 0's launcher at " + options.master_addr + ":" +
                        std::to_string(options.port) +
                        " closed the connection before the job started "
                        "(its own output says why)");
    }
    q->last_heard = Clock::now();
    link->peers_.push_back(std::move(q));
  }
  link->last_ping_ = Clock::now();
  return link;
}

std::vector<int> NodeLink::fds() const {
  std::vector<int> out;
  for (const auto& p : peers_)
    if (p->fd >= 0) out.push_back(p->fd);
  return out;
}

void NodeLink::send(Peer& p, const std::string& line) {
  if (p.fd < 0) return;
  const std::string msg = line + "\n";
  // Small messages into a socket buffer; a peer that stopped reading is
  // found by its silence, not by blocking here.
  [[maybe_unused]] const ssize_t n =
      ::send(p.fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void NodeLink::broadcast(const std::string& line, int except_node) {
  for (auto& p : peers_)
    if (p->node != except_node && p->state != Peer::kLost) send(*p, line);
}

std::string NodeLink::describe_node(int node) const {
  if (node == options_.node_rank)
    return "node " + std::to_string(node) + " (host " + this_host() + ")";
  for (const auto& p : peers_)
    if (p->node == node)
      return "node " + std::to_string(node) + " (host " + p->host + ", " +
             p->address + ")";
  return "node " + std::to_string(node);
}

void NodeLink::first_failure(int node, const std::string& description,
                             RemoteFailure* first) {
  if (failure_known_) return;
  failure_known_ = true;
  job_failure_ = describe_node(node) + ": " + description;
  if (options_.node_rank == 0) {
    std::string host = this_host(), address = "-";
    for (const auto& p : peers_)
      if (p->node == node) host = p->host, address = p->address;
    broadcast("stop " + std::to_string(node) + " " + host + " " + address +
                  " " + one_line(description),
              node);
  }
  if (first != nullptr && node != options_.node_rank) {
    first->node = node;
    first->host = describe_node(node);
    first->description = description;
  }
}

void NodeLink::lose(Peer& p, const std::string& why, RemoteFailure* first) {
  if (p.fd >= 0) close(p.fd);
  p.fd = -1;
  const Peer::State was = p.state;
  p.state = Peer::kLost;
  if (options_.node_rank == 0) {
    if (was == Peer::kRunning)
      first_failure(p.node, "its launcher is gone (" + why + ")", first);
    maybe_end();
    return;
  }
  // Node 0 is gone: nobody will say how the job ended.
  if (!settled_) {
    first_failure(0, "its launcher is gone (" + why + ")", first);
    settled_ = true;
  }
}

void NodeLink::maybe_end() {
  if (options_.node_rank != 0 || settled_ || !reported_) return;
  for (const auto& p : peers_)
    if (p->state == Peer::kRunning) return;
  broadcast(job_failure_.empty() ? "end ok" : "end failed " + job_failure_, -1);
  settled_ = true;
}

RemoteFailure NodeLink::service() {
  RemoteFailure first;
  const auto now = Clock::now();
  for (auto& pp : peers_) {
    Peer& p = *pp;
    if (p.fd < 0) continue;
    const size_t before = p.in.size();
    const bool open = read_some(p.fd, &p.in);
    if (p.in.size() != before) p.last_heard = now;
    std::string line;
    while (take_line(&p.in, &line)) {
      std::istringstream is(line);
      std::string word;
      is >> word;
      if (word == "ping") continue;
      if (options_.node_rank == 0) {
        if (word == "done") {
          p.state = Peer::kDone;
        } else if (word == "fail") {
          p.state = Peer::kFailed;
          first_failure(p.node, line.size() > 5 ? line.substr(5) : "failed",
                        &first);
        }
        maybe_end();
      } else if (word == "stop") {
        int node = -1;
        std::string host, address;
        is >> node >> host >> address;
        std::string description;
        std::getline(is, description);
        if (!description.empty() && description[0] == ' ')
          description.erase(0, 1);
        if (node == 0 && address == "-") address = options_.master_addr;
        if (!failure_known_) {
          failure_known_ = true;
          const std::string who =
              "node " + std::to_string(node) + " (host " + host +
              (address == "-" ? std::string() : ", " + address) + ")";
          job_failure_ = who + ": " + description;
          first.node = node;
          first.host = who;
          first.description = description;
        }
      } else if (word == "end") {
        std::string outcome;
        is >> outcome;
        if (outcome == "failed")
          job_failure_ = line.substr(std::min(line.size(), size_t{11}));
        else
          job_failure_.clear();
        settled_ = true;
      }
    }
    if (!open) {
      if (options_.node_rank != 0 && settled_) {
        close(p.fd);
        p.fd = -1;
      } else if (p.state == Peer::kRunning || options_.node_rank != 0) {
        lose(p, "its connection closed", &first);
      } else {
        close(p.fd);
        p.fd = -1;
      }
      continue;
    }
    if (now - p.last_heard > options_.node_timeout &&
        (p.state == Peer::kRunning || options_.node_rank != 0))
      lose(p,
           "nothing heard for " +
               std::to_string(options_.node_timeout.count() / 1000) +
               " s: its host is down, stopped or cut off",
           &first);
  }
  if (now - last_ping_ >= std::chrono::seconds(1)) {
    last_ping_ = now;
    for (auto& p : peers_)
      if (p->fd >= 0) send(*p, "ping");
  }
  return first;
}

void NodeLink::report(const std::string& failure) {
  if (reported_) return;
  reported_ = true;
  own_failure_ = failure;
  if (options_.node_rank == 0) {
    if (!failure.empty()) first_failure(0, failure, nullptr);
    maybe_end();
    return;
  }
  for (auto& p : peers_)
    send(*p, failure.empty() ? "done" : "fail " + one_line(failure));
}

bool NodeLink::settled() const { return settled_; }

}  // namespace zerostep
