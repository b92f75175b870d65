#include "comm/peer_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

#include "comm/net_interface.h"
#include "common/errors.h"

namespace zerostep {
namespace {

// Fills `out` for a numeric address and port; false if not an address.
bool socket_address(const std::string& address, int port, sockaddr_storage* out,
                    socklen_t* len) {
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

}  // namespace

ProbeListener::ProbeListener(const std::string& address, uint64_t identity)
    : identity_(identity) {
  sockaddr_storage sa{};
  socklen_t len = 0;
  if (!socket_address(address, 0, &sa, &len))
    throw IoError("peer probe: '" + address + "' is not a numeric address");
  listen_fd_ = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 ||
      bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      listen(listen_fd_, 128) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0 ||
      pipe2(wake_fds_, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    if (listen_fd_ >= 0) close(listen_fd_);
    throw IoError("peer probe: cannot listen on " + address + ": " + why);
  }
  port_ = ntohs(sa.ss_family == AF_INET
                    ? reinterpret_cast<sockaddr_in*>(&sa)->sin_port
                    : reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port);
  thread_ = std::thread([this] { serve(); });
}

ProbeListener::~ProbeListener() {
  const char quit = 'q';
  [[maybe_unused]] const ssize_t n = write(wake_fds_[1], &quit, 1);
  thread_.join();
  close(listen_fd_);
  close(wake_fds_[0]);
  close(wake_fds_[1]);
}

void ProbeListener::serve() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    // 8 bytes into an empty socket buffer: never blocks.
    [[maybe_unused]] const ssize_t n =
        send(fd, &identity_, sizeof(identity_), MSG_NOSIGNAL);
    close(fd);
  }
}

std::vector<ProbeReply> probe(const std::vector<ProbeTarget>& targets,
                              std::chrono::milliseconds window) {
  const auto deadline = std::chrono::steady_clock::now() + window;
  const size_t n = targets.size();
  std::vector<ProbeReply> out(n);
  std::vector<int> fds(n, -1);
  std::vector<bool> connected(n, false), done(n, false);
  std::vector<std::string> got(n);
  auto finish = [&](size_t i, ProbeOutcome o, const std::string& detail) {
    out[i].outcome = o;
    out[i].detail = detail;
    done[i] = true;
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  };
  for (size_t i = 0; i < n; ++i) {
    out[i].target = targets[i];
    sockaddr_storage sa{};
    socklen_t len = 0;
    if (!socket_address(targets[i].address, targets[i].port, &sa, &len)) {
      finish(i, ProbeOutcome::kUnreachable,
             "'" + targets[i].address + "' is not an address");
      continue;
    }
    fds[i] =
        socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fds[i] < 0) {
      finish(i, ProbeOutcome::kUnreachable,
             std::string("socket(): ") + std::strerror(errno));
      continue;
    }
    if (connect(fds[i], reinterpret_cast<sockaddr*>(&sa), len) == 0) {
      connected[i] = true;
    } else if (errno != EINPROGRESS) {
      const int e = errno;
      finish(
          i,
          e == ECONNREFUSED ? ProbeOutcome::kGone : ProbeOutcome::kUnreachable,
          std::strerror(e));
    }
  }
  for (;;) {
    std::vector<pollfd> p;
    std::vector<size_t> which;
    for (size_t i = 0; i < n; ++i)
      if (!done[i]) {
        p.push_back(
            {fds[i], static_cast<short>(connected[i] ? POLLIN : POLLOUT), 0});
        which.push_back(i);
      }
    if (p.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const int rc = poll(p.data(), p.size(), static_cast<int>(left.count()));
    if (rc < 0 && errno != EINTR) break;
    for (size_t k = 0; k < p.size(); ++k) {
      const size_t i = which[k];
      if (p[k].revents == 0) continue;
      if (!connected[i]) {
        int err = 0;
        socklen_t el = sizeof(err);
        getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &el);
        if (err == 0) {
          connected[i] = true;
        } else {
          finish(i,
                 err == ECONNREFUSED ? ProbeOutcome::kGone
                                     : ProbeOutcome::kUnreachable,
                 std::strerror(err));
        }
        continue;
      }
      char buf[sizeof(uint64_t)];
      const ssize_t r = recv(fds[i], buf, sizeof(buf), 0);
      if (r > 0) {
        got[i].append(buf, static_cast<size_t>(r));
        if (got[i].size() < sizeof(uint64_t)) continue;
        uint64_t id = 0;
        std::memcpy(&id, got[i].data(), sizeof(id));
        if (id == targets[i].identity)
          finish(i, ProbeOutcome::kAnswered, "");
        else
          finish(i, ProbeOutcome::kGone,
                 "another process answers on its probe port");
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        finish(i, ProbeOutcome::kGone,
               r == 0 ? "connection closed without an answer"
                      : std::strerror(errno));
      }
    }
  }
  const std::string ms = std::to_string(window.count()) + " ms";
  for (size_t i = 0; i < n; ++i)
    if (!done[i])
      finish(i,
             connected[i] ? ProbeOutcome::kNotAnswering
                          : ProbeOutcome::kUnreachable,
             connected[i] ? "its host accepted the connection but the process "
                            "did not answer within " +
                                ms + ": stopped (SIGSTOP), hung or overloaded"
                          : "no connection within " + ms +
                                ": its host is down or the network between "
                                "the hosts is");
  return out;
}

std::vector<ProbeReply> probe_from(const std::string& network,
                                   const std::vector<ProbeTarget>& targets,
                                   std::chrono::milliseconds window) {
  std::vector<ProbeReply> out(targets.size());
  std::vector<ProbeTarget> reachable;
  std::vector<size_t> at;
  for (size_t i = 0; i < targets.size(); ++i) {
    const ProbeTarget& t = targets[i];
    if (is_loopback_address(t.address) && t.network != network) {
      out[i] = {t, ProbeOutcome::kUnreachable,
                "it binds a loopback address on another host (or network "
                "namespace), which no other host reaches"};
      continue;
    }
    reachable.push_back(t);
    at.push_back(i);
  }
  const std::vector<ProbeReply> replies = probe(reachable, window);
  for (size_t k = 0; k < replies.size(); ++k) out[at[k]] = replies[k];
  return out;
}

std::string network_id() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  char ns[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/ns/net", ns, sizeof(ns) - 1);
  if (boot.empty() || n <= 0) {
    char h[256] = {0};
    gethostname(h, sizeof(h) - 1);
    return std::string("host:") + h;
  }
  return boot + "/" + std::string(ns, static_cast<size_t>(n));
}

std::string describe_peer(const ProbeTarget& t) {
  return "rank " + std::to_string(t.rank) + " (host " + t.host + ", " +
         t.address + ", pid " + std::to_string(t.pid) + ")";
}

std::string describe_unanswered(const std::vector<ProbeReply>& replies) {
  std::string out;
  for (const ProbeReply& r : replies) {
    if (r.outcome == ProbeOutcome::kAnswered) continue;
    if (!out.empty()) out += "; ";
    out += describe_peer(r.target) + ": ";
    switch (r.outcome) {
      case ProbeOutcome::kGone:
        out += "gone";
        break;
      case ProbeOutcome::kNotAnswering:
        out += "not answering";
        break;
      case ProbeOutcome::kUnreachable:
        out += "unreachable";
        break;
      case ProbeOutcome::kAnswered:
        break;
    }
    if (!r.detail.empty()) out += " (" + r.detail + ")";
  }
  return out;
}

}  // namespace zerostep
