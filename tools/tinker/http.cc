#include "tools/tinker/http.h"

#include <httplib.h>

#include "common/errors.h"

namespace zerostep {
namespace tinker {

struct HttpServer::Impl {
  Service* service;
  httplib::Server server;
  std::thread thread;
};

HttpServer::HttpServer(Service* service) : impl_(new Impl) {
  impl_->service = service;
  httplib::Server& s = impl_->server;
  s.new_task_queue = [] { return new httplib::ThreadPool(64); };
  s.set_keep_alive_max_count(100000);
  s.set_tcp_nodelay(true);  // small responses: no Nagle delay
  // An idle keep-alive connection holds an HTTP thread this long, and a
  // stop waits for it: short, so a signal stops the server within seconds
  // (clients reconnect after an idle gap).
  s.set_keep_alive_timeout(5);
  s.set_payload_max_length(256u << 20);
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    HttpRequest r;
    r.method = req.method;
    r.path = req.path;
    r.body = req.body;
    r.content_type = req.get_header_value("Content-Type");
    r.content_encoding = req.get_header_value("Content-Encoding");
    r.accept = req.get_header_value("Accept");
    HttpResponse out;
    try {
      out = impl_->service->handle(r);
    } catch (const std::exception& e) {
      out.status = 500;
      out.body = std::string(
                     "{\"error\": \"internal error\", \"category\": "
                     "\"server\", \"detail\": ") +
                 nlohmann::json(e.what()).dump(
                     -1, ' ', false, nlohmann::json::error_handler_t::replace) +
                 "}";
    }
    res.status = out.status;
    // Error bodies go out uncompressed: the SDK's HTTP client drops
    // Content-Length when it decompresses, and the SDK takes a 400 without
    // Content-Length for a proxy's rejection and reports "Connection error"
    // instead of the message. cpp-httplib compresses only content types it
    // matches exactly, so the charset parameter turns compression off.
    if (out.status >= 400 && out.content_type == "application/json")
      out.content_type = "application/json; charset=utf-8";
    res.set_content(out.body, out.content_type.c_str());
  };
  s.Get(".*", handler);
  s.Post(".*", handler);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::start(const std::string& host, int port) {
  httplib::Server& s = impl_->server;
  int bound = port;
  if (port == 0) {
    bound = s.bind_to_any_port(host.c_str());
  } else if (!s.bind_to_port(host.c_str(), port)) {
    bound = -1;
  }
  if (bound <= 0)
    throw IoError("cannot listen on " + host + ":" + std::to_string(port) +
                  " (in use, or not an address of this machine)");
  impl_->thread = std::thread([this] { impl_->server.listen_after_bind(); });
  return bound;
}

void HttpServer::stop() {
  if (!impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace tinker
}  // namespace zerostep
