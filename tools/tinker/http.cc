#include "tools/tinker/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(s));
}

// The bytes the poller reads from a socket at once.
constexpr size_t kReadChunk = 16 << 10;

// A request head, parsed.
struct Head {
  std::string method, path, query, version;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower
  uint64_t content_length = 0;
  bool has_transfer_encoding = false;
  bool keep_alive = true;
  bool expect_continue = false;
  size_t bytes = 0;  // of the head, final blank line included

  const std::string* header(const std::string& lower_name) const {
    for (const auto& h : headers)
      if (h.first == lower_name) return &h.second;
    return nullptr;
  }
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(
                        static_cast<unsigned char>(c)));
  return s;
}

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes a path; false for a broken escape or a NUL.
bool decode_path(const std::string& in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = hex_value(in[i + 1]), lo = hex_value(in[i + 2]);
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

// Parses the head in text[0, end) (end: just past "\r\n\r\n"). 0 and
// `head` filled, or the HTTP status to answer and `why`.
int parse_head(const std::string& text, size_t end, Head* head,
               std::string* why) {
  head->bytes = end;
  size_t at = 0;
  auto next_line = [&](std::string* line) {
    const size_t eol = text.find("\r\n", at);
    *line = text.substr(at, eol - at);
    at = eol + 2;
  };
  std::string line;
  next_line(&line);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos) {
    *why = "a request line is METHOD TARGET HTTP/1.1";
    return 400;
  }
  head->method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  head->version = line.substr(sp2 + 1);
  if (head->method.empty() ||
      !std::all_of(head->method.begin(), head->method.end(), is_token_char)) {
    *why = "the method is not a token";
    return 400;
  }
  if (head->version != "HTTP/1.1" && head->version != "HTTP/1.0") {
    *why = "only HTTP/1.1 and HTTP/1.0 are served";
    return 505;
  }
  if (target.empty() || target[0] != '/') {
    *why = "the target must be a path starting with '/'";
    return 400;
  }
  const size_t q = target.find('?');
  if (!decode_path(target.substr(0, q), &head->path)) {
    *why = "the path holds a broken %-escape or a NUL";
    return 400;
  }
  if (q != std::string::npos) head->query = target.substr(q + 1);
  head->keep_alive = head->version == "HTTP/1.1";
  bool length_seen = false;
  int lines = 0;
  while (at < end - 2) {
    next_line(&line);
    if (++lines > kMaxHeaderLines) {
      *why = "more than " + std::to_string(kMaxHeaderLines) + " header lines";
      return 431;
    }
    const size_t colon = line.find(':');
    if (colon == 0 || colon == std::string::npos ||
        !std::all_of(line.begin(), line.begin() + colon, is_token_char)) {
      *why = "a header line is Name: value (no folded lines)";
      return 400;
    }
    std::string name = lower(line.substr(0, colon));
    size_t v0 = colon + 1, v1 = line.size();
    while (v0 < v1 && (line[v0] == ' ' || line[v0] == '\t')) ++v0;
    while (v1 > v0 && (line[v1 - 1] == ' ' || line[v1 - 1] == '\t')) --v1;
    std::string value = line.substr(v0, v1 - v0);
    if (name == "content-length") {
      uint64_t n = 0;
      if (value.empty() || value.size() > 19 ||
          !std::all_of(value.begin(), value.end(),
                       [](char c) { return c >= '0' && c <= '9'; })) {
        *why = "Content-Length must be digits";
        return 400;
      }
      n = std::stoull(value);
      if (length_seen && n != head->content_length) {
        *why = "two different Content-Length headers";
        return 400;
      }
      length_seen = true;
      head->content_length = n;
    } else if (name == "transfer-encoding") {
      head->has_transfer_encoding = true;
    } else if (name == "connection") {
      const std::string v = lower(value);
      if (v.find("close") != std::string::npos) head->keep_alive = false;
      if (v.find("keep-alive") != std::string::npos &&
          head->version == "HTTP/1.0")
        head->keep_alive = true;
    } else if (name == "expect") {
      if (lower(value) != "100-continue") {
        *why = "the only Expect served is 100-continue";
        return 417;
      }
      head->expect_continue = true;
    }
    head->headers.emplace_back(std::move(name), std::move(value));
  }
  return 0;
}

const char* reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

// The response's head, and its body unless `head_only` (a HEAD request:
// the same head, no body) or `body_bytes` says the body is sent apart (a
// file).
std::string serialize(const HttpResponse& r, bool keep_alive,
                      bool head_only = false,
                      std::optional<uint64_t> body_bytes = std::nullopt) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " +
                    reason(r.status) + "\r\nContent-Type: " + r.content_type +
                    "\r\nContent-Length: " +
                    std::to_string(body_bytes ? *body_bytes : r.body.size()) +
                    "\r\nConnection: " + (keep_alive ? "keep-alive" : "close") +
                    "\r\n";
  for (const auto& h : r.headers) out += h.first + ": " + h.second + "\r\n";
  out += "\r\n";
  if (!head_only && !body_bytes) out += r.body;
  return out;
}

HttpResponse error_response(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = nlohmann::json({{"error", message}, {"category", "user"}})
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

// One try to send `bytes` without blocking (the poller's small answers:
// a fresh socket's buffer holds them). Whether all went.
bool send_now(int fd, const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Waits until `fd` is ready for `events` or `deadline`; false on timeout
// or error.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - Clock::now())
                          .count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
  }
}

// Sends `n` bytes of the open file `file` from its start by `deadline`
// (sendfile: the kernel copies, nothing is held in memory).
bool send_file(int fd, int file, uint64_t n, Clock::time_point deadline) {
  off_t offset = 0;
  while (static_cast<uint64_t>(offset) < n) {
    const ssize_t sent =
        ::sendfile(fd, file, &offset, static_cast<size_t>(n - offset));
    if (sent > 0) continue;
    if (sent == 0) return false;  // the file shrank
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_ready(fd, POLLOUT, deadline)) return false;
      continue;
    }
    return false;
  }
  return true;
}

// Sends all of `bytes` by `deadline` (the socket is non-blocking).
bool send_all(int fd, const std::string& bytes, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent,
                             MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_ready(fd, POLLOUT, deadline)) return false;
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

struct HttpServer::Impl {
  struct Conn {
    int fd = -1;
    std::string in;            // received, not yet consumed
    Clock::time_point since;   // waiting since (accept, or last response)
    Clock::time_point first_byte;
    bool has_byte = false;     // of the head now arriving
    bool eof = false;          // the client closed its side
    Head head;                 // when handed to a worker
    std::string peer;          // "ip" for the refusal log
    Caller caller;
  };

  Handler handler;
  Options options;

  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::thread poller;
  std::vector<std::thread> workers;
  std::atomic<bool> stopping{false};
  bool started = false;

  // The poller's: connections waiting for a request (no request in
  // progress), by fd. Only the poller thread touches it.
  std::unordered_map<int, std::unique_ptr<Conn>> waiting;
  Clock::time_point accept_paused_until{};
  bool listening = false;  // the listener is in the epoll set

  mutable std::mutex mu;
  std::condition_variable ready_cv;
  std::deque<std::unique_ptr<Conn>> ready;     // GUARDED_BY(mu): to workers
  std::deque<std::unique_ptr<Conn>> returned;  // GUARDED_BY(mu): to poller
  bool poller_done = false;                    // GUARDED_BY(mu)
  int64_t busy = 0;                            // GUARDED_BY(mu)
  HttpStats stats;                             // GUARDED_BY(mu)
  std::unordered_map<std::string, int> per_peer;  // GUARDED_BY(mu): open

  // Refused keys, for the log line at most once a minute (poller only).
  int64_t refused_since_log = 0;
  Clock::time_point last_refusal_log{};
  std::string last_refused_peer;

  void count(int64_t HttpStats::*field, int64_t by = 1) {
    std::lock_guard<std::mutex> lock(mu);
    stats.*field += by;
  }

  void close_conn(std::unique_ptr<Conn> c) {
    if (!c) return;
    ::close(c->fd);
    std::lock_guard<std::mutex> lock(mu);
    --stats.open;
    auto it = per_peer.find(c->peer);
    if (it != per_peer.end() && --it->second == 0) per_peer.erase(it);
  }

  void log(const std::string& line) {
    if (options.log) options.log(line);
  }

  // ---- The poller ----

  void epoll_add(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }

  std::unique_ptr<Conn> take_waiting(int fd) {
    auto it = waiting.find(fd);
    if (it == waiting.end()) return nullptr;
    std::unique_ptr<Conn> c = std::move(it->second);
    waiting.erase(it);
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    return c;
  }

  // Answers on the poller (never blocks) and closes.
  void answer_and_close(std::unique_ptr<Conn> c, const HttpResponse& r) {
    send_now(c->fd, serialize(r, false));
    close_conn(std::move(c));
  }

  // The waiting connection (of `peer`, when given) that has waited
  // longest, or -1.
  int oldest_waiting(const std::string* peer = nullptr) const {
    int fd = -1;
    Clock::time_point t = Clock::time_point::max();
    for (const auto& kv : waiting)
      if (kv.second->since < t && (peer == nullptr || kv.second->peer == *peer)) {
        t = kv.second->since;
        fd = kv.first;
      }
    return fd;
  }

  // Accepts what is pending, at most a quarter of max_connections (and at
  // least 8) at a time.
  void accept_some() {
    const int batch = std::max(8, options.limits.max_connections / 4);
    for (int accepted = 0; accepted < batch; ++accepted) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr),
                               &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: make room, or stop accepting for a moment.
          const int old = oldest_waiting();
          if (old >= 0) {
            count(&HttpStats::evicted);
            close_conn(take_waiting(old));
            continue;
          }
          epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
          listening = false;
          accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
        }
        return;  // EAGAIN, or an error of that one connection
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->since = Clock::now();
      char ip[INET6_ADDRSTRLEN] = "?";
      if (addr.ss_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr,
                  ip, sizeof(ip));
      else if (addr.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr,
                  ip, sizeof(ip));
      c->peer = ip;
      int64_t open = 0;
      int from_peer = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.accepted;
        open = ++stats.open;
        from_peer = ++per_peer[c->peer];
      }
      // Room: the client's own longest-waiting connection at its limit,
      // else anyone's at the server's (Note [Bounded HTTP]).
      const bool client_full =
          from_peer > options.limits.max_connections_per_client;
      if (client_full || open > options.limits.max_connections) {
        const int old = oldest_waiting(client_full ? &c->peer : nullptr);
        if (old >= 0) {
          count(&HttpStats::evicted);
          close_conn(take_waiting(old));
        } else {
          count(&HttpStats::refused_busy);
          HttpResponse r = error_response(
              503,
              client_full
                  ? "this client has " +
                        std::to_string(
                            options.limits.max_connections_per_client) +
                        " connections open, every one with a request in "
                        "progress (the limit, --max-connections-per-client). "
                        "Retry later"
                  : "the server has " +
                        std::to_string(options.limits.max_connections) +
                        " connections open, every one with a request in "
                        "progress (its limit, --max-connections). Retry "
                        "later");
          answer_and_close(std::move(c), r);
          continue;
        }
      }
      const int cfd = c->fd;
      waiting.emplace(cfd, std::move(c));
      epoll_add(cfd);
    }
  }

  // Reads what `c` sent (c.eof at its end). False on an error.
  bool read_some(Conn& c) {
    while (c.in.size() < options.limits.max_header_bytes + kReadChunk) {
      char buf[kReadChunk];
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        if (!c.has_byte) {
          c.has_byte = true;
          c.first_byte = Clock::now();
        }
        c.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        c.eof = true;
        return true;
      }
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    return true;
  }

  void note_refused(const std::string& peer) {
    count(&HttpStats::unauthorized);
    ++refused_since_log;
    last_refused_peer = peer;
    const auto now = Clock::now();
    if (last_refusal_log == Clock::time_point{} ||
        now - last_refusal_log >= std::chrono::seconds(60))
      flush_refusal_log(now);
  }

  void flush_refusal_log(Clock::time_point now) {
    if (refused_since_log == 0) return;
    log("refused " + std::to_string(refused_since_log) +
        (refused_since_log == 1 ? " request" : " requests") +
        " without a valid API key (401) " +
        (last_refusal_log == Clock::time_point{}
             ? std::string("(the first one)")
             : "in the last minute") +
        "; the last from " + last_refused_peer);
    refused_since_log = 0;
    last_refusal_log = now;
  }

  // What the poller does with a waiting connection's bytes: answer
  // healthz, refuse, or hand a whole head to a worker.
  void serve_waiting(int fd) {
    auto it = waiting.find(fd);
    if (it == waiting.end()) return;
    Conn& c = *it->second;
    while (true) {
      // Blank lines between requests are skipped (RFC 9112 2.2).
      size_t skip = 0;
      while (skip + 1 < c.in.size() && c.in[skip] == '\r' &&
             c.in[skip + 1] == '\n')
        skip += 2;
      if (skip > 0) c.in.erase(0, skip);
      if (c.in.empty()) {
        c.has_byte = false;
        return;
      }
      if (!c.has_byte) {  // a pipelined head's start came with the last one
        c.has_byte = true;
        c.first_byte = Clock::now();
      }
      const size_t limit = options.limits.max_header_bytes;
      const size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos || end + 4 > limit) {
        if (c.in.size() >= limit) {
          answer_and_close(take_waiting(fd),
                           error_response(431, "the request head is larger "
                                               "than " +
                                                   std::to_string(limit) +
                                                   " bytes"));
        }
        return;
      }
      Head head;
      std::string why;
      const int status = parse_head(c.in, end + 4, &head, &why);
      if (status != 0) {
        answer_and_close(take_waiting(fd), error_response(status, why));
        return;
      }
      if (head.method == "GET" && head.path == "/api/v1/healthz" &&
          head.content_length == 0 && !head.has_transfer_encoding) {
        HttpResponse ok;
        ok.body = "{\"status\":\"ok\"}";
        c.in.erase(0, head.bytes);
        c.has_byte = false;
        c.since = Clock::now();
        if (!send_now(c.fd, serialize(ok, head.keep_alive)) ||
            !head.keep_alive) {
          close_conn(take_waiting(fd));
          return;
        }
        continue;  // a pipelined request may follow
      }
      // A signed download URL carries its own authority (Note [Signed
      // downloads] in downloads.h): no key, and no body.
      const bool signed_download =
          (head.method == "GET" || head.method == "HEAD") &&
          head.path.rfind("/api/v1/downloads/", 0) == 0 &&
          head.content_length == 0 && !head.has_transfer_encoding;
      if (options.authenticate && !signed_download) {
        const std::string* key = head.header("x-api-key");
        std::optional<Caller> caller;
        if (key != nullptr) caller = options.authenticate(*key);
        if (!caller) {
          note_refused(c.peer);
          HttpResponse r = error_response(
              401, key == nullptr
                       ? "missing API key: this server needs one in the "
                         "X-API-Key header (the SDK sends its api_key= or "
                         "TINKER_API_KEY there)"
                       : "invalid API key (unknown or revoked). Fix: use a "
                         "key from the server's --api-keys file");
          r.headers.emplace_back("WWW-Authenticate", "X-API-Key");
          answer_and_close(take_waiting(fd), r);
          return;
        }
        c.caller = std::move(*caller);
      } else {
        c.caller = options.anonymous;
      }
      c.head = std::move(head);
      std::unique_ptr<Conn> owned = take_waiting(fd);
      {
        std::lock_guard<std::mutex> lock(mu);
        ++busy;
        ready.push_back(std::move(owned));
      }
      ready_cv.notify_one();
      return;
    }
  }

  void sweep(Clock::time_point now) {
    std::vector<int> expired;
    for (const auto& kv : waiting) {
      const Conn& c = *kv.second;
      if (c.has_byte ? now - c.first_byte >=
                           seconds(options.limits.header_timeout_s)
                     : now - c.since >= seconds(options.limits.idle_timeout_s))
        expired.push_back(kv.first);
    }
    for (int fd : expired) {
      std::unique_ptr<Conn> c = take_waiting(fd);
      count(&HttpStats::timed_out);
      if (c->has_byte)
        answer_and_close(std::move(c),
                         error_response(408, "the request head did not "
                                             "arrive within " +
                                                 std::to_string(static_cast<
                                                     int>(options.limits
                                                              .header_timeout_s)) +
                                                 " s (--header-timeout-s)"));
      else
        close_conn(std::move(c));
    }
    if (!listening && now >= accept_paused_until && !stopping) {
      epoll_add(listen_fd);
      listening = true;
    }
    if (refused_since_log > 0 && now - last_refusal_log >= std::chrono::seconds(60))
      flush_refusal_log(now);
  }

  void take_returned() {
    std::deque<std::unique_ptr<Conn>> back;
    {
      std::lock_guard<std::mutex> lock(mu);
      back.swap(returned);
    }
    for (auto& c : back) {
      const int fd = c->fd;
      const bool eof = c->eof;
      waiting.emplace(fd, std::move(c));
      epoll_add(fd);
      serve_waiting(fd);  // a pipelined request may be whole already
      auto it = waiting.find(fd);
      if (eof && it != waiting.end()) close_conn(take_waiting(fd));
    }
  }

  void poll_loop() {
    std::vector<epoll_event> events(256);
    Clock::time_point last_sweep = Clock::now();
    while (!stopping) {
      const int n = epoll_wait(epoll_fd, events.data(),
                               static_cast<int>(events.size()), 100);
      // Connections first, new ones last and a batch at a time: a flood of
      // connections then evicts only the ones that waited longest, never
      // one whose request came in this round (Note [Bounded HTTP]).
      bool accept_now = false;
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == listen_fd) {
          accept_now = true;
        } else if (fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] ssize_t r = ::read(wake_fd, &v, sizeof(v));
          take_returned();
        } else {
          auto it = waiting.find(fd);
          if (it == waiting.end()) continue;
          if (!read_some(*it->second)) {
            close_conn(take_waiting(fd));
            continue;
          }
          // A client may send a request and close its side: it is served.
          serve_waiting(fd);
          it = waiting.find(fd);
          if (it != waiting.end() && it->second->eof)
            close_conn(take_waiting(fd));
        }
      }
      if (accept_now) accept_some();
      const auto now = Clock::now();
      if (now - last_sweep >= std::chrono::milliseconds(50)) {
        sweep(now);
        last_sweep = now;
      }
    }
    // Stopping: no new connection; those without a request close now.
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
    for (auto& kv : waiting) close_conn(std::move(kv.second));
    waiting.clear();
    flush_refusal_log(Clock::now());
    std::deque<std::unique_ptr<Conn>> back;
    {
      std::lock_guard<std::mutex> lock(mu);
      poller_done = true;
      back.swap(returned);
    }
    for (auto& c : back) close_conn(std::move(c));
  }

  // ---- Workers ----

  // Back to the poller for its next request, or closed when stopping.
  void give_back(std::unique_ptr<Conn> c) {
    c->since = Clock::now();
    c->has_byte = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      --busy;
      if (!poller_done && !stopping) {
        returned.push_back(std::move(c));
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t r = ::write(wake_fd, &one, sizeof(one));
        return;
      }
    }
    close_conn(std::move(c));
  }

  void finish(std::unique_ptr<Conn> c) {
    {
      std::lock_guard<std::mutex> lock(mu);
      --busy;
    }
    close_conn(std::move(c));
  }

  void respond_and_close(std::unique_ptr<Conn> c, const HttpResponse& r) {
    send_all(c->fd, serialize(r, false),
             Clock::now() + seconds(options.limits.read_timeout_s));
    finish(std::move(c));
  }

  void serve(std::unique_ptr<Conn> c) {
    const Head& h = c->head;
    const HttpLimits& lim = options.limits;
    if (h.has_transfer_encoding) {
      respond_and_close(std::move(c),
                        error_response(411, "a request body needs a "
                                            "Content-Length (no "
                                            "Transfer-Encoding)"));
      return;
    }
    if (h.content_length > lim.max_body_bytes) {
      respond_and_close(
          std::move(c),
          error_response(413, "the request body of " +
                                  std::to_string(h.content_length) +
                                  " bytes is larger than " +
                                  std::to_string(lim.max_body_bytes) +
                                  " bytes (--max-body-bytes). Nothing was "
                                  "read or changed"));
      return;
    }
    const Clock::time_point deadline =
        Clock::now() + seconds(lim.read_timeout_s);
    const size_t need = h.bytes + static_cast<size_t>(h.content_length);
    if (h.expect_continue && c->in.size() < need &&
        !send_all(c->fd, "HTTP/1.1 100 Continue\r\n\r\n", deadline)) {
      finish(std::move(c));
      return;
    }
    while (c->in.size() < need) {
      char buf[kReadChunk];
      const size_t want = std::min(sizeof(buf), need - c->in.size());
      const ssize_t n = ::recv(c->fd, buf, want, 0);
      if (n > 0) {
        c->in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        finish(std::move(c));
        return;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        finish(std::move(c));
        return;
      }
      if (!wait_ready(c->fd, POLLIN, deadline)) {
        count(&HttpStats::timed_out);
        respond_and_close(
            std::move(c),
            error_response(408, "the request body did not arrive within " +
                                    std::to_string(static_cast<int>(
                                        lim.read_timeout_s)) +
                                    " s of its head (--read-timeout-s). "
                                    "Nothing was changed"));
        return;
      }
    }
    HttpRequest req;
    req.method = h.method;
    req.path = h.path;
    req.query = h.query;
    req.body = c->in.substr(h.bytes, static_cast<size_t>(h.content_length));
    if (const std::string* v = h.header("content-type")) req.content_type = *v;
    if (const std::string* v = h.header("content-encoding"))
      req.content_encoding = *v;
    if (const std::string* v = h.header("accept")) req.accept = *v;
    if (const std::string* v = h.header("host")) req.host = *v;
    req.caller = c->caller;
    c->in.erase(0, need);
    count(&HttpStats::requests);
    HttpResponse out;
    try {
      out = handler(req);
    } catch (const std::exception& e) {
      out.status = 500;
      out.body = nlohmann::json({{"error", "internal error"},
                                 {"category", "server"},
                                 {"detail", e.what()}})
                     .dump(-1, ' ', false,
                           nlohmann::json::error_handler_t::replace);
    }
    req = HttpRequest();  // the body's memory, before a slow write
    const bool keep = h.keep_alive && !stopping;
    const bool head_only = h.method == "HEAD";
    int file = -1;
    std::optional<uint64_t> file_bytes;
    if (!out.body_file.empty()) {
      file = ::open(out.body_file.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (file < 0 || ::fstat(file, &st) != 0) {
        if (file >= 0) ::close(file);
        file = -1;
        out = error_response(404, "the file is gone (deleted or expired)");
      } else {
        file_bytes = static_cast<uint64_t>(st.st_size);
      }
    }
    const Clock::time_point send_deadline =
        Clock::now() + seconds(lim.read_timeout_s);
    bool sent = send_all(c->fd, serialize(out, keep, head_only, file_bytes),
                         send_deadline);
    if (sent && file >= 0 && !head_only)
      sent = send_file(c->fd, file, *file_bytes, send_deadline);
    if (file >= 0) ::close(file);
    if (!sent) {
      count(&HttpStats::timed_out);
      finish(std::move(c));
      return;
    }
    if (keep)
      give_back(std::move(c));
    else
      finish(std::move(c));
  }

  void work_loop() {
    while (true) {
      std::unique_ptr<Conn> c;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready_cv.wait(lock, [&] { return !ready.empty() || stopping; });
        if (ready.empty()) return;  // stopping, nothing left
        c = std::move(ready.front());
        ready.pop_front();
      }
      serve(std::move(c));
    }
  }
};

HttpServer::HttpServer(Handler handler, Options options) : impl_(new Impl) {
  impl_->handler = std::move(handler);
  impl_->options = std::move(options);
  ZS_CHECK(impl_->options.limits.max_connections >= 1);
  ZS_CHECK(impl_->options.limits.workers >= 1);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::start(const std::string& host, int port) {
  ZS_CHECK(!impl_->started);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 ||
      res == nullptr)
    throw IoError("cannot listen on " + host + ":" + service +
                  " (not an address of this machine)");
  int fd = -1;
  std::string why;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                  a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        ::listen(fd, 1024) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    throw IoError("cannot listen on " + host + ":" + service + " (" + why +
                  ": in use, or not an address of this machine)");
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl_->listen_fd = fd;
  impl_->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  impl_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl_->epoll_fd < 0 || impl_->wake_fd < 0)
    throw IoError(std::string("epoll/eventfd: ") + std::strerror(errno));
  impl_->epoll_add(impl_->listen_fd);
  impl_->listening = true;
  impl_->epoll_add(impl_->wake_fd);
  impl_->started = true;
  for (int i = 0; i < impl_->options.limits.workers; ++i)
    impl_->workers.emplace_back([this] { impl_->work_loop(); });
  impl_->poller = std::thread([this] { impl_->poll_loop(); });
  return bound_port;
}

void HttpServer::stop() {
  if (!impl_->started) return;
  impl_->started = false;
  impl_->stopping = true;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t r = ::write(impl_->wake_fd, &one, sizeof(one));
  impl_->poller.join();
  impl_->ready_cv.notify_all();
  for (std::thread& t : impl_->workers) t.join();
  impl_->workers.clear();
  ::close(impl_->listen_fd);
  ::close(impl_->epoll_fd);
  ::close(impl_->wake_fd);
  const HttpStats s = stats();
  impl_->log("HTTP: " + std::to_string(s.accepted) + " connections, " +
             std::to_string(s.requests) + " requests served, " +
             std::to_string(s.unauthorized) + " refused for their key, " +
             std::to_string(s.timed_out) + " timed out, " +
             std::to_string(s.evicted) + " closed at --max-connections, " +
             std::to_string(s.refused_busy) + " answered 503");
}

HttpStats HttpServer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace tinker
}  // namespace zerostep
