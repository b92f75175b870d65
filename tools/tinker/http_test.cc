// HttpServer over real loopback sockets: each limit of Note [Bounded HTTP]
// is crossed and the answer checked. No test asserts a duration: the short
// timeouts here only make the limits cross quickly, and a read that never
// ends is cut by a 60 s socket timeout whose failure says it means a hang.
#include "tools/tinker/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

const std::string kKey = "tml-http-test-0000000000000001";

// A client socket; reads give up after 60 s (a hang, not a slow answer).
class Client {
 public:
  // From 127.0.0.1, or another loopback address (another client).
  explicit Client(int port, const char* from = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    inet_pton(AF_INET, from, &src.sin_addr);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&src), sizeof(src));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{60, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Client() { ::close(fd_); }
  bool connected() const { return connected_; }

  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }

  // One response: {status, body}; status 0 if the connection ended first.
  std::pair<int, std::string> response() {
    while (true) {
      const size_t end = in_.find("\r\n\r\n");
      if (end != std::string::npos) {
        const int status = std::stoi(in_.substr(9, 3));
        size_t length = 0;
        const size_t cl = in_.find("Content-Length: ");
        if (cl != std::string::npos && cl < end)
          length = std::stoul(in_.substr(cl + 16));
        if (in_.size() >= end + 4 + length) {
          std::string body = in_.substr(end + 4, length);
          head_ = in_.substr(0, end);
          in_.erase(0, end + 4 + length);
          return {status, body};
        }
      }
      if (!fill()) return {0, ""};
    }
  }
  const std::string& last_head() const { return head_; }

  // True once the server closed the connection (after any bytes left).
  bool closed_by_server() {
    while (fill()) {
    }
    return eof_;
  }

 private:
  bool fill() {
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      in_.append(buf, static_cast<size_t>(n));
      return true;
    }
    if (n == 0) eof_ = true;
    if (n < 0) ADD_FAILURE() << "no answer within 60 s: the server hangs";
    return false;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string in_, head_;
};

std::string post(const std::string& path, const std::string& body,
                 const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

// A server whose handler echoes what it got; with `gate`, the handler
// waits until released.
class HttpTest : public ::testing::Test {
 protected:
  void start(HttpLimits limits, bool keys = true) {
    HttpServer::Options o;
    o.limits = limits;
    if (keys)
      o.authenticate = [](const std::string& key) -> std::optional<Caller> {
        if (key != kKey) return std::nullopt;
        Caller c;
        c.tenant = "alice";
        return c;
      };
    o.log = [this](const std::string& l) {
      std::lock_guard<std::mutex> lock(mu_);
      log_.push_back(l);
    };
    server_ = std::make_unique<HttpServer>(
        [this](const HttpRequest& r) {
          if (r.path == "/throw") throw std::runtime_error("boom");
          {
            std::unique_lock<std::mutex> lock(mu_);
            ++in_handler_;
            cv_.notify_all();
            cv_.wait(lock, [&] { return !gate_; });
            --in_handler_;
          }
          HttpResponse res;
          res.body = json({{"method", r.method},
                           {"path", r.path},
                           {"query", r.query},
                           {"body", r.body},
                           {"tenant", r.caller.tenant}})
                         .dump();
          return res;
        },
        o);
    port_ = server_->start("127.0.0.1", 0);
  }
  void TearDown() override {
    release();
    if (server_) server_->stop();
  }
  void hold() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_ = true;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    gate_ = false;
    cv_.notify_all();
  }
  void wait_in_handler(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_handler_ >= n; });
  }
  std::string key_header() const { return "X-API-Key: " + kKey + "\r\n"; }

  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool gate_ = false;
  int in_handler_ = 0;
  std::vector<std::string> log_;
};

TEST_F(HttpTest, ServesKeepAliveAndPipelinedRequests) {
  start(HttpLimits());
  Client c(port_);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(post("/api/v1/x%3Ay?limit=2&offset=1", "{\"a\":1}",
                          key_header())));
  auto r = c.response();
  ASSERT_EQ(r.first, 200) << r.second;
  json j = json::parse(r.second);
  EXPECT_EQ(j["path"], "/api/v1/x:y");
  EXPECT_EQ(j["query"], "limit=2&offset=1");
  EXPECT_EQ(j["body"], "{\"a\":1}");
  EXPECT_EQ(j["tenant"], "alice");
  EXPECT_NE(c.last_head().find("Connection: keep-alive"), std::string::npos);
  // Two requests in one write, on the same connection.
  ASSERT_TRUE(c.send(post("/one", "1", key_header()) +
                     post("/two", "22", key_header())));
  EXPECT_EQ(json::parse(c.response().second)["path"], "/one");
  EXPECT_EQ(json::parse(c.response().second)["body"], "22");
  EXPECT_EQ(server_->stats().requests, 3);
}

TEST_F(HttpTest, AMissingOrWrongKeyIs401BeforeTheBodyIsRead) {
  start(HttpLimits());
  for (const std::string& header :
       {std::string(), std::string("X-API-Key: tml-wrong-00000000000000001\r\n")}) {
    Client c(port_);
    // A large body announced and never sent: the answer comes anyway.
    ASSERT_TRUE(c.send("POST /api/v1/create_model HTTP/1.1\r\n" + header +
                       "Content-Length: 1000000\r\n\r\n"));
    auto r = c.response();
    EXPECT_EQ(r.first, 401);
    const json j = json::parse(r.second);
    EXPECT_EQ(j["category"], "user");
    EXPECT_NE(j["error"].get<std::string>().find(
                  header.empty() ? "missing API key" : "invalid API key"),
              std::string::npos)
        << r.second;
    EXPECT_EQ(r.second.find("tml-wrong"), std::string::npos);
    EXPECT_TRUE(c.closed_by_server());
  }
  EXPECT_EQ(server_->stats().unauthorized, 2);
  EXPECT_EQ(server_->stats().requests, 0);
  server_->stop();
  std::lock_guard<std::mutex> lock(mu_);
  std::string log;
  for (const auto& l : log_) log += l + "\n";
  EXPECT_NE(log.find("refused 1 request without a valid API key (401) (the "
                     "first one)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("tml-wrong"), std::string::npos) << log;
}

TEST_F(HttpTest, HealthzNeedsNoKeyNorAWorker) {
  HttpLimits lim;
  lim.workers = 1;
  start(lim);
  hold();
  Client busy(port_);
  ASSERT_TRUE(busy.send(post("/slow", "", key_header())));
  wait_in_handler(1);  // the only worker is taken
  Client c(port_);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.send("GET /api/v1/healthz HTTP/1.1\r\n\r\n"));
    auto r = c.response();
    EXPECT_EQ(r.first, 200);
    EXPECT_EQ(r.second, "{\"status\":\"ok\"}");
  }
  release();
  EXPECT_EQ(busy.response().first, 200);
}

TEST_F(HttpTest, BodiesOverTheLimitAre413WithoutBeingRead) {
  HttpLimits lim;
  lim.max_body_bytes = 1000;
  start(lim);
  Client c(port_);
  ASSERT_TRUE(c.send("POST /x HTTP/1.1\r\n" + key_header() +
                     "Content-Length: 1001\r\n\r\n"));
  auto r = c.response();
  EXPECT_EQ(r.first, 413);
  EXPECT_NE(r.second.find("1001 bytes is larger than 1000 bytes "
                          "(--max-body-bytes)"),
            std::string::npos)
      << r.second;
  EXPECT_TRUE(c.closed_by_server());
  Client ok(port_);
  ASSERT_TRUE(ok.send(post("/x", std::string(1000, 'b'), key_header())));
  EXPECT_EQ(ok.response().first, 200);
}

TEST_F(HttpTest, MalformedAndUnservedHeadsAreRefused) {
  HttpLimits lim;
  lim.max_header_bytes = 2048;
  start(lim);
  const std::vector<std::pair<std::string, int>> cases = {
      {"POST /x HTTP/1.1\r\n" + key_header() +
           "Transfer-Encoding: chunked\r\n\r\n",
       411},
      {"GET /x HTTP/1.1\r\nX-Pad: " + std::string(4000, 'p') + "\r\n\r\n",
       431},
      {"GET x HTTP/1.1\r\n\r\n", 400},
      {"GET /x HTTP/2.0\r\n\r\n", 505},
      {"GET /x%zz HTTP/1.1\r\n\r\n", 400},
      {"GET /x HTTP/1.1\r\n folded\r\n\r\n", 400},
      {"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
       400},
      {"POST /x HTTP/1.1\r\nExpect: magic\r\n\r\n", 417},
  };
  for (const auto& [bytes, status] : cases) {
    Client c(port_);
    ASSERT_TRUE(c.send(bytes));
    auto r = c.response();
    EXPECT_EQ(r.first, status) << bytes.substr(0, 60) << " -> " << r.second;
    EXPECT_TRUE(json::parse(r.second).contains("error"));
    EXPECT_TRUE(c.closed_by_server()) << bytes.substr(0, 60);
  }
  std::string many = "GET /x HTTP/1.1\r\n";
  for (int i = 0; i <= kMaxHeaderLines; ++i) many += "A: b\r\n";
  Client c(port_);
  ASSERT_TRUE(c.send(many + "\r\n"));
  EXPECT_EQ(c.response().first, 431);
}

TEST_F(HttpTest, Expect100ContinueIsAnsweredAfterTheChecks) {
  start(HttpLimits());
  Client c(port_);
  ASSERT_TRUE(c.send("POST /x HTTP/1.1\r\n" + key_header() +
                     "Expect: 100-continue\r\nContent-Length: 3\r\n\r\n"));
  EXPECT_EQ(c.response().first, 100);
  ASSERT_TRUE(c.send("abc"));
  auto r = c.response();
  EXPECT_EQ(r.first, 200);
  EXPECT_EQ(json::parse(r.second)["body"], "abc");
}

TEST_F(HttpTest, SlowHeadsAndBodiesTimeOut) {
  HttpLimits lim;
  lim.header_timeout_s = 0.2;
  lim.read_timeout_s = 0.2;
  lim.idle_timeout_s = 0.2;
  start(lim);
  Client idle(port_);
  EXPECT_TRUE(idle.closed_by_server());  // no byte: closed, no answer
  Client slow_head(port_);
  ASSERT_TRUE(slow_head.send("POST /x HTTP/1.1\r\nHost: "));
  EXPECT_EQ(slow_head.response().first, 408);
  EXPECT_TRUE(slow_head.closed_by_server());
  Client slow_body(port_);
  ASSERT_TRUE(slow_body.send("POST /x HTTP/1.1\r\n" + key_header() +
                             "Content-Length: 100\r\n\r\nonly this"));
  auto r = slow_body.response();
  EXPECT_EQ(r.first, 408);
  EXPECT_NE(r.second.find("--read-timeout-s"), std::string::npos);
  EXPECT_TRUE(slow_body.closed_by_server());
  EXPECT_GE(server_->stats().timed_out, 3);
  EXPECT_EQ(server_->stats().requests, 0);
}

TEST_F(HttpTest, AtTheConnectionLimitTheLongestWaitingOneIsClosed) {
  HttpLimits lim;
  lim.max_connections = 4;
  start(lim);
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<Client>(port_));
    // One byte each, in order, so that the server has accepted each before
    // the next connects.
    ASSERT_TRUE(idle.back()->send("G"));
    while (server_->stats().accepted < i + 1) std::this_thread::yield();
  }
  Client fresh(port_);
  ASSERT_TRUE(fresh.send("GET /api/v1/healthz HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(fresh.response().first, 200);
  EXPECT_TRUE(idle[0]->closed_by_server());  // the oldest made room
  EXPECT_EQ(server_->stats().evicted, 1);
  EXPECT_LE(server_->stats().open, 4);
}

TEST_F(HttpTest, OneClientAtItsLimitClosesItsOwnConnectionsOnly) {
  HttpLimits lim;
  lim.max_connections = 8;
  lim.max_connections_per_client = 2;
  start(lim);
  Client other(port_, "127.0.0.2");
  ASSERT_TRUE(other.send("G"));
  while (server_->stats().accepted < 1) std::this_thread::yield();
  std::vector<std::unique_ptr<Client>> mine;
  for (int i = 0; i < 3; ++i) {
    mine.push_back(std::make_unique<Client>(port_));
    ASSERT_TRUE(mine.back()->send("G"));
    while (server_->stats().accepted < i + 2) std::this_thread::yield();
  }
  EXPECT_TRUE(mine[0]->closed_by_server());  // its own oldest, not `other`
  EXPECT_EQ(server_->stats().evicted, 1);
  ASSERT_TRUE(other.send("ET /api/v1/healthz HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(other.response().first, 200);
}

TEST_F(HttpTest, WhenEveryConnectionIsBusyANewOneGets503) {
  HttpLimits lim;
  lim.max_connections = 2;
  lim.workers = 2;
  start(lim);
  hold();
  Client a(port_), b(port_);
  ASSERT_TRUE(a.send(post("/a", "", key_header())));
  ASSERT_TRUE(b.send(post("/b", "", key_header())));
  wait_in_handler(2);
  Client c(port_);
  auto r = c.response();
  EXPECT_EQ(r.first, 503);
  EXPECT_NE(r.second.find("--max-connections"), std::string::npos);
  release();
  EXPECT_EQ(a.response().first, 200);
  EXPECT_EQ(b.response().first, 200);
  EXPECT_EQ(server_->stats().refused_busy, 1);
}

TEST_F(HttpTest, AHandlerExceptionIsA500WithAJsonBody) {
  start(HttpLimits(), /*keys=*/false);
  Client c(port_);
  ASSERT_TRUE(c.send(post("/throw", "")));
  auto r = c.response();
  EXPECT_EQ(r.first, 500);
  EXPECT_EQ(json::parse(r.second)["detail"], "boom");
  // Without keys every request is the anonymous caller's.
  ASSERT_TRUE(c.send(post("/x", "")));
  EXPECT_EQ(json::parse(c.response().second)["tenant"], "default");
}

TEST_F(HttpTest, StopClosesIdleConnectionsAndFinishesRequestsInProgress) {
  start(HttpLimits());
  Client idle(port_);
  ASSERT_TRUE(idle.send("GET /api/v1/healthz HTTP/1.1\r\n\r\n"));
  EXPECT_EQ(idle.response().first, 200);
  hold();
  Client busy(port_);
  ASSERT_TRUE(busy.send(post("/busy", "", key_header())));
  wait_in_handler(1);
  std::thread stopper([&] { server_->stop(); });
  EXPECT_TRUE(idle.closed_by_server());
  release();
  auto r = busy.response();
  EXPECT_EQ(r.first, 200);
  EXPECT_NE(busy.last_head().find("Connection: close"), std::string::npos);
  stopper.join();
  EXPECT_EQ(server_->stats().open, 0);
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
