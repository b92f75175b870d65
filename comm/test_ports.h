// free_loopback_port(): a TCP port of 127.0.0.1 that nothing listens on as
// this returns, for tests that start a store or a rendezvous there. It is
// drawn below the kernel's ephemeral range (ip_local_port_range), so that
// no outgoing connection on the machine can take it as its source port
// between this check and the test's own bind (with a port the kernel hands
// out, one did: EADDRINUSE under a loaded full suite). Another test that
// binds the same port on purpose still can; the draw makes that unlikely.
// Testonly; header-only.
#ifndef ZEROSTEP_COMM_TEST_PORTS_H_
#define ZEROSTEP_COMM_TEST_PORTS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

namespace zerostep {

// Binds 127.0.0.1:port (0: one the kernel picks) and returns the port
// bound, or 0 if it is taken.
inline int bind_loopback_port(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  int got = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    got = ntohs(a.sin_port);
  close(fd);
  return got;
}

inline int free_loopback_port() {
  int low = 32768;  // Linux's default when the range cannot be read
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low;
  if (low > 12000) {
    std::mt19937 draw(std::random_device{}());
    std::uniform_int_distribution<int> below(10000, low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int port = bind_loopback_port(below(draw));
      if (port != 0) return port;
    }
  }
  const int port = bind_loopback_port(0);
  if (port == 0) throw std::runtime_error("free_loopback_port: no free port");
  return port;
}

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_TEST_PORTS_H_
