// HttpServer: the trainer server's HTTP/1.1 front, built for a port that
// hostile clients can reach. It parses requests itself (request line,
// headers, a Content-Length body) and hands each complete one to a
// handler (Service::handle), so that every byte a client sends is
// bounded by a limit below. Torch-free.
//
// Note [Bounded HTTP]
// ~~~~~~~~~~~~~~~~~~~
// A thread per connection lets idle and slow clients hold every thread
// (cpp-httplib's 64 were held by 64 idle sockets, and a header sent one
// byte every few seconds held one forever). Here one thread, the poller,
// accepts connections and waits (epoll) on every connection that has no
// request in progress; a worker thread is taken only by a request whose
// head (request line and headers) has arrived whole and passed the key
// check. The limits (HttpLimits), and what a client that crosses one sees:
//   - max_connections_per_client open from one address: a client's next
//     connection closes that client's own connection that has waited
//     longest without a request in progress (idle, or a head still
//     arriving), or is answered 503 and closed if all of them are being
//     served. So one address cannot take the server's connections from
//     the others (behind a reverse proxy every client has the proxy's
//     address: limit clients there).
//   - max_connections open at once: at the limit a new connection closes
//     the one that has waited longest without a request in progress, or
//     is answered 503 and closed if every open connection is being
//     served. New connections are accepted a batch at a time, after the
//     bytes of the open ones are read, so that a flood evicts only
//     connections that have waited, never one whose request just came.
//   - idle_timeout_s: a connection with no byte of a request is closed.
//   - header_timeout_s: a head must arrive whole within this of its first
//     byte (408, then close); max_header_bytes (431) and
//     kMaxHeaderLines (431) bound its size.
//   - The key check runs on the poller when the head is whole: without a
//     valid X-API-Key the request is answered 401 and the connection
//     closed, its body never read. GET /api/v1/healthz is answered on the
//     poller too, without a key and without a worker, so it answers while
//     every worker is busy; it tells nothing but that the server serves.
//     A GET (or HEAD) of /api/v1/downloads/... without a body goes to a
//     worker without a key: the URL carries its own signature, which the
//     Service checks before it touches the disk (Note [Signed downloads]
//     in downloads.h); a file is sent with sendfile(), never held in
//     memory, and a HEAD gets the head alone.
//   - max_body_bytes: a larger Content-Length is answered 413 before any
//     byte of the body is read; a body without Content-Length
//     (Transfer-Encoding) is 411. "Expect: 100-continue" is answered only
//     once the key and the size have passed.
//   - read_timeout_s: the body must arrive whole within this of the head
//     (408, then close), and a response must be taken by the client within
//     it too (the connection is closed).
// So the poller holds at most max_connections heads (max_header_bytes
// each, plus one 16 KiB read), the workers at most `workers` bodies of
// max_body_bytes, and a worker is held by a slow client for at most
// read_timeout_s twice. Responses always carry Content-Length; a request
// whose body was not read closes its connection.
//
// Thread safety: start() and stop() from one thread; the handler and the
// authenticator are called from the poller (authenticator) and workers
// (handler) at once. Ownership: the handler's and authenticator's targets
// must outlive the HttpServer.
#ifndef ZEROSTEP_TOOLS_TINKER_HTTP_H_
#define ZEROSTEP_TOOLS_TINKER_HTTP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tools/tinker/service.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

// Note [Bounded HTTP]: each limit, its default and what crossing it does.
struct HttpLimits {
  // Connections open at once (default 256).
  int max_connections = 256;
  // Connections open at once from one client address (default 64).
  int max_connections_per_client = 64;
  // Threads serving requests (default 64: long-polling retrieve_future
  // calls must not starve the requests that would finish them).
  int workers = 64;
  // The largest request body (default 64 MiB; the SDK splits a
  // forward_backward into requests of about 5 MB).
  uint64_t max_body_bytes = 64ULL << 20;
  // The largest request head, request line and headers (default 16 KiB).
  uint64_t max_header_bytes = 16 << 10;
  // Seconds a connection may wait without a byte of a request (default 5).
  double idle_timeout_s = 5.0;
  // Seconds from a head's first byte to its end (default 10).
  double header_timeout_s = 10.0;
  // Seconds for a body to arrive whole after its head, and for a response
  // to be taken (default 60).
  double read_timeout_s = 60.0;
};

// The most header lines in a request head.
inline constexpr int kMaxHeaderLines = 100;

// Counters since start (for tests and the stop log).
struct HttpStats {
  int64_t open = 0;          // connections open now
  int64_t accepted = 0;      // connections accepted
  int64_t evicted = 0;       // closed to make room (either limit)
  int64_t refused_busy = 0;  // answered 503: every connection was busy
  int64_t timed_out = 0;     // closed by idle, header or read timeouts
  int64_t unauthorized = 0;  // answered 401
  int64_t requests = 0;      // handed to the handler
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  // The caller an API key acts for, or nullopt (401).
  using Authenticator =
      std::function<std::optional<Caller>(const std::string& api_key)>;
  struct Options {
    HttpLimits limits;
    // Null: no key is asked for, and every request acts for `anonymous`.
    Authenticator authenticate;
    Caller anonymous;
    // Lines about refused keys (at most one a minute) and, at stop, the
    // counters. Never given a key.
    std::function<void(const std::string&)> log;
  };

  HttpServer(Handler handler, Options options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (port 0: any free port) and serves on threads of its
  // own. Returns the bound port. IoError if it cannot bind.
  int start(const std::string& host, int port);
  // Stops accepting, closes every connection without a request in
  // progress, lets the workers finish the requests they hold (and the
  // heads already passed to them), closes everything and joins. Idempotent.
  void stop();

  HttpStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_HTTP_H_
