#include "tools/tinker/service.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
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
  json f = post("save_weights_external",
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
  f = post("save_weights_external",
           {{"model_id", id}, {"seq_id", 3}, {"path", "x"}});
  EXPECT_TRUE(result(f).contains("error"));
  g = post("save_weights", {{"model_id", id}, {"seq_id", 4}});
  EXPECT_EQ(result(g)["op"], "save_weights");
  EXPECT_EQ(executed(), (std::vector<std::string>{"create_model", "optim_step",
                                                  "save_weights"}));
}

TEST_F(ServiceTest, UnservedEndpointHeldForItsTurn) {
  const std::string id = create_model();
  // Arrives first with seq_id 2: waits for 1, then is consumed in order.
  json unserved = post("save_weights_external",
                       {{"model_id", id}, {"seq_id", 2}, {"path", "x"}});
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
  json r =
      post("copy_weights", {{"source_path", "tinker://x/weights/y"}}, &status);
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
  EXPECT_EQ(call("PUT", "/api/v1/training_runs/x/checkpoints/weights/w/ttl",
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
      "get_server_capabilities", "samplers/x");
  const bool any_path = *rc::gen::weightedOneOf<bool>(
      {{1, rc::gen::just(true)}, {4, rc::gen::just(false)}});
  const std::string path =
      "/api/v1/" + (any_path ? *rc::gen::string<std::string>() : endpoint);
  const std::string method = *rc::gen::weightedOneOf<std::string>(
      {{4, rc::gen::just<std::string>("POST")},
       {1, rc::gen::just<std::string>("GET")},
       {1, rc::gen::just<std::string>("PUT")}});
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
  const std::vector<int> meant = {200, 400, 404, 405, 406, 409, 415};
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
