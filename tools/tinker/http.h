// HttpServer: binds a Service to a TCP port with Debian's cpp-httplib.
//
// Thread safety: start()/stop() from one thread; the Service is called from
// the server's worker threads (64 of them, so that many long-polling
// retrieve_future calls never starve the requests that would finish them).
// Ownership: `*service` must outlive the HttpServer.
#ifndef ZEROSTEP_TOOLS_TINKER_HTTP_H_
#define ZEROSTEP_TOOLS_TINKER_HTTP_H_

#include <memory>
#include <string>
#include <thread>

#include "tools/tinker/service.h"

namespace zerostep {
namespace tinker {

class HttpServer {
 public:
  explicit HttpServer(Service* service);
  ~HttpServer();
  // Binds host:port (port 0: any free port) and serves on a background
  // thread. Returns the bound port. IoError if it cannot bind.
  int start(const std::string& host, int port);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_HTTP_H_
