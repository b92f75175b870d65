#include "tools/tinker/service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/cli.h"
#include "common/errors.h"
#include "config/text.h"
#include "engine/checkpoint_io.h"
#include "tools/tinker/checkpoint_paths.h"
#include "tools/tinker/export_weights.h"
#include "tools/tinker/protocol.h"
#include "tools/tinker/request_fields.h"
#include "tools/tinker/retention.h"
#include "tools/tinker/stability.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

// A message may quote what a client sent (a path, an id) byte for byte;
// bytes that are not UTF-8 become U+FFFD instead of making dump() throw
// (which turned a 404 into a 500).
HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse error_response(int status, const std::string& message) {
  return json_response(status, {{"error", message}, {"category", "user"}});
}

uint64_t hash_of(const std::string& s) { return fnv1a64(s.data(), s.size()); }

// Arrays and objects in a request body may nest at most this deep (a
// Tinker request needs fewer than 10): copying or destroying a parsed value
// recurses, and 100,000 levels overflowed the stack.
constexpr size_t kMaxRequestNesting = 64;

// Parses a JSON object body; nullopt-like: returns false and fills `error`.
bool parse_object(const std::string& body, json* out, HttpResponse* error) {
  const size_t depth = config_text::nesting_depth(body);
  if (depth > kMaxRequestNesting) {
    *error = error_response(400, "the request body nests arrays and objects " +
                                     std::to_string(depth) +
                                     " levels deep; at most " +
                                     std::to_string(kMaxRequestNesting) +
                                     " are accepted. Nothing was changed");
    return false;
  }
  try {
    *out = json::parse(body);
  } catch (const json::exception& e) {
    *error = error_response(400, std::string("the request body is not valid "
                                             "JSON: ") +
                                     e.what());
    return false;
  }
  if (!out->is_object()) {
    *error = error_response(400, "the request body must be a JSON object");
    return false;
  }
  return true;
}

bool get_string(const json& j, const char* key, std::string* out) {
  if (!j.contains(key) || !j[key].is_string()) return false;
  *out = j[key].get<std::string>();
  return true;
}

// The op of a sequenced request this server does not serve: run_rank0
// fails its future in its turn instead of executing it.
const char kUnserved[] = "unserved";

std::string random_instance_id() {
  std::random_device device;
  const uint64_t r =
      (static_cast<uint64_t>(device()) << 32) ^ device() ^
      static_cast<uint64_t>(
          std::chrono::system_clock::now().time_since_epoch().count());
  char buf[13];
  std::snprintf(buf, sizeof(buf), "%012llx",
                static_cast<unsigned long long>(r & 0xffffffffffffULL));
  return buf;
}

std::string unknown_session(const std::string& id) {
  return "unknown session_id '" + elide(id, 200) +
         "'. Fix: create a session first (POST create_session; the SDK's "
         "ServiceClient does) and use the id it returns";
}

std::string not_implemented(const std::string& ep) {
  return ep +
         " is not implemented by this server (it serves training: "
         "create_model, forward_backward, optim_step, save_weights, "
         "load_weights, get_info, save_weights_external; sampling: "
         "save_weights_for_sampler, create_sampling_session, asample; and "
         "the REST client's runs, sessions, checkpoints, TTLs, deletes, "
         "copy_weights, weights_info and external weights URLs). Nothing "
         "was changed";
}

// body[key] as an object of strings (the SDK's user_metadata: other values
// are kept as their JSON text, since the REST types hold strings), or
// null.
json string_map(const json& body, const char* key) {
  if (!body.contains(key) || !body[key].is_object()) return nullptr;
  json out = json::object();
  for (const auto& kv : body[key].items())
    out[kv.key()] = kv.value().is_string() ? kv.value().get<std::string>()
                                           : kv.value().dump();
  return out;
}

}  // namespace

Service::Service(const ServiceOptions& options)
    : options_(options),
      instance_(options.instance_id.empty() ? random_instance_id()
                                            : options.instance_id),
      signer_(options.download_secret.empty()
                  ? DownloadSigner()
                  : DownloadSigner(options.download_secret)) {}

ServiceStats Service::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string Service::new_future(const Caller& caller) {
  const std::string id = "req-" + std::to_string(next_request_++);
  Future& f = futures_[id];
  f.tenant = caller.tenant;
  return id;
}

// Note [One tenant check] (tenancy.h): the Service's lookups.
Service::ModelSeq* Service::resolve_model(const Caller& caller,
                                          const std::string& model_id) {
  auto it = models_.find(model_id);
  if (it == models_.end() || it->second.tenant != caller.tenant)
    return nullptr;
  return &it->second;
}

bool Service::resolve_session(const Caller& caller,
                              const std::string& session_id) {
  return sessions_.owns(caller.tenant, session_id);
}

Service::Future* Service::resolve_future(const Caller& caller,
                                         const std::string& request_id) {
  auto it = futures_.find(request_id);
  if (it == futures_.end() || it->second.tenant != caller.tenant)
    return nullptr;
  return &it->second;
}

bool Service::resolve_sampling_session(const Caller& caller,
                                       const std::string& id) {
  const size_t at = id.rfind(":sample:");
  if (at == std::string::npos) return false;
  const std::string owner = id.substr(0, at);
  return resolve_session(caller, owner) ||
         resolve_model(caller, owner) != nullptr;
}

std::optional<HttpResponse> Service::over_model_quota(const Caller& caller) {
  if (!caller.max_models) return std::nullopt;
  int64_t held = 0;
  for (const auto& kv : models_)
    if (kv.second.tenant == caller.tenant && !kv.second.failed) ++held;
  if (held < *caller.max_models) return std::nullopt;
  HttpResponse r = error_response(
      403, "tenant '" + caller.tenant + "' holds " + std::to_string(held) +
               (held == 1 ? " model" : " models") + ", its quota (max_models=" +
               std::to_string(*caller.max_models) +
               " in the server's --api-keys file, or "
               "--tenant-max-models). Nothing was created. Fix: ask the "
               "server's operator for a larger quota");
  r.headers.emplace_back("x-should-retry", "false");
  return r;
}

void Service::enqueue(const std::string& request_id, Command command) {
  queue_.emplace_back(request_id, std::move(command));
  queue_cv_.notify_all();
}

void Service::fail(const std::string& request_id, const std::string& error) {
  Future& f = futures_.at(request_id);
  f.done = true;
  f.result = CommandResult::failure(error, "user");
  ++stats_.requests_failed;
  done_cv_.notify_all();
}

void Service::expire_gaps() {
  const auto now = Clock::now();
  for (auto& kv : models_) {
    ModelSeq& m = kv.second;
    for (auto it = m.held.begin(); it != m.held.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      std::ostringstream waited;
      waited << options_.seq_gap_timeout_s;
      fail(it->second.request_id,
           "seq_id " + std::to_string(it->first) + " of model '" + kv.first +
               "' waited " + waited.str() + " s for seq_id " +
               std::to_string(m.next) +
               ", which never arrived (a model's requests run in seq_id "
               "order, without gaps). It was not executed; nothing changed");
      // Never executed: its seq_id is free again for a new request.
      m.seen.erase(it->first);
      it = m.held.erase(it);
    }
  }
}

namespace {

// What a path after /api/v1/ names, and the methods it serves.
enum class Route {
  kUnknown,
  kHealthz,            // GET
  kCapabilities,       // GET
  kSampler,            // GET samplers/<id>
  kCheckpoints,        // GET checkpoints
  kRuns,               // GET training_runs
  kRun,                // GET training_runs/<run>
  kRunCheckpoints,     // GET training_runs/<run>/checkpoints
  kCheckpoint,         // DELETE training_runs/<run>/checkpoints/<kind>/<name>
  kCheckpointTtl,      // PUT .../<kind>/<name>/ttl
  kExternalUrls,       // GET .../external_weights/<name>/external_weights_urls
  kSessions,           // GET sessions
  kSession,            // GET sessions/<id>
  kSessionFinish,      // POST sessions/<id>/finish
  kPost,               // every POST endpoint below
};

struct Routed {
  Route route = Route::kUnknown;
  std::string run, kind, name, id;  // path parameters
};

const std::vector<std::string>& post_endpoints() {
  static const std::vector<std::string> kPosts = {
      "client/config", "client/dynamic_config", "telemetry", "create_session",
      "session_heartbeat", "create_model", "load_weights", "get_info",
      "retrieve_future", "create_sampling_session", "asample", "optim_step",
      "save_weights", "save_weights_for_sampler", "save_weights_external",
      "forward_backward", "copy_weights", "weights_info"};
  return kPosts;
}

std::vector<std::string> split_path(const std::string& ep) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t slash = ep.find('/', at);
    out.push_back(ep.substr(at, slash - at));
    if (slash == std::string::npos) return out;
    at = slash + 1;
  }
}

Routed route_of(const std::string& ep) {
  Routed r;
  if (ep == "healthz") r.route = Route::kHealthz;
  if (ep == "get_server_capabilities") r.route = Route::kCapabilities;
  if (ep == "checkpoints") r.route = Route::kCheckpoints;
  if (ep == "training_runs") r.route = Route::kRuns;
  if (ep == "sessions") r.route = Route::kSessions;
  for (const std::string& p : post_endpoints())
    if (ep == p) r.route = Route::kPost;
  if (r.route != Route::kUnknown) return r;
  const std::vector<std::string> p = split_path(ep);
  for (const std::string& part : p)
    if (part.empty()) return r;
  if (p[0] == "samplers" && p.size() == 2) {
    r.route = Route::kSampler;
    r.id = p[1];
  } else if (p[0] == "sessions" && p.size() == 2 && p[1] != "search") {
    r.route = Route::kSession;
    r.id = p[1];
  } else if (p[0] == "sessions" && p.size() == 3 && p[2] == "finish") {
    r.route = Route::kSessionFinish;
    r.id = p[1];
  } else if (p[0] == "training_runs") {
    if (p.size() >= 2) r.run = p[1];
    if (p.size() >= 5) {
      r.kind = p[3];
      r.name = p[4];
    }
    if (p.size() == 2) r.route = Route::kRun;
    if (p.size() == 3 && p[2] == "checkpoints") r.route = Route::kRunCheckpoints;
    if (p.size() >= 5 && p[2] == "checkpoints") {
      if (p.size() == 5) r.route = Route::kCheckpoint;
      if (p.size() == 6 && p[5] == "ttl") r.route = Route::kCheckpointTtl;
      if (p.size() == 6 && p[5] == "external_weights_urls" &&
          p[3] == "external_weights")
        r.route = Route::kExternalUrls;
    }
  }
  return r;
}

// The methods a route serves (405's Allow).
std::string allowed_methods(Route r) {
  switch (r) {
    case Route::kCheckpoint:
      return "DELETE";
    case Route::kCheckpointTtl:
      return "PUT";
    case Route::kPost:
    case Route::kSessionFinish:
      return "POST";
    case Route::kUnknown:
      return "GET, POST";
    default:
      return "GET";
  }
}

HttpResponse not_allowed(const HttpRequest& req, Route r) {
  HttpResponse out = error_response(
      405, "method " + elide(req.method, 40) + " is not served for " +
               elide(req.path, 200) + " (it serves " + allowed_methods(r) +
               ")");
  out.headers.emplace_back("Allow", allowed_methods(r));
  return out;
}

// "?limit=N&offset=M" of a listing: args["limit"], args["offset"] set,
// within [1, max_limit] and >= 0; the 400 answer for a bad value.
std::optional<HttpResponse> read_page(const std::string& what,
                                      const std::string& query,
                                      int64_t max_limit, json* args) {
  size_t at = 0;
  while (at <= query.size()) {
    const size_t amp = std::min(query.find('&', at), query.size());
    const std::string kv = query.substr(at, amp - at);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) {
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      int64_t n = 0;
      if (k == "limit" || k == "offset") {
        if (read_int(v, &n) != NumberText::kOk || n < 0 ||
            (k == "limit" && (n < 1 || n > max_limit)))
          return error_response(400, what + ": " + k + "=" + elide(v, 40) +
                                         " must be an integer, limit in [1, " +
                                         std::to_string(max_limit) +
                                         "], offset >= 0");
        (*args)[k] = n;
      }
    }
    at = amp + 1;
  }
  return std::nullopt;
}

}  // namespace

HttpResponse Service::handle(const HttpRequest& req) {
  const std::string prefix = "/api/v1/";
  if (req.path.rfind(prefix, 0) != 0)
    return error_response(404,
                          "no such endpoint: " + req.method + " " + req.path);
  const std::string ep = req.path.substr(prefix.size());
  if (!req.content_encoding.empty() && req.content_encoding != "identity")
    return error_response(415, "Content-Encoding '" + req.content_encoding +
                                   "' is not accepted (client/config says "
                                   "proto_compress_fwdbwd = false)");
  const bool get = req.method == "GET" || req.method == "HEAD";
  // Signed downloads carry their own authority (Note [Signed downloads]).
  if (ep.rfind(kDownloadsPrefix, 0) == 0) {
    if (!get) {
      HttpResponse out = error_response(
          405, "method " + elide(req.method, 40) + " is not served for " +
                   elide(req.path, 200) + " (it serves GET)");
      out.headers.emplace_back("Allow", "GET");
      return out;
    }
    return download(req, ep);
  }
  const Routed r = route_of(ep);
  if (r.route == Route::kUnknown) {
    if (get) return error_response(404, "no such endpoint: GET " + req.path);
    if (req.method != "POST") return not_allowed(req, r.route);
  } else if (allowed_methods(r.route) == "GET" ? !get
                                               : req.method !=
                                                     allowed_methods(r.route)) {
    return not_allowed(req, r.route);
  }
  switch (r.route) {
    case Route::kHealthz:
      return json_response(200, {{"status", "ok"}});
    case Route::kCapabilities: {
      json models = json::array();
      for (const auto& m : options_.models)
        models.push_back({{"model_name", m.first},
                          {"max_context_length", m.second},
                          {"trainable", true},
                          {"sampleable", true}});
      return json_response(200, {{"supported_models", models}});
    }
    case Route::kSampler: {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!resolve_sampling_session(req.caller, r.id))
          return error_response(400, unknown_sampling_session(r.id));
      }
      return run_now(req.caller, "get_sampler", {{"sampler_id", r.id}});
    }
    case Route::kCheckpoints:
      return list_checkpoints(req.caller, "", req.query);
    case Route::kRunCheckpoints:
      return list_checkpoints(req.caller, r.run, req.query);
    case Route::kRuns:
      return list_training_runs(req.caller, req.query);
    case Route::kRun:
      return get_training_run(req.caller, r.run);
    case Route::kSessions:
      return list_sessions(req.caller, req.query);
    case Route::kSession:
      return get_session(req.caller, r.id);
    case Route::kCheckpoint:
      return run_now(req.caller, "delete_checkpoint",
                     {{"path", "tinker://" + r.run + "/" + r.kind + "/" +
                                   r.name}});
    case Route::kCheckpointTtl: {
      json body;
      HttpResponse bad;
      if (!parse_object(req.body.empty() ? "{}" : req.body, &body, &bad))
        return bad;
      if (!body.contains("ttl_seconds"))
        return error_response(400,
                              "set_checkpoint_ttl: missing field "
                              "'ttl_seconds' (an integer, or null for no "
                              "expiry)");
      return run_now(req.caller, "set_checkpoint_ttl",
                     {{"path", "tinker://" + r.run + "/" + r.kind + "/" +
                                   r.name},
                      {"ttl_seconds", body["ttl_seconds"]}});
    }
    case Route::kExternalUrls:
      return external_weights_urls(
          req, "tinker://" + r.run + "/external_weights/" + r.name);
    case Route::kSessionFinish:
      return json_response(200, json::object());
    default:
      break;
  }

  // POST.
  if (ep == "forward_backward") {
    std::string model_id;
    int32_t seq_id = 0;
    if (!peek_forward_backward(req.body, &model_id, &seq_id))
      return error_response(400,
                            "the forward_backward body is not a valid "
                            "tinker_public.ForwardBackwardRequest "
                            "protobuf (Content-Type: "
                            "application/x-protobuf)");
    Command c;
    c.op = "forward_backward";
    c.blob = req.body;
    return sequenced(req.caller, "forward_backward", model_id, seq_id,
                     req.body, std::move(c));
  }
  json body;
  HttpResponse bad;
  const std::string raw = req.body.empty() ? "{}" : req.body;
  if (!parse_object(raw, &body, &bad)) return bad;
  if (ep == "client/config")
    return json_response(200, {{"pjwt_auth_enabled", false},
                               {"credential_default_source", "api_key"},
                               {"proto_compress_fwdbwd", false},
                               {"parallel_fwdbwd_chunks", true},
                               {"custom_loss_server_side", false},
                               {"sample_use_retrieve_futures", false}});
  if (ep == "client/dynamic_config") return json_response(200, json::object());
  if (ep == "telemetry") return json_response(200, {{"status", "accepted"}});
  if (ep == "create_session") {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string id =
        "session-" + instance_ + "-" + std::to_string(next_session_++);
    sessions_.claim(id, req.caller.tenant);
    SessionInfo& info = session_info_[id];
    info.created = next_session_;
    info.user_metadata = string_map(body, "user_metadata");
    if (body.contains("display_name") && body["display_name"].is_string())
      info.display_name = body["display_name"];
    return json_response(200,
                         {{"type", "create_session"}, {"session_id", id}});
  }
  if (ep == "session_heartbeat")
    return json_response(200, {{"type", "session_heartbeat"}});
  if (ep == "create_model") return create_model(req.caller, raw);
  if (ep == "load_weights") return load_weights(req.caller, raw);
  if (ep == "get_info") return get_info(req.caller, raw);
  if (ep == "retrieve_future")
    return retrieve_future(req.caller, raw, req.accept);
  if (ep == "create_sampling_session") {
    std::string session;
    if (get_string(body, "session_id", &session)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!resolve_session(req.caller, session))
        return error_response(404, unknown_session(session));
    }
    HttpResponse out = run_now(req.caller, "create_sampling_session", body);
    if (out.status == 200) {
      std::lock_guard<std::mutex> lock(mu_);
      const json made = json::parse(out.body);
      auto it = session_info_.find(session);
      if (it != session_info_.end() && made.is_object() &&
          made.contains("sampling_session_id") &&
          made["sampling_session_id"].is_string())
        it->second.sampler_ids.push_back(made["sampling_session_id"]);
    }
    return out;
  }
  if (ep == "asample") return asample(req.caller, raw, body);
  if (ep == "copy_weights") {
    std::string session;
    if (get_string(body, "session_id", &session)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!resolve_session(req.caller, session))
        return error_response(404, unknown_session(session));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      body["new_run"] = "copy-" + instance_ + "-" +
                        std::to_string(next_request_++);
    }
    return run_now(req.caller, "copy_weights", body);
  }
  if (ep == "weights_info") return run_now(req.caller, "weights_info", body);
  if (ep == "optim_step" || ep == "save_weights" ||
      ep == "save_weights_for_sampler" || ep == "save_weights_external") {
    std::string model_id;
    if (!get_string(body, "model_id", &model_id))
      return error_response(400, ep + ": missing string field 'model_id'");
    int64_t seq_id = 0;
    if (!get_int64(body, "seq_id", &seq_id))
      return error_response(400, ep + ": missing integer field 'seq_id' "
                                      "(this server runs a model's requests "
                                      "in seq_id order, from 1)");
    Command c;
    c.op = ep;
    c.args = body;
    return sequenced(req.caller, ep, model_id, seq_id, raw, std::move(c));
  }
  // Not served. A numbered request of a model still consumes its seq_id
  // (else every later request of that client waits for it, then fails).
  std::string model_id;
  int64_t seq_id = 0;
  if (get_string(body, "model_id", &model_id) &&
      get_int64(body, "seq_id", &seq_id)) {
    const std::string message = not_implemented(ep) + "; seq_id " +
                                std::to_string(seq_id) + " of model '" +
                                model_id + "' is consumed";
    return sequenced(req.caller, ep, model_id, seq_id, raw,
                     Command{kUnserved, {{"error", message}}, "", {}});
  }
  return error_response(404, not_implemented("POST /api/v1/" + ep));
}

HttpResponse Service::create_model(const Caller& caller,
                                   const std::string& raw) {
  json body = json::parse(raw);
  std::string session, base;
  if (!get_string(body, "base_model", &base))
    return error_response(400,
                          "create_model: missing string field 'base_model'");
  std::lock_guard<std::mutex> lock(mu_);
  std::string model_id;
  int64_t model_seq_id = 0;
  if (get_string(body, "session_id", &session)) {
    if (!resolve_session(caller, session))
      return error_response(404, unknown_session(session));
    if (!get_int64(body, "model_seq_id", &model_seq_id))
      return error_response(
          400, "create_model: a session_id needs an integer model_seq_id");
    // The id the SDK itself derives for create-via-load.
    model_id = session + ":train:" + std::to_string(model_seq_id);
  } else {
    model_id = "model-" + instance_ + "-" + std::to_string(next_request_);
  }
  const uint64_t h = hash_of(raw);
  auto seen = creates_.find(model_id);
  if (seen != creates_.end()) {
    if (seen->second.first == h)
      return json_response(
          200, {{"request_id", seen->second.second}, {"model_id", model_id}});
    return error_response(409, "model '" + model_id +
                                   "' was already created "
                                   "by a different create_model request");
  }
  if (auto refused = over_model_quota(caller)) return *refused;
  const std::string rid = new_future(caller);
  creates_[model_id] = {h, rid};
  models_[model_id].tenant = caller.tenant;
  body["model_id"] = model_id;
  enqueue(rid, Command{"create_model", body, "", caller});
  return json_response(200, {{"request_id", rid}, {"model_id", model_id}});
}

HttpResponse Service::load_weights(const Caller& caller,
                                   const std::string& raw) {
  json body = json::parse(raw);
  std::string path, model_id, session;
  if (!get_string(body, "path", &path))
    return error_response(400, "load_weights: missing string field 'path'");
  if (get_string(body, "model_id", &model_id)) {
    int64_t seq_id = 0;
    if (!get_int64(body, "seq_id", &seq_id))
      return error_response(400,
                            "load_weights: missing integer field 'seq_id'");
    Command c{"load_weights", body, "", caller};
    return sequenced(caller, "load_weights", model_id, seq_id, raw,
                     std::move(c));
  }
  // Create-via-load: a new model whose first request is this load.
  int64_t model_seq_id = 0;
  if (!get_string(body, "session_id", &session) ||
      !get_int64(body, "model_seq_id", &model_seq_id))
    return error_response(400,
                          "load_weights: give model_id and seq_id, or "
                          "session_id and model_seq_id");
  std::lock_guard<std::mutex> lock(mu_);
  if (!resolve_session(caller, session))
    return error_response(404, unknown_session(session));
  model_id = session + ":train:" + std::to_string(model_seq_id);
  const uint64_t h = hash_of(raw);
  auto seen = creates_.find(model_id);
  if (seen != creates_.end()) {
    if (seen->second.first == h)
      return json_response(
          200, {{"request_id", seen->second.second}, {"model_id", model_id}});
    return error_response(409, "model '" + model_id + "' exists already");
  }
  if (auto refused = over_model_quota(caller)) return *refused;
  const std::string rid = new_future(caller);
  creates_[model_id] = {h, rid};
  models_[model_id].tenant = caller.tenant;
  body["model_id"] = model_id;
  body["create"] = true;
  enqueue(rid, Command{"load_weights", body, "", caller});
  return json_response(200, {{"request_id", rid}, {"model_id", model_id}});
}

HttpResponse Service::sequenced(const Caller& caller, const std::string& op,
                                const std::string& model_id, int64_t seq_id,
                                const std::string& body, Command command) {
  command.caller = caller;
  std::lock_guard<std::mutex> lock(mu_);
  ModelSeq* mp = resolve_model(caller, model_id);
  if (mp == nullptr) {
    // A well-formed request for a model this tenant never created (or
    // another tenant's): a failed future, as for any other bad input.
    const std::string rid = new_future(caller);
    fail(rid,
         op + ": unknown model_id '" + model_id +
             "'. Fix: create_model first (or use the model_id it returned)");
    return json_response(200, {{"request_id", rid}, {"model_id", model_id}});
  }
  ModelSeq& m = *mp;
  if (seq_id < 1)
    return error_response(400, op + ": seq_id " + std::to_string(seq_id) +
                                   " must be >= 1 (a model's requests are "
                                   "numbered from 1)");
  const uint64_t h = hash_of(body);
  auto seen = m.seen.find(seq_id);
  if (seen != m.seen.end()) {
    if (seen->second.first == h)  // a retry: the original future
      return json_response(
          200, {{"request_id", seen->second.second}, {"model_id", model_id}});
    return error_response(409, op + ": seq_id " + std::to_string(seq_id) +
                                   " of model '" + model_id +
                                   "' was already used by a different request");
  }
  const std::string rid = new_future(caller);
  m.seen[seq_id] = {h, rid};
  if (seq_id < m.next) {
    // Only possible for a seq_id whose record was dropped; never reuse it.
    fail(rid, op + ": seq_id " + std::to_string(seq_id) + " is behind model '" +
                  model_id + "', which expects " + std::to_string(m.next));
  } else if (seq_id > m.next + options_.max_seq_ahead) {
    fail(rid,
         op + ": seq_id " + std::to_string(seq_id) + " is more than " +
             std::to_string(options_.max_seq_ahead) + " ahead of seq_id " +
             std::to_string(m.next) + ", which model '" + model_id +
             "' expects next (a gap). It was not executed; nothing changed");
  } else if (seq_id == m.next) {
    enqueue(rid, std::move(command));
    ++m.next;
    for (auto it = m.held.find(m.next); it != m.held.end();
         it = m.held.find(m.next)) {
      enqueue(it->second.request_id, std::move(it->second.command));
      m.held.erase(it);
      ++m.next;
    }
  } else {
    const auto wait = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options_.seq_gap_timeout_s));
    m.held[seq_id] = Held{rid, std::move(command), Clock::now() + wait};
    queue_cv_.notify_all();  // the loop watches the deadline
  }
  return json_response(200, {{"request_id", rid}, {"model_id", model_id}});
}

HttpResponse Service::get_info(const Caller& caller, const std::string& raw) {
  json body = json::parse(raw);
  std::string model_id;
  if (!get_string(body, "model_id", &model_id))
    return error_response(400, "get_info: missing string field 'model_id'");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (resolve_model(caller, model_id) == nullptr)
      return error_response(404,
                            "get_info: unknown model_id '" + model_id + "'");
  }
  return run_now(caller, "get_info", {{"model_id", model_id}});
}

HttpResponse Service::run_now(const Caller& caller, const std::string& op,
                              const json& args) {
  std::unique_lock<std::mutex> lock(mu_);
  const std::string rid = new_future(caller);
  enqueue(rid, Command{op, args, "", caller});
  done_cv_.wait(lock, [&] { return futures_[rid].done || stopping_; });
  Future f = futures_[rid];
  futures_.erase(rid);
  if (!f.done) return error_response(503, "the server is stopping");
  if (!f.result.ok) return error_response(f.result.http_status, f.result.error);
  return json_response(200, f.result.json);
}

HttpResponse Service::list_checkpoints(const Caller& caller,
                                       const std::string& run,
                                       const std::string& query) {
  json args = {{"limit", 100}, {"offset", 0}};
  // ?limit=N&offset=M (the SDK's list_user_checkpoints); others ignored.
  if (auto bad = read_page("checkpoints", query, 1000, &args)) return *bad;
  if (!run.empty()) {
    args["model_id"] = run;
    std::lock_guard<std::mutex> lock(mu_);
    args["live"] = resolve_model(caller, run) != nullptr;
  }
  return run_now(caller, "list_checkpoints", args);
}

std::vector<std::string> Service::live_models(const Caller& caller) const {
  std::vector<std::string> out;
  for (const auto& kv : models_)
    if (kv.second.tenant == caller.tenant && !kv.second.failed)
      out.push_back(kv.first);
  return out;
}

HttpResponse Service::list_training_runs(const Caller& caller,
                                         const std::string& query) {
  json args = {{"limit", 20}, {"offset", 0}};
  if (auto bad = read_page("training_runs", query, 1000, &args)) return *bad;
  {
    std::lock_guard<std::mutex> lock(mu_);
    args["live"] = live_models(caller);
  }
  return run_now(caller, "list_training_runs", args);
}

HttpResponse Service::get_training_run(const Caller& caller,
                                       const std::string& run) {
  json args = {{"model_id", run}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    args["live"] = resolve_model(caller, run) != nullptr &&
                   !models_.at(run).failed;
  }
  return run_now(caller, "get_training_run", args);
}

HttpResponse Service::list_sessions(const Caller& caller,
                                    const std::string& query) {
  json args = {{"limit", 20}, {"offset", 0}};
  if (auto bad = read_page("sessions", query, 1000, &args)) return *bad;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int64_t, std::string>> mine;
  for (const std::string& id : sessions_.ids_of(caller.tenant))
    mine.emplace_back(session_info_[id].created, id);
  std::sort(mine.rbegin(), mine.rend());  // newest first
  json ids = json::array();
  const size_t offset = args["offset"].get<size_t>();
  const size_t limit = args["limit"].get<size_t>();
  for (size_t i = offset; i < mine.size() && i < offset + limit; ++i)
    ids.push_back(mine[i].second);
  return json_response(200, {{"sessions", ids}});
}

HttpResponse Service::get_session(const Caller& caller,
                                  const std::string& session) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!resolve_session(caller, session))
    return error_response(404, "unknown session '" + elide(session, 200) +
                                   "' (one create_session gave)");
  const SessionInfo& info = session_info_[session];
  json runs = json::array();
  for (const std::string& id : live_models(caller))
    if (session_of(id) == session) runs.push_back(id);
  return json_response(200, {{"training_run_ids", runs},
                             {"sampler_ids", info.sampler_ids},
                             {"user_metadata", info.user_metadata},
                             {"display_name", info.display_name}});
}

HttpResponse Service::external_weights_urls(const HttpRequest& req,
                                            const std::string& path) {
  HttpResponse files =
      run_now(req.caller, "external_weights_files", {{"path", path}});
  if (files.status != 200) return files;
  const json f = json::parse(files.body);
  const json listed = f.is_object() ? f.value("files", json::array())
                                    : json::array();
  std::string model_id, name;
  parse_tinker_path_of_kind(path, "external_weights", &model_id, &name);
  DownloadTarget t{req.caller.tenant, model_id, name, "", 0};
  t.expires_unix = unix_now() + kDownloadUrlTtlS;
  if (f.is_object() && f.contains("expires_at") &&
      f["expires_at"].is_number_integer())
    t.expires_unix = std::min(t.expires_unix, f["expires_at"].get<int64_t>());
  const std::string base =
      !options_.public_url.empty()
          ? options_.public_url
          : "http://" + (req.host.empty() ? std::string("127.0.0.1")
                                          : req.host);
  json urls = json::object();
  for (const json& file : listed) {
    if (!file.is_string()) continue;
    t.file = file.get<std::string>();
    urls[t.file] = signer_.url(base, t);
  }
  return json_response(200, {{"urls", urls},
                             {"expires", iso8601(t.expires_unix)}});
}

HttpResponse Service::download(const HttpRequest& req, const std::string& ep) {
  const std::optional<DownloadTarget> t =
      signer_.verify(ep, req.query, unix_now());
  if (!t)
    return error_response(403,
                          "this download URL is not valid: it is malformed, "
                          "altered, expired or from before the server "
                          "restarted. Fix: ask get_external_weights_urls for "
                          "new ones");
  // Note [One tenant check]: the URL's tenant's folder, nothing else.
  const std::optional<CheckpointLocation> at = locate_checkpoint(
      options_.state_dir, t->tenant,
      "tinker://" + t->run + "/external_weights/" + t->name,
      "external_weights");
  const std::string gone = "external weights 'tinker://" + t->run +
                           "/external_weights/" + t->name + "' have no file '" +
                           t->file + "' (deleted or expired)";
  if (options_.state_dir.empty() || !at ||
      !within_dir(options_.state_dir, at->dir))
    return error_response(404, gone);
  json meta;
  try {
    meta = json::parse(read_file(at->dir + "/tinker_meta.json"));
  } catch (const std::exception&) {
    return error_response(404, gone);
  }
  const std::vector<std::string> files = external_weight_files(at->dir);
  if (expired(meta, unix_now()) ||
      std::find(files.begin(), files.end(), t->file) == files.end())
    return error_response(404, gone);
  HttpResponse out;
  out.content_type = "application/octet-stream";
  out.body_file = at->dir + "/" + t->file;
  return out;
}

HttpResponse Service::asample(const Caller& caller, const std::string& raw,
                              const json& body) {
  // The promise names each sample up front (the SDK stamps these ids on
  // the sequences of the result): "<request id>:<i>".
  int64_t n = 1;
  if (get_int64(body, "num_samples", &n))
    n = std::max<int64_t>(0, std::min<int64_t>(n, kMaxSampleIdsPerRequest));
  std::string key, session;
  int64_t seq_id = 0;
  const bool by_session = get_string(body, "sampling_session_id", &session);
  if (by_session && get_int64(body, "seq_id", &seq_id))
    key = session + "#" + std::to_string(seq_id);
  std::lock_guard<std::mutex> lock(mu_);
  std::string rid;
  if (by_session && !resolve_sampling_session(caller, session)) {
    rid = new_future(caller);
    fail(rid, unknown_sampling_session(session));
  } else {
    const uint64_t h = hash_of(raw);
    auto seen = key.empty() ? samples_.end() : samples_.find(key);
    if (seen != samples_.end()) {
      if (seen->second.first != h)
        return error_response(409, "asample: seq_id of sampling session '" +
                                       key +
                                       "' was already used by a different "
                                       "request");
      rid = seen->second.second;  // a retry: the original future
    } else {
      rid = new_future(caller);
      if (!key.empty()) samples_[key] = {h, rid};
      // The sequence ids "<rid>:<i>" (below) name recorded sequences too
      // (Note [Stability records] in stability.h).
      json args = body;
      args["zerostep_request_id"] = rid;
      enqueue(rid, Command{"sample", std::move(args), "", caller});
    }
  }
  json ids = json::array();
  for (int64_t i = 0; i < n; ++i) ids.push_back(rid + ":" + std::to_string(i));
  return json_response(200,
                       {{"request_id", rid}, {"sample_sequence_ids", ids}});
}

HttpResponse Service::retrieve_future(const Caller& caller,
                                      const std::string& raw,
                                      const std::string& accept) {
  json body = json::parse(raw);
  std::string rid;
  if (!get_string(body, "request_id", &rid))
    return error_response(400,
                          "retrieve_future: missing string field 'request_id'");
  std::unique_lock<std::mutex> lock(mu_);
  if (resolve_future(caller, rid) == nullptr)
    return error_response(404,
                          "retrieve_future: unknown request_id '" + rid + "'");
  const auto wait = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.long_poll_s));
  done_cv_.wait_for(lock, wait,
                    [&] { return futures_[rid].done || stopping_; });
  const Future& f = futures_[rid];
  if (!f.done)
    return json_response(200, {{"type", "try_again"},
                               {"request_id", rid},
                               {"queue_state", "active"}});
  if (!f.result.ok)
    return json_response(
        200, {{"error", f.result.error}, {"category", f.result.category}});
  if (f.result.has_proto) {
    if (accept.find("application/x-protobuf") == std::string::npos)
      return error_response(406,
                            "this result is served as "
                            "application/x-protobuf only; send Accept: "
                            "application/x-protobuf");
    HttpResponse r;
    r.content_type = "application/x-protobuf";
    r.body = f.result.proto;
    return r;
  }
  return json_response(200, f.result.json);
}

void Service::run_rank0(
    const std::function<CommandResult(const Command&)>& execute) {
  const auto beat = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.heartbeat_s));
  Clock::time_point last_broadcast = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    expire_gaps();
    if (queue_.empty()) {
      if (stopping_) break;
      if (Clock::now() - last_broadcast >= beat) {
        lock.unlock();
        execute(Command{"noop", json::object(), "", {}});
        lock.lock();
        last_broadcast = Clock::now();
        continue;
      }
      Clock::time_point until = last_broadcast + beat;
      for (const auto& kv : models_)
        for (const auto& h : kv.second.held)
          until = std::min(until, h.second.deadline);
      queue_cv_.wait_until(lock, until,
                           [&] { return !queue_.empty() || stopping_; });
      continue;
    }
    auto item = std::move(queue_.front());
    queue_.pop_front();
    if (item.second.op == kUnserved) {
      fail(item.first, item.second.args["error"].get<std::string>());
      continue;
    }
    lock.unlock();
    CommandResult result = execute(item.second);
    lock.lock();
    last_broadcast = Clock::now();
    ++stats_.commands_executed;
    if (!result.ok) ++stats_.requests_failed;
    if (!result.ok && (item.second.op == "create_model" ||
                       (item.second.op == "load_weights" &&
                        item.second.args.value("create", false)))) {
      // Never built: not counted in the tenant's quota.
      auto m = models_.find(item.second.args.value("model_id", ""));
      if (m != models_.end()) m->second.failed = true;
    }
    if (result.ok && item.second.op == "save_weights_for_sampler" &&
        result.json.is_object() &&
        result.json.contains("sampling_session_id") &&
        result.json["sampling_session_id"].is_string()) {
      // GET sessions/<id> lists it among the session's samplers.
      auto info = session_info_.find(
          session_of(item.second.args.value("model_id", "")));
      if (info != session_info_.end())
        info->second.sampler_ids.push_back(result.json["sampling_session_id"]);
    }
    Future& f = futures_[item.first];
    f.done = true;
    f.result = std::move(result);
    done_cv_.notify_all();
  }
  lock.unlock();
  execute(Command{"shutdown", json::object(), "", {}});
  done_cv_.notify_all();
}

void Service::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  queue_cv_.notify_all();
  done_cv_.notify_all();
}

CommandResult broadcast_and_execute(
    Communicator& comm, const Command& command,
    const std::function<CommandResult(const Command&)>& execute) {
  if (comm.world_size() > 1) {
    std::string bytes = encode_command(command);
    broadcast_bytes(comm, &bytes);
  }
  return execute(command);
}

void run_follower(Communicator& comm,
                  const std::function<CommandResult(const Command&)>& execute) {
  while (true) {
    std::string bytes;
    broadcast_bytes(comm, &bytes);
    const Command c = decode_command(bytes);
    if (c.op == "shutdown") return;
    execute(c);
  }
}

}  // namespace tinker
}  // namespace zerostep
