#include "tools/tinker/service.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

// A Service whose rank 0 loop runs on a thread and records what it
// executes (every command succeeds with {"op": op}).
class ServiceTest : public ::testing::Test {
 protected:
  ServiceTest() : service_(options()) {
    session_ = post("create_session", json::object())["session_id"];
    loop_ = std::thread([this] {
      service_.run_rank0([this](const Command& c) {
        std::lock_guard<std::mutex> lock(mu_);
        if (c.op != "noop" && c.op != "shutdown") {
          executed_.push_back(c.op);
          commands_.push_back(c);
        }
        if (c.args.value("base_model", "") == "unbuildable")
          return CommandResult::failure("cannot build", "user");
        CommandResult r;
        r.json = {{"op", c.op}, {"tenant", c.caller.tenant}};
        return r;
      });
    });
  }
  ~ServiceTest() override {
    service_.stop();
    loop_.join();
  }

  static ServiceOptions options() {
    ServiceOptions o;
    o.instance_id = "test";
    o.long_poll_s = 30.0;  // a future is awaited, never polled twice
    return o;
  }

  json post(const std::string& ep, const json& body, int* status = nullptr,
            const std::string& tenant = kDefaultTenant) {
    HttpRequest req;
    req.method = "POST";
    req.path = "/api/v1/" + ep;
    req.body = body.dump();
    req.caller.tenant = tenant;
    HttpResponse res = service_.handle(req);
    if (status != nullptr) *status = res.status;
    return json::parse(res.body);
  }

  json result(const json& future,
              const std::string& tenant = kDefaultTenant) {
    return post("retrieve_future", {{"request_id", future["request_id"]}},
                nullptr, tenant);
  }

  std::string create_model() {
    json f = post("create_model", {{"session_id", session_},
                                   {"model_seq_id", 0},
                                   {"base_model", "b"}});
    EXPECT_EQ(result(f)["op"], "create_model");
    return f["model_id"];
  }

  std::vector<std::string> executed() {
    std::lock_guard<std::mutex> lock(mu_);
    return executed_;
  }

  Service service_;
  std::string session_;
  std::mutex mu_;
  std::vector<std::string> executed_;  // GUARDED_BY(mu_)
  std::vector<Command> commands_;      // GUARDED_BY(mu_)
  std::thread loop_;
};

// Issue 15: an unserved endpoint's 404 left its seq_id unregistered, so
// every later request of that model waited for it and failed.
TEST_F(ServiceTest, UnservedEndpointConsumesItsSeqId) {
  const std::string id = create_model();
  int status = 0;
  json f = post("unload_model",
                {{"model_id", id}, {"seq_id", 1}, {"path", "x"}}, &status);
  ASSERT_EQ(status, 200) << f;
  json r = result(f);
  ASSERT_TRUE(r.contains("error")) << r;
  EXPECT_NE(r["error"].get<std::string>().find("not implemented"),
            std::string::npos)
      << r;
  EXPECT_EQ(r["category"], "user");
  // The next seq_id runs at once (with a 60 s gap timeout it would wait).
  json g =
      post("optim_step",
           {{"model_id", id}, {"seq_id", 2}, {"adam_params", json::object()}});
  EXPECT_EQ(result(g)["op"], "optim_step") << g;
  f = post("unload_model", {{"model_id", id}, {"seq_id", 3}, {"path", "x"}});
  EXPECT_TRUE(result(f).contains("error"));
  g = post("save_weights", {{"model_id", id}, {"seq_id", 4}});
  EXPECT_EQ(result(g)["op"], "save_weights");
  EXPECT_EQ(executed(), (std::vector<std::string>{"create_model", "optim_step",
                                                  "save_weights"}));
}

TEST_F(ServiceTest, UnservedEndpointHeldForItsTurn) {
  const std::string id = create_model();
  // Arrives first with seq_id 2: waits for 1, then is consumed in order.
  json unserved =
      post("unload_model", {{"model_id", id}, {"seq_id", 2}, {"path", "x"}});
  json first = post("save_weights", {{"model_id", id}, {"seq_id", 1}});
  json third = post("save_weights", {{"model_id", id}, {"seq_id", 3}});
  EXPECT_EQ(result(first)["op"], "save_weights");
  EXPECT_TRUE(result(unserved).contains("error"));
  EXPECT_EQ(result(third)["op"], "save_weights");
}

// Issue 15 item 1: sampler weights are a sequenced request of the model.
TEST_F(ServiceTest, SaveWeightsForSamplerRunsInItsModelsOrder) {
  const std::string id = create_model();
  json later = post("save_weights", {{"model_id", id}, {"seq_id", 2}});
  json save =
      post("save_weights_for_sampler",
           {{"model_id", id}, {"seq_id", 1}, {"sampling_session_seq_id", 0}});
  EXPECT_EQ(result(save)["op"], "save_weights_for_sampler") << save;
  EXPECT_EQ(result(later)["op"], "save_weights");
  EXPECT_EQ(executed(),
            (std::vector<std::string>{
                "create_model", "save_weights_for_sampler", "save_weights"}));
}

TEST_F(ServiceTest, AsampleAnswersAPromiseWithOneIdPerSample) {
  const json body = {{"sampling_session_id", session_ + ":sample:0"},
                     {"seq_id", 0},
                     {"num_samples", 3},
                     {"prompt", {{"chunks", json::array()}}}};
  int status = 0;
  json p = post("asample", body, &status);
  ASSERT_EQ(status, 200) << p;
  ASSERT_EQ(p["sample_sequence_ids"].size(), 3u) << p;
  EXPECT_EQ(p["sample_sequence_ids"][2],
            p["request_id"].get<std::string>() + ":2");
  EXPECT_EQ(result(p)["op"], "sample");
  // A retry gets the same future; the same seq_id with another body is 409.
  EXPECT_EQ(post("asample", body)["request_id"], p["request_id"]);
  json other = body;
  other["num_samples"] = 2;
  post("asample", other, &status);
  EXPECT_EQ(status, 409);
  EXPECT_EQ(executed(), (std::vector<std::string>{"sample"}));
}

TEST_F(ServiceTest, SamplingSessionsAnswerAtOnce) {
  int status = 0;
  json r = post("create_sampling_session",
                {{"session_id", session_},
                 {"sampling_session_seq_id", 0},
                 {"base_model", "b"}},
                &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(r["op"], "create_sampling_session");
  HttpRequest get;
  get.method = "GET";
  get.path = "/api/v1/samplers/" + session_ + ":sample:0";
  HttpResponse res = service_.handle(get);
  EXPECT_EQ(res.status, 200);
  EXPECT_EQ(json::parse(res.body)["op"], "get_sampler");
}

TEST_F(ServiceTest, UnservedEndpointWithoutSeqIdIsNotImplemented) {
  int status = 0;
  json r = post("sessions/search", {{"query", "x"}}, &status);
  EXPECT_EQ(status, 404);
  EXPECT_NE(r["error"].get<std::string>().find("not implemented"),
            std::string::npos)
      << r;
}

TEST_F(ServiceTest, IdsCarryTheInstance) {
  EXPECT_EQ(session_, "session-test-1");
  json s = post("create_session", json::object());
  EXPECT_EQ(s["session_id"], "session-test-2");
}

// Issue 45: a tenant sees only its own sessions, models, futures and
// sampling sessions, and another tenant's id is answered exactly as an id
// that does not exist (the id itself aside).
TEST_F(ServiceTest, AnotherTenantsIdsAnswerAsMissingOnes) {
  // alice's session, model, future and sampling session.
  const std::string alice_session =
      post("create_session", json::object(), nullptr, "alice")["session_id"];
  json created = post("create_model",
                      {{"session_id", alice_session},
                       {"model_seq_id", 0},
                       {"base_model", "b"}},
                      nullptr, "alice");
  const std::string model = created["model_id"];
  const std::string future = created["request_id"];
  const std::string sampling = model + ":sample:0";
  // Each request bob sends with alice's id, and again with an id nobody
  // has: the same status and answer (a future's result included), once
  // the id is replaced.
  auto answer = [&](const std::string& ep, json body, const std::string& id) {
    int status = 0;
    json a = post(ep, body, &status, "bob");
    if (status == 200 && a.contains("request_id")) a = result(a, "bob");
    std::string text = a.dump();
    for (size_t at; (at = text.find(id)) != std::string::npos;)
      text.replace(at, id.size(), "<id>");
    return std::make_pair(status, text);
  };
  auto same_answer = [&](const std::string& ep, const std::string& field,
                         const std::string& theirs, const std::string& none,
                         json body) {
    body[field] = theirs;
    const auto a = answer(ep, body, theirs);
    body[field] = none;
    const auto b = answer(ep, body, none);
    EXPECT_EQ(a, b) << ep;
    EXPECT_NE(a.second.find("unknown"), std::string::npos)
        << ep << ": " << a.second;
  };
  same_answer("create_model", "session_id", alice_session, "session-test-99",
              {{"model_seq_id", 1}, {"base_model", "b"}});
  same_answer("load_weights", "session_id", alice_session, "session-test-99",
              {{"model_seq_id", 1}, {"path", "tinker://m/weights/w"}});
  same_answer("create_sampling_session", "session_id", alice_session,
              "session-test-99",
              {{"sampling_session_seq_id", 0}, {"base_model", "b"}});
  same_answer("get_info", "model_id", model, "session-test-99:train:0",
              json::object());
  same_answer("optim_step", "model_id", model, "session-test-99:train:0",
              {{"seq_id", 1}, {"adam_params", json::object()}});
  same_answer("save_weights", "model_id", model, "session-test-99:train:0",
              {{"seq_id", 1}, {"path", "w"}});
  same_answer("save_weights_external", "model_id", model,
              "session-test-99:train:0", {{"seq_id", 1}, {"path", "w"}});
  same_answer("retrieve_future", "request_id", future, "req-999",
              json::object());
  same_answer("asample", "sampling_session_id", sampling,
              "session-test-99:sample:0",
              {{"seq_id", 0}, {"prompt", {{"chunks", json::array()}}}});
  HttpRequest get;
  get.method = "GET";
  get.caller.tenant = "bob";
  get.path = "/api/v1/samplers/" + sampling;
  const HttpResponse theirs = service_.handle(get);
  get.path = "/api/v1/samplers/session-test-99:sample:0";
  const HttpResponse none = service_.handle(get);
  EXPECT_EQ(theirs.status, 400);
  EXPECT_EQ(none.status, 400);
  // alice still has all of it, and nothing of bob's reached the trainer.
  EXPECT_EQ(result({{"request_id", future}}, "alice")["tenant"], "alice");
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(commands_.size(), 1u);
  EXPECT_EQ(commands_[0].op, "create_model");
  EXPECT_EQ(commands_[0].caller.tenant, "alice");
}

TEST_F(ServiceTest, AModelQuotaRefusesTheNextCreateWithA403) {
  auto create = [&](int seq, const std::string& base, int* status) {
    HttpRequest req;
    req.method = "POST";
    req.path = "/api/v1/create_model";
    req.caller.tenant = kDefaultTenant;
    req.caller.max_models = 1;
    req.body = json({{"session_id", session_},
                     {"model_seq_id", seq},
                     {"base_model", base}})
                   .dump();
    HttpResponse r = service_.handle(req);
    *status = r.status;
    return std::make_pair(json::parse(r.body), r);
  };
  int status = 0;
  // A creation that fails does not count.
  auto failed = create(0, "unbuildable", &status);
  ASSERT_EQ(status, 200);
  EXPECT_TRUE(result(failed.first).contains("error"));
  auto first = create(1, "b", &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(result(first.first)["op"], "create_model");
  auto second = create(2, "b", &status);
  EXPECT_EQ(status, 403);
  EXPECT_NE(second.first["error"].get<std::string>().find(
                "tenant 'default' holds 1 model, its quota (max_models=1"),
            std::string::npos)
      << second.first;
  EXPECT_EQ(second.second.headers,
            (std::vector<std::pair<std::string, std::string>>{
                {"x-should-retry", "false"}}));
  EXPECT_EQ(executed(),
            (std::vector<std::string>{"create_model", "create_model"}));
}

TEST_F(ServiceTest, ListingsAndDeletesRunForTheCallersTenant) {
  const std::string model = create_model();
  auto call = [&](const std::string& method, const std::string& path,
                  const std::string& query, const std::string& tenant) {
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.query = query;
    req.caller.tenant = tenant;
    req.caller.max_bytes = 7;
    return service_.handle(req);
  };
  EXPECT_EQ(call("GET", "/api/v1/checkpoints", "limit=5&offset=2", "alice")
                .status,
            200);
  EXPECT_EQ(call("GET", "/api/v1/training_runs/" + model + "/checkpoints", "",
                 kDefaultTenant)
                .status,
            200);
  EXPECT_EQ(call("GET", "/api/v1/training_runs/" + model + "/checkpoints", "",
                 "bob")
                .status,
            200);
  EXPECT_EQ(call("DELETE",
                 "/api/v1/training_runs/" + model + "/checkpoints/weights/w",
                 "", "bob")
                .status,
            200);
  const HttpResponse bad =
      call("GET", "/api/v1/checkpoints", "limit=0", "alice");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(call("PATCH", "/api/v1/training_runs/x/checkpoints/weights/w/ttl",
                 "", "alice")
                .status,
            405);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(commands_.size(), 5u);
  EXPECT_EQ(commands_[1].op, "list_checkpoints");
  EXPECT_EQ(commands_[1].caller.tenant, "alice");
  EXPECT_EQ(commands_[1].caller.max_bytes, 7u);
  EXPECT_EQ(commands_[1].args, json({{"limit", 5}, {"offset", 2}}));
  // The run is a live model of the default tenant, not of bob's.
  EXPECT_EQ(commands_[2].args["live"], true);
  EXPECT_EQ(commands_[3].args["live"], false);
  EXPECT_EQ(commands_[3].caller.tenant, "bob");
  EXPECT_EQ(commands_[4].op, "delete_checkpoint");
  EXPECT_EQ(commands_[4].args["path"], "tinker://" + model + "/weights/w");
}

// Issue 43: every method a path does not serve is a 405 with a JSON body
// and an Allow header; a GET of an unknown path is a 404.
TEST_F(ServiceTest, AMethodAPathDoesNotServeIs405WithAllow) {
  struct Case {
    const char* method;
    const char* path;
    const char* allow;
  };
  for (const Case& c : std::vector<Case>{
           {"POST", "/api/v1/training_runs", "GET"},
           {"DELETE", "/api/v1/training_runs/r", "GET"},
           {"PUT", "/api/v1/checkpoints", "GET"},
           {"GET", "/api/v1/create_model", "POST"},
           {"PATCH", "/api/v1/asample", "POST"},
           {"GET", "/api/v1/training_runs/r/checkpoints/weights/w", "DELETE"},
           {"POST", "/api/v1/training_runs/r/checkpoints/weights/w/ttl", "PUT"},
           {"DELETE", "/api/v1/sessions/s/project", "GET, POST"},
           {"OPTIONS", "/api/v1/nothing-here", "GET, POST"},
           {"PUT", "/api/v1/downloads/a/b/external_weights/c/d", "GET"}}) {
    HttpRequest req;
    req.method = c.method;
    req.path = c.path;
    const HttpResponse res = service_.handle(req);
    EXPECT_EQ(res.status, 405) << c.method << " " << c.path;
    EXPECT_NE(json::parse(res.body)["error"].get<std::string>().find(
                  std::string("method ") + c.method + " is not served"),
              std::string::npos)
        << res.body;
    ASSERT_EQ(res.headers.size(), 1u);
    EXPECT_EQ(res.headers[0],
              (std::pair<std::string, std::string>{"Allow", c.allow}));
  }
  HttpRequest get;
  get.method = "GET";
  get.path = "/api/v1/nothing-here";
  EXPECT_EQ(service_.handle(get).status, 404);
  get.method = "HEAD";
  get.path = "/api/v1/healthz";
  EXPECT_EQ(service_.handle(get).status, 200);
}

// Issue 43: runs, sessions, TTLs and external weights, each for the
// caller's tenant (Note [One tenant check]).
TEST_F(ServiceTest, RestRunsSessionsAndTtlsForTheCallersTenant) {
  const std::string model = create_model();
  auto call = [&](const std::string& method, const std::string& path,
                  const std::string& tenant, const std::string& body = "",
                  const std::string& query = "") {
    HttpRequest req;
    req.method = method;
    req.path = "/api/v1/" + path;
    req.body = body;
    req.query = query;
    req.caller.tenant = tenant;
    return service_.handle(req);
  };
  EXPECT_EQ(call("GET", "training_runs", kDefaultTenant, "", "limit=3").status,
            200);
  EXPECT_EQ(call("GET", "training_runs", "bob").status, 200);
  EXPECT_EQ(call("GET", "training_runs/" + model, kDefaultTenant).status, 200);
  EXPECT_EQ(call("GET", "training_runs/" + model, "bob").status, 200);
  EXPECT_EQ(call("GET", "training_runs", "bob", "", "limit=5000").status, 400);
  EXPECT_EQ(call("PUT",
                 "training_runs/" + model + "/checkpoints/weights/w/ttl",
                 kDefaultTenant, R"({"ttl_seconds": 7200})")
                .status,
            200);
  const HttpResponse no_ttl = call(
      "PUT", "training_runs/r/checkpoints/weights/w/ttl", kDefaultTenant, "{}");
  EXPECT_EQ(no_ttl.status, 400);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSERT_EQ(commands_.size(), 6u);
    EXPECT_EQ(commands_[1].op, "list_training_runs");
    EXPECT_EQ(commands_[1].args["live"], json::array({model}));
    EXPECT_EQ(commands_[1].args["limit"], 3);
    EXPECT_EQ(commands_[2].args["live"], json::array());  // bob has none
    EXPECT_EQ(commands_[3].op, "get_training_run");
    EXPECT_EQ(commands_[3].args["live"], true);
    EXPECT_EQ(commands_[4].args["live"], false);
    EXPECT_EQ(commands_[5].op, "set_checkpoint_ttl");
    EXPECT_EQ(commands_[5].args,
              json({{"path", "tinker://" + model + "/weights/w"},
                    {"ttl_seconds", 7200}}));
  }
  // Sessions: the default tenant's, and bob's own (none yet).
  json mine = json::parse(call("GET", "sessions", kDefaultTenant).body);
  EXPECT_EQ(mine["sessions"], json::array({session_}));
  EXPECT_EQ(json::parse(call("GET", "sessions", "bob").body)["sessions"],
            json::array());
  const HttpResponse s = call("GET", "sessions/" + session_, kDefaultTenant);
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(json::parse(s.body)["training_run_ids"], json::array({model}));
  // Another tenant's session reads as a missing one.
  const HttpResponse other = call("GET", "sessions/" + session_, "bob");
  const HttpResponse missing = call("GET", "sessions/session-test-99", "bob");
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(json::parse(other.body)["error"].get<std::string>().substr(0, 16),
            json::parse(missing.body)["error"].get<std::string>().substr(0, 16));
}

TEST_F(ServiceTest, SaveWeightsExternalIsSequencedAndSamplesKnowTheirIds) {
  const std::string id = create_model();
  json f = post("save_weights_external",
                {{"model_id", id}, {"seq_id", 1}, {"path", "x"}});
  EXPECT_EQ(result(f)["op"], "save_weights_external");
  json a = post("asample", {{"sampling_session_id", id + ":sample:0"},
                            {"seq_id", 0},
                            {"num_samples", 2},
                            {"zerostep_request_id", "forged"}});
  result(a);
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(commands_.back().op, "sample");
  // The server's request id, whatever the client sent.
  EXPECT_EQ(commands_.back().args["zerostep_request_id"], a["request_id"]);
}

// Note [Signed downloads]: a URL get_external_weights_urls hands out
// fetches its file without a key; an altered one is a 403.
TEST(ServiceDownloads, SignedUrlsServeTheirFileAndNothingElse) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string state = std::string(tmp ? tmp : "/tmp") + "/dl-state";
  const std::string run = "session-t-1:train:0";
  const std::string dir =
      state + "/tenants/alice/session-t-1_train_0/external_weights/final";
  std::filesystem::remove_all(state);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/adapter_model.safetensors") << "weights";
  std::ofstream(dir + "/tinker_meta.json") << R"({"model_id": "x"})";
  ServiceOptions o;
  o.instance_id = "t";
  o.state_dir = state;
  o.download_secret = std::string(32, 's');
  Service service(o);
  std::thread loop([&] {
    service.run_rank0([](const Command& c) {
      CommandResult r;
      if (c.op == "external_weights_files")
        r.json = {{"files", {"adapter_model.safetensors"}}};
      return r;
    });
  });
  HttpRequest req;
  req.method = "GET";
  req.path = "/api/v1/training_runs/" + run +
             "/checkpoints/external_weights/final/external_weights_urls";
  req.host = "127.0.0.1:9";
  req.caller.tenant = "alice";
  const HttpResponse urls = service.handle(req);
  service.stop();
  loop.join();
  ASSERT_EQ(urls.status, 200) << urls.body;
  const json body = json::parse(urls.body);
  const std::string url = body["urls"]["adapter_model.safetensors"];
  ASSERT_EQ(url.rfind("http://127.0.0.1:9/api/v1/downloads/alice/", 0), 0u)
      << url;
  // What the HTTP front hands the Service for that URL (escapes decoded).
  HttpRequest get;
  get.method = "GET";
  const size_t q = url.find('?');
  get.path = url.substr(std::string("http://127.0.0.1:9").size(),
                        q - std::string("http://127.0.0.1:9").size());
  for (size_t at = get.path.find("%3A"); at != std::string::npos;
       at = get.path.find("%3A"))
    get.path.replace(at, 3, ":");
  get.query = url.substr(q + 1);
  const HttpResponse file = service.handle(get);
  EXPECT_EQ(file.status, 200) << file.body;
  EXPECT_EQ(file.body_file, dir + "/adapter_model.safetensors");
  // The meta file is the server's: a URL for it would need a signature.
  HttpRequest forged = get;
  forged.path.replace(forged.path.find("adapter_model.safetensors"), 25,
                      "tinker_meta.json");
  EXPECT_EQ(service.handle(forged).status, 403);
  // Another tenant's folder with alice's signature.
  forged = get;
  forged.path.replace(forged.path.find("alice"), 5, "bobby");
  EXPECT_EQ(service.handle(forged).status, 403);
  // The file deleted: 404, for the holder of a valid URL.
  std::filesystem::remove_all(dir);
  EXPECT_EQ(service.handle(get).status, 404);
}

// Issue 15: ids restarted at session-1:train:0 after a restart and
// collided with the last run's checkpoints.
TEST(ServiceIds, DifferAcrossInstances) {
  HttpRequest req;
  req.method = "POST";
  req.path = "/api/v1/create_session";
  req.body = "{}";
  Service a{ServiceOptions()}, b{ServiceOptions()};
  const json sa = json::parse(a.handle(req).body),
             sb = json::parse(b.handle(req).body);
  EXPECT_NE(sa["session_id"], sb["session_id"]);
}

TEST_F(ServiceTest, ADeeplyNestedBodyIsRefusedAndTheServerServesOn) {
  HttpRequest req;
  req.method = "POST";
  req.path = "/api/v1/create_model";
  const size_t d = 100000;
  req.body = "{\"base_model\": \"b\", \"x\": " + std::string(d, '[') +
             std::string(d, ']') + "}";
  HttpResponse res = service_.handle(req);
  EXPECT_EQ(res.status, 400);
  EXPECT_NE(res.body.find("nests arrays and objects 100001 levels deep; at "
                          "most 64 are accepted"),
            std::string::npos)
      << res.body;
  EXPECT_TRUE(executed().empty());
  create_model();  // still serving
}

// Note [Integer fields] (request_fields.h): a seq_id above 2^63 - 1 was
// read as a negative number and refused as "seq_id -1 must be >= 1".
TEST_F(ServiceTest, ASeqIdNoInt64HoldsIsRefusedAsMissing) {
  const std::string model = create_model();
  for (const char* ep : {"optim_step", "save_weights", "load_weights"}) {
    HttpRequest req;
    req.method = "POST";
    req.path = std::string("/api/v1/") + ep;
    req.body = R"({"model_id": ")" + model +
               R"(", "path": "p", "seq_id": 18446744073709551615})";
    const HttpResponse res = service_.handle(req);
    EXPECT_EQ(res.status, 400) << ep;
    EXPECT_NE(res.body.find("missing integer field 'seq_id'"),
              std::string::npos)
        << ep << ": " << res.body;
    EXPECT_EQ(res.body.find("-1"), std::string::npos) << ep << ": " << res.body;
  }
  EXPECT_EQ(executed(), std::vector<std::string>{"create_model"});
}

// A path that is not UTF-8 made the 404's message throw in json::dump(),
// which the HTTP layer answered with a 500 (found by the property below).
TEST_F(ServiceTest, APathThatIsNotUtf8IsAnsweredWith404) {
  for (const char* method : {"GET", "POST"}) {
    HttpRequest req;
    req.method = method;
    req.path = "/api/v1/\xbc\xff";
    req.body = "{}";
    const HttpResponse res = service_.handle(req);
    EXPECT_EQ(res.status, 404) << method;
    EXPECT_NE(json::parse(res.body)["error"].get<std::string>().find(
                  "\xef\xbf\xbd"),  // U+FFFD
              std::string::npos)
        << res.body;
  }
}

// Any JSON value, up to two levels of arrays and objects deep.
rc::Gen<json> any_json(int depth = 2) {
  std::vector<rc::Gen<json>> leaves = {
      rc::gen::just(json(nullptr)),
      rc::gen::map(rc::gen::arbitrary<bool>(), [](bool b) { return json(b); }),
      rc::gen::map(rc::gen::element<int64_t>(
                       0, 1, -1, 7, std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max()),
                   [](int64_t i) { return json(i); }),
      rc::gen::just(json(std::numeric_limits<uint64_t>::max())),
      rc::gen::map(rc::gen::element(0.5, -2.0, 1e300),
                   [](double d) { return json(d); }),
      rc::gen::map(rc::gen::string<std::string>(),
                   [](std::string x) { return json(x); }),
  };
  if (depth == 0)
    return rc::gen::oneOf(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                          leaves[5]);
  const auto array =
      rc::gen::map(rc::gen::container<std::vector<json>>(any_json(depth - 1)),
                   [](std::vector<json> v) { return json(v); });
  const auto object =
      rc::gen::map(rc::gen::container<std::map<std::string, json>>(
                       rc::gen::element<std::string>(
                           "model_id", "seq_id", "session_id", "model_seq_id",
                           "request_id", "num_samples", "path", "x"),
                       any_json(depth - 1)),
                   [](std::map<std::string, json> m) { return json(m); });
  return rc::gen::oneOf(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                        leaves[5], array, object);
}

// Whatever a client sends to whichever path, the Service answers: an HTTP
// status it means (never an exception, which the HTTP layer turns into a
// 500), a JSON body with an "error" on every error status, and it serves
// on. The bodies: a valid request with one field set to any JSON value or
// removed, any JSON value, or any bytes; the paths: every endpoint, and
// any bytes after /api/v1/.
RC_GTEST_PROP(ServiceRequests, EveryRequestGetsAMeaningfulAnswer, ()) {
  ServiceOptions o;
  o.instance_id = "prop";
  o.long_poll_s = 0.0;  // a future not done answers try_again at once
  o.seq_gap_timeout_s = 0.01;
  Service service(o);
  std::thread loop([&] {
    service.run_rank0([](const Command& c) {
      CommandResult r;
      r.json = {{"op", c.op}};
      return r;
    });
  });
  // Stops and joins the loop however the case ends (a failed RC_ASSERT
  // throws).
  struct Joiner {
    Service& service;
    std::thread& loop;
    ~Joiner() {
      service.stop();
      loop.join();
    }
  } joiner{service, loop};
  const auto call = [&](const std::string& method, const std::string& path,
                        const std::string& body) {
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.body = body;
    req.accept = "application/json";
    return service.handle(req);
  };
  const std::string session = json::parse(
      call("POST", "/api/v1/create_session", "{}").body)["session_id"];
  const json model = json::parse(
      call("POST", "/api/v1/create_model",
           json({{"session_id", session},
                 {"model_seq_id", 0},
                 {"base_model", "b"}})
               .dump())
          .body);
  const std::string endpoint = *rc::gen::element<std::string>(
      "create_session", "session_heartbeat", "sessions/s/finish", "telemetry",
      "create_model", "load_weights", "get_info", "retrieve_future",
      "create_sampling_session", "asample", "optim_step", "save_weights",
      "save_weights_for_sampler", "forward_backward", "save_weights_external",
      "client/config", "client/dynamic_config", "healthz",
      "get_server_capabilities", "samplers/x", "copy_weights", "weights_info",
      "training_runs", "training_runs/r", "training_runs/r/checkpoints",
      "training_runs/r/checkpoints/weights/w",
      "training_runs/r/checkpoints/weights/w/ttl",
      "training_runs/r/checkpoints/external_weights/w/external_weights_urls",
      "sessions", "sessions/s", "checkpoints",
      "downloads/a/r/external_weights/w/f");
  const bool any_path = *rc::gen::weightedOneOf<bool>(
      {{1, rc::gen::just(true)}, {4, rc::gen::just(false)}});
  const std::string path =
      "/api/v1/" + (any_path ? *rc::gen::string<std::string>() : endpoint);
  const std::string method = *rc::gen::weightedOneOf<std::string>(
      {{4, rc::gen::just<std::string>("POST")},
       {1, rc::gen::just<std::string>("GET")},
       {1, rc::gen::just<std::string>("PUT")},
       {1, rc::gen::just<std::string>("DELETE")},
       {1, rc::gen::just<std::string>("HEAD")}});
  json valid = {{"model_id", model["model_id"]},
                {"seq_id", 1},
                {"session_id", session},
                {"model_seq_id", 1},
                {"base_model", "b"},
                {"path", "p"},
                {"request_id", model["request_id"]},
                {"sampling_session_id", session + ":sample:0"},
                {"sampling_session_seq_id", 0},
                {"num_samples", 2}};
  std::string body;
  switch (*rc::gen::inRange(0, 3)) {
    case 0: {
      const std::string key = *rc::gen::element<std::string>(
          "model_id", "seq_id", "session_id", "model_seq_id", "base_model",
          "path", "request_id", "sampling_session_id",
          "sampling_session_seq_id", "num_samples");
      if (*rc::gen::arbitrary<bool>())
        valid.erase(key);
      else
        valid[key] = *any_json();
      body = valid.dump(-1, ' ', false, json::error_handler_t::replace);
      break;
    }
    case 1:
      body = (*any_json()).dump(-1, ' ', false, json::error_handler_t::replace);
      break;
    default:
      body = *rc::gen::string<std::string>();
  }
  RC_LOG() << method << " "
           << json(path).dump(-1, ' ', true, json::error_handler_t::replace)
           << " "
           << json(body).dump(-1, ' ', true, json::error_handler_t::replace)
           << std::endl;
  const HttpResponse res = call(method, path, body);
  RC_LOG() << res.status << " " << res.body << std::endl;
  const std::vector<int> meant = {200, 400, 403, 404, 405, 406, 409, 415};
  RC_ASSERT(std::find(meant.begin(), meant.end(), res.status) != meant.end());
  if (res.content_type == "application/json") {
    const json answer = json::parse(res.body);
    if (res.status >= 400) {
      RC_ASSERT(answer.contains("error"));
      RC_ASSERT(answer["error"].is_string());
    }
  }
  // And it serves on.
  RC_ASSERT(call("GET", "/api/v1/healthz", "").status == 200);
  RC_ASSERT(call("POST", "/api/v1/create_session", "{}").status == 200);
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
