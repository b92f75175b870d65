// Service: the Tinker HTTP API of the trainer server, independent of any
// HTTP library (tools/tinker/http.h binds it to cpp-httplib) and of
// LibTorch (it runs Commands through a function it is given).
//
// What it implements (facts of the official SDK, docs/design/
// trainer_server.md):
//   - JSON endpoints under /api/v1: healthz, get_server_capabilities,
//     client/config, client/dynamic_config, create_session,
//     session_heartbeat, sessions/<id>/finish, telemetry, create_model,
//     get_info, optim_step, save_weights, load_weights, retrieve_future;
//     forward_backward takes a protobuf body.
//   - Futures: the training endpoints answer {"request_id", "model_id"} at
//     once; retrieve_future long-polls up to options.long_poll_s and then
//     answers {"type": "try_again"}; a finished forward_backward answers
//     protobuf (Accept: application/x-protobuf); a failed request answers
//     {"error", "category"} with HTTP 200.
//   - Ordering: a model's sequenced requests (forward_backward,
//     optim_step, save_weights, load_weights) run in seq_id order starting
//     at 1, whatever order they arrive in. A request whose predecessor has
//     not arrived within options.seq_gap_timeout_s fails ("a seq_id gap").
//     A retried request (same model, seq_id and body) gets the original
//     future; the same seq_id with another body is HTTP 409.
//   - Sampling (tools/tinker/sampling.h): save_weights_for_sampler is a
//     sequenced request of its model, like save_weights; its future
//     answers {"path"} or {"sampling_session_id"}. create_sampling_session
//     and GET samplers/<id> answer at once (HTTP 400 with the error).
//     asample answers a promise {"request_id", "sample_sequence_ids"} at
//     once; its future resolves to a protobuf SampleResponse. A retried
//     asample (same sampling session, seq_id and body) gets the original
//     future; the same seq_id with another body is HTTP 409.
//   - save_weights_external is a sequenced request of its model like
//     save_weights (external weights, export_weights.h); copy_weights and
//     weights_info run in the command queue and answer at once.
//   - REST (the SDK's RestClient): GET training_runs[/<id>], GET
//     checkpoints and training_runs/<id>/checkpoints, GET sessions[/<id>],
//     DELETE and PUT .../checkpoints/<kind>/<name>[/ttl], and GET
//     .../external_weights/<name>/external_weights_urls, whose signed URLs
//     GET downloads/... serves without a key (Note [Signed downloads] in
//     downloads.h). A method a path does not serve is 405 with a JSON body
//     and an Allow header, whatever the method.
//   - Unserved endpoints (unload_model, ...): a request carrying a
//     model_id and seq_id still takes its place in the model's order and
//     consumes its seq_id (the SDK numbers every training-client request,
//     and a later one would wait for the missing seq_id forever); its
//     future fails with "not implemented" and nothing changes. Without a
//     seq_id: HTTP 404 with the same message (not 501, which the SDK
//     retries).
//   - Malformed bodies (JSON or protobuf) get HTTP 400 with a JSON body
//     {"error", "category": "user"}; unknown paths 404.
//   - Ids: session ids are "session-<instance>-<n>" and model ids
//     "<session id>:train:<model_seq_id>", where <instance> is
//     options.instance_id, a random token per Service by default, so ids
//     never repeat across restarts and one run's checkpoints
//     (<state_dir>/<model id>/...) are never another's.
//   - Tenants (tenancy.h): every request carries its Caller (the HTTP front
//     checked its API key, http.h). Sessions, models, futures and sampling
//     sessions belong to the tenant that made them, and every id a request
//     names goes through one of the resolve_*() functions below (Note [One
//     tenant check] in tenancy.h): another tenant's id is answered exactly
//     as an id that does not exist. A session_id must be one that
//     create_session gave the caller's tenant (404 otherwise). Every
//     Command carries the caller, so the trainer finds the tenant's files.
//   - Quotas: a create_model (or a create-via-load) beyond the tenant's
//     max_models is HTTP 403 with nothing changed ("x-should-retry:
//     false", so the SDK does not retry it); max_bytes is checked by the
//     trainer when a save runs (checkpoints.h).
//   - Listings: GET checkpoints (the tenant's checkpoints of every run,
//     newest first, ?limit=&offset=) and GET training_runs/<id>/checkpoints
//     (one run's; 404 for a run that is neither a live model of the tenant
//     nor in its folder), run on rank 0 in the command queue.
// Execution: run_rank0() pops the queued Commands in order and calls
// `execute` for each (which broadcasts it and runs it on every rank; see
// Note [One command stream] in command.h).
//
// Thread safety: handle() may be called from any number of threads at once;
// run_rank0() from one thread; stop() from any.
#ifndef ZEROSTEP_TOOLS_TINKER_SERVICE_H_
#define ZEROSTEP_TOOLS_TINKER_SERVICE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tools/tinker/command.h"
#include "tools/tinker/downloads.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

// The most sample ids an asample promise lists (the sampler rejects more
// samples than models/sampler.h kMaxSamplesPerRequest anyway).
inline constexpr int64_t kMaxSampleIdsPerRequest = 128;

struct HttpRequest {
  std::string method;  // "GET", "POST", "DELETE", "PUT", ...
  std::string path;    // e.g. "/api/v1/healthz", %-escapes decoded
  std::string query;   // after '?', as sent ("limit=10&offset=0")
  std::string body;
  std::string content_type;      // request Content-Type
  std::string content_encoding;  // request Content-Encoding
  std::string accept;            // request Accept
  std::string host;              // request Host (for URLs it hands out)
  Caller caller;                 // who it acts for (the key's tenant)
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // When not empty: the body is this file's bytes instead (a download,
  // sent by the HTTP front without holding it in memory).
  std::string body_file;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
};

struct ServiceOptions {
  // How long retrieve_future waits for a result before "try_again"
  // (default 30 s; the SDK's own read timeout is 45 s).
  double long_poll_s = 30.0;
  // How long a request may wait for a missing predecessor seq_id before it
  // fails as a gap (default 60 s).
  double seq_gap_timeout_s = 60.0;
  // A request more than this many seq_ids ahead fails at once (default 4096).
  int64_t max_seq_ahead = 4096;
  // While idle, rank 0 broadcasts a noop this often (default 2 s; keeps
  // gloo's collective timeout from firing between requests).
  double heartbeat_s = 2.0;
  // Part of every session and model id (see "Ids" above); default empty: a
  // random 12-hex-digit token drawn at construction. Tests pass a fixed one.
  std::string instance_id;
  // Reported by get_server_capabilities: {name, max_context}.
  std::vector<std::pair<std::string, int64_t>> models;
  // The trainer's state directory: downloads are read from it (Note
  // [Signed downloads] in downloads.h). Empty: downloads answer 404.
  std::string state_dir;
  // The base of the download URLs get_external_weights_urls hands out
  // ("https://trainer.example.com" behind a TLS proxy); empty: "http://"
  // and the request's Host header.
  std::string public_url;
  // The secret download URLs are signed with; empty: drawn at random.
  std::string download_secret;
};

// Counters for tests and the load benchmark.
struct ServiceStats {
  int64_t commands_executed = 0;  // excluding noops
  int64_t requests_failed = 0;
};

class Service {
 public:
  explicit Service(const ServiceOptions& options);

  HttpResponse handle(const HttpRequest& request);

  // Runs queued commands until stop(); then executes a final "shutdown"
  // command (so followers return) and returns. `execute` must broadcast the
  // command and run it on this rank; its result resolves the future.
  void run_rank0(const std::function<CommandResult(const Command&)>& execute);
  void stop();

  ServiceStats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Future {
    bool done = false;
    CommandResult result;
    std::string tenant;
  };
  struct Held {
    std::string request_id;
    Command command;
    Clock::time_point deadline;
  };
  // What create_session gave, for the sessions endpoints.
  struct SessionInfo {
    int64_t created = 0;  // order of creation
    nlohmann::json user_metadata;  // object of strings, or null
    nlohmann::json display_name;   // string or null
    std::vector<std::string> sampler_ids;
  };
  struct ModelSeq {
    std::string tenant;
    bool failed = false;  // its creation failed: not counted in a quota
    int64_t next = 1;
    std::map<int64_t, Held> held;
    std::map<int64_t, std::pair<uint64_t, std::string>> seen;  // hash, id
  };

  HttpResponse create_model(const Caller& caller, const std::string& body);
  HttpResponse load_weights(const Caller& caller, const std::string& body);
  HttpResponse sequenced(const Caller& caller, const std::string& op,
                         const std::string& model_id, int64_t seq_id,
                         const std::string& body, Command command);
  HttpResponse get_info(const Caller& caller, const std::string& body);
  // Runs `op` in the command queue and answers its result at once (JSON,
  // or HTTP 400, or the result's http_status, with the error).
  HttpResponse run_now(const Caller& caller, const std::string& op,
                       const nlohmann::json& args);
  HttpResponse asample(const Caller& caller, const std::string& raw,
                       const nlohmann::json& body);
  HttpResponse retrieve_future(const Caller& caller, const std::string& body,
                               const std::string& accept);
  HttpResponse list_checkpoints(const Caller& caller, const std::string& run,
                                const std::string& query);
  // GET training_runs[/<id>] and sessions[/<id>].
  HttpResponse list_training_runs(const Caller& caller,
                                  const std::string& query);
  HttpResponse get_training_run(const Caller& caller, const std::string& run);
  HttpResponse list_sessions(const Caller& caller, const std::string& query);
  HttpResponse get_session(const Caller& caller, const std::string& session);
  // GET .../external_weights_urls and the downloads they name.
  HttpResponse external_weights_urls(const HttpRequest& req,
                                     const std::string& path);
  HttpResponse download(const HttpRequest& req, const std::string& ep);
  // The caller's live models (created, not failed); requires mu_ held.
  std::vector<std::string> live_models(const Caller& caller) const;

  // Note [One tenant check] (tenancy.h): the only ways a request's ids are
  // looked up. Each is true (or non-null) only for an id that exists and
  // is the caller's. Require mu_ held.
  ModelSeq* resolve_model(const Caller& caller, const std::string& model_id);
  bool resolve_session(const Caller& caller, const std::string& session_id);
  Future* resolve_future(const Caller& caller, const std::string& request_id);
  // "<session or model id>:sample:<n>": the caller's if that session or
  // model is.
  bool resolve_sampling_session(const Caller& caller,
                                const std::string& sampling_session_id);
  // 403 if creating one more model would exceed the caller's max_models.
  std::optional<HttpResponse> over_model_quota(const Caller& caller);

  // Require mu_ held.
  std::string new_future(const Caller& caller);
  void enqueue(const std::string& request_id, Command command);
  void fail(const std::string& request_id, const std::string& error);
  void expire_gaps();

  const ServiceOptions options_;
  const std::string instance_;  // options_.instance_id or a random token
  mutable std::mutex mu_;
  std::condition_variable done_cv_;        // a future finished
  std::condition_variable queue_cv_;       // a command was queued, or stop
  std::map<std::string, Future> futures_;  // GUARDED_BY(mu_)
  std::deque<std::pair<std::string, Command>> queue_;  // GUARDED_BY(mu_)
  std::map<std::string, ModelSeq> models_;             // GUARDED_BY(mu_)
  TenantIds sessions_;                                 // GUARDED_BY(mu_)
  std::map<std::string, SessionInfo> session_info_;     // GUARDED_BY(mu_)
  std::map<std::string, std::pair<uint64_t, std::string>>
      creates_;  // GUARDED_BY(mu_)
  // "<sampling session>#<seq_id>" -> (body hash, request id).
  std::map<std::string, std::pair<uint64_t, std::string>>
      samples_;               // GUARDED_BY(mu_)
  int64_t next_request_ = 1;  // GUARDED_BY(mu_)
  int64_t next_session_ = 1;  // GUARDED_BY(mu_)
  bool stopping_ = false;     // GUARDED_BY(mu_)
  ServiceStats stats_;        // GUARDED_BY(mu_)
  const DownloadSigner signer_;
};

// Every rank but 0: receive each command rank 0 broadcasts and execute it,
// until "shutdown".
void run_follower(Communicator& comm,
                  const std::function<CommandResult(const Command&)>& execute);

// For run_rank0: broadcasts `command` from rank 0 and executes it.
CommandResult broadcast_and_execute(
    Communicator& comm, const Command& command,
    const std::function<CommandResult(const Command&)>& execute);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_SERVICE_H_
