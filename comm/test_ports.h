// free_loopback_port(): a TCP port of 127.0.0.1 that nothing listens on as
// this returns, for tests that start a store or a rendezvous there. Another
// process may take it before the test does (the window is short; the
// kernel hands ports out in turn). Testonly; header-only.
#ifndef ZEROSTEP_COMM_TEST_PORTS_H_
#define ZEROSTEP_COMM_TEST_PORTS_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace zerostep {

inline int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), len);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_TEST_PORTS_H_
