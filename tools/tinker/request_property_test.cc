// A RapidCheck property over the trainer's JSON requests, as a client
// could send them: a valid create_model, optim_step, save_weights,
// load_weights or sample request with one field (or one field of a nested
// object) replaced by a JSON value of any kind. What must hold, whatever the
// value:
//   - the command never fails as the server's fault (category "server"):
//     a bad value is the user's, and its error says so;
//   - a value of a kind the field never takes (a string for a number, a
//     fraction for an integer, a number for an object, ...) is refused,
//     and the error names the field: it is never read as something else
//     (Note [Integer fields] in request_fields.h);
//   - a refused optim_step changes nothing: a valid optim_step after it
//     gives the parameters a step gives without it, to the bit;
//   - a refused create_model registers nothing: the valid one then works.
// And a forward_backward request (protobuf) changed in one way (a token,
// a dtype, a shape, its bytes, a weight, the loss, its config, a corrupt
// body) never fails as the server's fault, and when refused leaves the
// window as it was: a valid request and a step after it give the
// parameters they give without it.
// On a failure RapidCheck shrinks to the smallest such request and prints
// it, with the reproduce string (propertytests/README.md).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "propertytests/property_main.h"
#include "tools/tinker/command.h"
#include "tools/tinker/tinker_public.pb.h"
#include "tools/tinker/trainer.h"
#include "tools/tinker/trainer_test_util.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

// Cases per property in CI (about 0.1 s each).
constexpr int kCiMaxSuccess = 60;

const char kModel[] = "m";
const char kBase[] = "zerostep/tiny-gpt";

// What a field takes.
enum class Want { kNumber, kInteger, kBool, kString, kObject };

struct Field {
  std::vector<std::string> path;  // into the command's args
  Want want;
  bool null_is_default;  // a null value takes the field's default
};

// The kinds of value a client can send.
enum class Kind {
  kNull,
  kBool,
  kInteger,   // an integer in int64's range, extremes included
  kUnsigned,  // 2^63 to 2^64 - 1
  kWhole,     // a float with no fraction
  kFraction,  // a float with one
  kString,
  kArray,
  kObject
};

const char* to_string(Kind k) {
  switch (k) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "bool";
    case Kind::kInteger:
      return "integer";
    case Kind::kUnsigned:
      return "unsigned above 2^63";
    case Kind::kWhole:
      return "whole float";
    case Kind::kFraction:
      return "fraction";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "array";
    case Kind::kObject:
      return "object";
  }
  return "?";
}

void showValue(Kind k, std::ostream& os) { os << to_string(k); }

rc::Gen<json> value_of(Kind k) {
  switch (k) {
    case Kind::kNull:
      return rc::gen::just(json(nullptr));
    case Kind::kBool:
      return rc::gen::map(rc::gen::arbitrary<bool>(),
                          [](bool b) { return json(b); });
    case Kind::kInteger:
      return rc::gen::map(
          rc::gen::oneOf(rc::gen::inRange<int64_t>(-3, 300),
                         rc::gen::element(std::numeric_limits<int64_t>::min(),
                                          std::numeric_limits<int64_t>::max(),
                                          int64_t{1} << 40)),
          [](int64_t i) { return json(i); });
    case Kind::kUnsigned:
      return rc::gen::map(
          rc::gen::inRange<uint64_t>(uint64_t{1} << 63,
                                     std::numeric_limits<uint64_t>::max()),
          [](uint64_t u) { return json(u); });
    case Kind::kWhole:
      return rc::gen::map(rc::gen::element(0.0, 1.0, 4.0, -2.0, 1e30, -1e19),
                          [](double d) { return json(d); });
    case Kind::kFraction:
      return rc::gen::map(
          rc::gen::element(0.5, 2.5, -0.25, 1e-3, 3.999999, 1.5e-300),
          [](double d) { return json(d); });
    case Kind::kString:
      return rc::gen::map(
          rc::gen::container<std::string>(rc::gen::inRange<char>(32, 127)),
          [](std::string s) { return json(s); });
    case Kind::kArray:
      return rc::gen::element(json::array(), json::array({1, "x"}),
                              json::array({4}));
    case Kind::kObject:
      return rc::gen::element(json::object(), json{{"rank", 4}},
                              json{{"a", nullptr}});
  }
  return rc::gen::just(json(nullptr));
}

// A JSON text of kind k (text, so that RapidCheck prints it as it is).
rc::Gen<std::string> text_of(Kind k) {
  return rc::gen::map(value_of(k), [](const json& j) { return j.dump(); });
}

// Whether a field may take a value of kind k (and then be refused only by
// its range or meaning): if not, it must be refused.
bool takes(const Field& f, Kind k) {
  if (k == Kind::kNull) return f.null_is_default;
  switch (f.want) {
    case Want::kNumber:
      return k == Kind::kInteger || k == Kind::kUnsigned || k == Kind::kWhole ||
             k == Kind::kFraction;
    case Want::kInteger:
      return k == Kind::kInteger || k == Kind::kUnsigned || k == Kind::kWhole;
    case Want::kBool:
      return k == Kind::kBool;
    case Want::kString:
      return k == Kind::kString;
    case Want::kObject:
      return k == Kind::kObject;
  }
  return false;
}

// The requests, valid as they are, and the fields a client sets.
struct Request {
  const char* op;
  json args;
  std::vector<Field> fields;
};

std::vector<Request> requests() {
  const json lora = {{"rank", 4},
                     {"seed", 3},
                     {"train_attn", true},
                     {"train_mlp", true},
                     {"train_unembed", true}};
  const json adam = {{"learning_rate", 1e-2}, {"beta1", 0.9},
                     {"beta2", 0.95},         {"eps", 1e-8},
                     {"weight_decay", 0.0},   {"grad_clip_norm", 0.0}};
  const json sampling = {{"max_tokens", 4},
                         {"temperature", 1.0},
                         {"top_k", -1},
                         {"top_p", 1.0},
                         {"seed", 5}};
  return {
      {"create_model",
       {{"model_id", kModel},
        {"base_model", kBase},
        {"lora_config", lora},
        {"optimizer_config", {{"type", "adamw"}}}},
       {{{"base_model"}, Want::kString, false},
        {{"lora_config"}, Want::kObject, true},
        {{"lora_config", "rank"}, Want::kInteger, false},
        {{"lora_config", "seed"}, Want::kInteger, true},
        {{"lora_config", "train_attn"}, Want::kBool, true},
        {{"lora_config", "train_mlp"}, Want::kBool, true},
        {{"lora_config", "train_unembed"}, Want::kBool, true},
        {{"optimizer_config"}, Want::kObject, true},
        {{"optimizer_config", "type"}, Want::kString, true}}},
      {"optim_step",
       {{"model_id", kModel}, {"adam_params", adam}},
       {{{"model_id"}, Want::kString, false},
        {{"adam_params"}, Want::kObject, false},
        {{"adam_params", "learning_rate"}, Want::kNumber, false},
        {{"adam_params", "beta1"}, Want::kNumber, false},
        {{"adam_params", "beta2"}, Want::kNumber, false},
        {{"adam_params", "eps"}, Want::kNumber, false},
        {{"adam_params", "weight_decay"}, Want::kNumber, false},
        {{"adam_params", "grad_clip_norm"}, Want::kNumber, false}}},
      {"save_weights",
       {{"model_id", kModel}, {"path", "w"}},
       {{{"path"}, Want::kString, false}}},
      {"load_weights",
       {{"model_id", kModel},
        {"path", std::string("tinker://") + kModel + "/weights/w"},
        {"optimizer", true}},
       {{{"path"}, Want::kString, false}, {{"optimizer"}, Want::kBool, true}}},
      {"sample",
       {{"base_model", kBase},
        {"prompt",
         {{"chunks", json::array({{{"type", "encoded_text"},
                                   {"tokens", json::array({1, 2, 3})}}})}}},
        {"num_samples", 1},
        {"sampling_params", sampling},
        {"prompt_logprobs", false}},
       {{{"num_samples"}, Want::kInteger, false},
        {{"prompt_logprobs"}, Want::kBool, true},
        {{"sampling_params"}, Want::kObject, false},
        {{"sampling_params", "max_tokens"}, Want::kInteger, true},
        {{"sampling_params", "temperature"}, Want::kNumber, false},
        {{"sampling_params", "top_k"}, Want::kInteger, false},
        {{"sampling_params", "top_p"}, Want::kNumber, false},
        {{"sampling_params", "seed"}, Want::kInteger, true}}},
  };
}

std::string path_of(const Field& f) {
  std::string s;
  for (const std::string& k : f.path) s += (s.empty() ? "" : ".") + k;
  return s;
}

// A forward_backward of two byte-level datums (cross_entropy).
Command forward_backward() {
  tinker_public::ForwardBackwardRequest req;
  req.set_model_id(kModel);
  req.set_loss_fn("cross_entropy");
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> input;
    std::vector<int64_t> targets;
    for (int k = 0; k < 9 + i; ++k) {
      input.push_back((i * 31 + k * 17 + 5) % 256);
      targets.push_back((i * 31 + (k + 1) * 17 + 5) % 256);
    }
    tinker_public::Datum* d = req.add_data();
    d->add_model_input()->mutable_encoded_text()->set_tokens(
        std::string(reinterpret_cast<const char*>(input.data()),
                    input.size() * sizeof(int32_t)));
    tinker_public::Tensor& t = (*d->mutable_loss_fn_inputs())["target_tokens"];
    t.set_dtype(tinker_public::DTYPE_INT64);
    t.add_shape(static_cast<int64_t>(targets.size()));
    t.set_dense(std::string(reinterpret_cast<const char*>(targets.data()),
                            targets.size() * sizeof(int64_t)));
  }
  Command c;
  c.op = "forward_backward";
  c.blob = req.SerializeAsString();
  return c;
}

Command command(const char* op, json args) {
  Command c;
  c.op = op;
  c.args = std::move(args);
  return c;
}

// Runs `commands` on a simulated world of 2 ranks (stage 2) with a fresh
// state folder; rank 0's results.
std::vector<CommandResult> execute(const std::vector<Command>& commands) {
  static int run = 0;
  TrainerOptions o;
  o.ds_config_json = R"({"zero_optimization": {"stage": 2}})";
  const char* tmp = std::getenv("TEST_TMPDIR");
  o.state_dir = std::string(tmp != nullptr ? tmp : "/tmp") +
                "/request_property_test/" + std::to_string(run++);
  return execute_on_sim_world(2, o, commands);
}

const Request& request_named(const char* op) {
  static const std::vector<Request> all = requests();
  for (const Request& r : all)
    if (std::string(r.op) == op) return r;
  std::abort();
}

// The parameters after a valid forward_backward and step: the reference
// of a refused optim_step, and of a refused forward_backward, followed by
// those two.
const std::string& reference_digest() {
  static const std::string digest = [] {
    const std::vector<CommandResult> r =
        execute({command("create_model", request_named("create_model").args),
                 forward_backward(),
                 command("optim_step", request_named("optim_step").args)});
    for (const CommandResult& x : r) EXPECT_TRUE(x.ok) << x.error;
    return digest_of(r.back());
  }();
  return digest;
}

// The commands that run `request` (an op of requests()): what it needs
// before it (a model, a checkpoint, a gradient), the request at
// *at_request, and what checks it after (a second create_model, a step).
std::vector<Command> around(const Command& request, size_t* at_request) {
  const std::string op = request.op;
  const Command create =
      command("create_model", request_named("create_model").args);
  const Command step = command("optim_step", request_named("optim_step").args);
  *at_request = 0;
  if (op == "create_model") return {request, create};
  if (op == "optim_step") {
    *at_request = 2;
    return {create, forward_backward(), request, step};
  }
  if (op == "save_weights") {
    *at_request = 1;
    return {create, request};
  }
  if (op == "load_weights") {
    *at_request = 2;
    return {create, command("save_weights", request_named("save_weights").args),
            request};
  }
  return {request};
}

// The requests as they are, unchanged, succeed: the properties change
// valid requests.
TEST(TrainerRequests, EveryRequestAsWrittenSucceeds) {
  for (const Request& req : requests()) {
    size_t at = 0;
    const std::vector<Command> commands =
        around(command(req.op, req.args), &at);
    const std::vector<CommandResult> r = execute(commands);
    // What comes after the request checks a refused one: a second
    // create_model of the same id, a step with no gradient left, fail here.
    for (size_t c = 0; c <= at; ++c)
      EXPECT_TRUE(r[c].ok) << req.op << ", command " << c << " ("
                           << commands[c].op << "): " << r[c].error;
  }
}

void check_request(const char* op) {
  const Request& req = request_named(op);
  const size_t i = *rc::gen::inRange<size_t>(0, req.fields.size());
  const Field& field = req.fields[i];
  const Kind kind = *rc::gen::element(
      Kind::kNull, Kind::kBool, Kind::kInteger, Kind::kUnsigned, Kind::kWhole,
      Kind::kFraction, Kind::kString, Kind::kArray, Kind::kObject);
  const json value = json::parse(*text_of(kind));
  json args = req.args;
  json* at = &args;
  for (const std::string& k : field.path) at = &(*at)[k];
  *at = value;
  RC_LOG() << op << " with " << path_of(field) << " = " << value.dump() << " ("
           << to_string(kind) << ")" << std::endl;

  const Command mutated = command(op, args);
  size_t at_mutated = 0;
  const std::vector<Command> commands = around(mutated, &at_mutated);
  const std::vector<CommandResult> r = execute(commands);
  const CommandResult& got = r[at_mutated];
  // What runs before the request is valid, and what runs after it is valid
  // when the request was refused (else it may not be: a second
  // create_model of the same id, a step with no gradient left).
  for (size_t c = 0; c < r.size(); ++c)
    if (c < at_mutated || (c > at_mutated && !got.ok)) RC_ASSERT(r[c].ok);
  RC_LOG() << (got.ok ? std::string("accepted")
                      : "refused (" + got.category + "): " + got.error)
           << std::endl;
  RC_ASSERT(got.ok || got.category == "user");
  RC_ASSERT(got.ok || !got.error.empty());
  if (!takes(field, kind)) {
    RC_ASSERT(!got.ok);
    RC_ASSERT(got.error.find(field.path.back()) != std::string::npos);
  }
  if (std::string(op) == "optim_step" && !got.ok)
    RC_ASSERT(digest_of(r.back()) == reference_digest());
}

RC_GTEST_PROP(TrainerRequests, CreateModelRefusesWhatItCannotTake, ()) {
  check_request("create_model");
}

RC_GTEST_PROP(TrainerRequests,
              OptimStepRefusesWhatItCannotTakeAndChangesNothing, ()) {
  check_request("optim_step");
}

RC_GTEST_PROP(TrainerRequests, SaveWeightsRefusesWhatItCannotTake, ()) {
  check_request("save_weights");
}

RC_GTEST_PROP(TrainerRequests, LoadWeightsRefusesWhatItCannotTake, ()) {
  check_request("load_weights");
}

RC_GTEST_PROP(TrainerRequests, SampleRefusesWhatItCannotTake, ()) {
  check_request("sample");
}

// One change to a valid ForwardBackwardRequest, as a client (or a corrupt
// body) could make it; RC_LOG says which.
std::string mutate(tinker_public::ForwardBackwardRequest* req) {
  const int i = *rc::gen::inRange(0, req->data_size());
  tinker_public::Datum* d = req->mutable_data(i);
  const std::string at = "data[" + std::to_string(i) + "]";
  tinker_public::Tensor& target =
      (*d->mutable_loss_fn_inputs())["target_tokens"];
  const int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  switch (*rc::gen::inRange(0, 12)) {
    case 0: {  // a token id
      std::string* tokens =
          d->mutable_model_input(0)->mutable_encoded_text()->mutable_tokens();
      if (tokens->size() < 4) return at + " (no token to change)";
      const int32_t v = *rc::gen::element<int32_t>(
          -1, 0, 255, 256, std::numeric_limits<int32_t>::min(),
          std::numeric_limits<int32_t>::max());
      const size_t k = *rc::gen::inRange<size_t>(0, tokens->size() / 4);
      std::memcpy(&(*tokens)[k * 4], &v, 4);
      return at + " token " + std::to_string(k) + " = " + std::to_string(v);
    }
    case 1: {  // token bytes that are not whole int32s, or none
      std::string* tokens =
          d->mutable_model_input(0)->mutable_encoded_text()->mutable_tokens();
      const size_t n = *rc::gen::inRange<size_t>(0, 4);
      if (n == 0) {
        tokens->clear();
        return at + " with no token bytes";
      }
      tokens->append(n, '\x01');
      return at + " tokens + " + std::to_string(n) + " bytes";
    }
    case 2: {  // a dtype, the SDK's unserved ones and unknown numbers too
      const int dtype = *rc::gen::inRange(0, 9);
      target.set_dtype(static_cast<tinker_public::DType>(dtype));
      return at + " target_tokens dtype " + std::to_string(dtype);
    }
    case 3: {  // a shape, overflowing products included, maybe no bytes
      const std::vector<int64_t> shape =
          *rc::gen::container<std::vector<int64_t>>(
              *rc::gen::inRange<size_t>(0, 3),
              rc::gen::element<int64_t>(-1, 0, 1, 9, 10, int64_t{1} << 30,
                                        int64_t{1} << 31, int64_t{1} << 61,
                                        int64_t{1} << 62, kInt64Max));
      target.clear_shape();
      std::string text;
      for (int64_t v : shape) {
        target.add_shape(v);
        text += (text.empty() ? "" : ", ") + std::to_string(v);
      }
      const bool empty = *rc::gen::arbitrary<bool>();
      if (empty) target.clear_dense();
      return at + " target_tokens shape [" + text + "]" +
             (empty ? " and no bytes" : "");
    }
    case 4: {  // dense bytes cut, grown or gone
      std::string* dense = target.mutable_dense();
      const int64_t delta = *rc::gen::element<int64_t>(
          -8, -1, 1, 8, -static_cast<int64_t>(dense->size()));
      if (delta < 0)
        dense->resize(dense->size() -
                      std::min(dense->size(), static_cast<size_t>(-delta)));
      else
        dense->append(static_cast<size_t>(delta), '\0');
      return at + " target_tokens dense " + std::to_string(delta) + " bytes";
    }
    case 5: {  // a target id
      const int64_t v = *rc::gen::element<int64_t>(
          -1, 256, std::numeric_limits<int64_t>::min(), kInt64Max, 7);
      if (target.dense().size() < 8) return at + " (no target to change)";
      std::memcpy(&(*target.mutable_dense())[0], &v, 8);
      return at + " target_tokens[0] = " + std::to_string(v);
    }
    case 6: {  // a weight
      tinker_public::Tensor& w = (*d->mutable_loss_fn_inputs())["weights"];
      const float v = *rc::gen::element<float>(
          std::numeric_limits<float>::quiet_NaN(),
          std::numeric_limits<float>::infinity(), -1.0f, 0.0f, 3.0e38f);
      const int64_t n = static_cast<int64_t>(target.dense().size() / 8);
      w.set_dtype(tinker_public::DTYPE_FLOAT32);
      w.clear_shape();
      w.add_shape(n);
      std::string bytes(static_cast<size_t>(n) * 4, '\0');
      for (int64_t k = 0; k < n; ++k) std::memcpy(&bytes[k * 4], &v, 4);
      w.set_dense(bytes);
      return at + " weights all " + std::to_string(v);
    }
    case 7: {  // a loss
      const std::string loss = *rc::gen::element<std::string>(
          "cross_entropy", "ppo", "importance_sampling", "cispo", "dro", "gspo",
          "", "CROSS_ENTROPY");
      req->set_loss_fn(loss);
      return "loss_fn '" + loss + "'";
    }
    case 8: {  // a loss_fn_config entry
      const std::string key = *rc::gen::element<std::string>(
          "clip_low_threshold", "clip_high_threshold", "beta", "x");
      const double v = *rc::gen::element<double>(
          std::numeric_limits<double>::quiet_NaN(),
          std::numeric_limits<double>::infinity(), -1.0, 0.2);
      (*req->mutable_loss_fn_config())[key] = v;
      return "loss_fn_config['" + key + "'] = " + std::to_string(v);
    }
    case 9: {  // an input the loss does not read, or none of the targets
      if (*rc::gen::arbitrary<bool>()) {
        d->mutable_loss_fn_inputs()->erase("target_tokens");
        return at + " without target_tokens";
      }
      (*d->mutable_loss_fn_inputs())["advantages"] = target;
      return at + " with advantages";
    }
    case 10: {  // sparse instead of dense
      target.mutable_sparse_csr();
      return at + " target_tokens sparse";
    }
    default: {  // a corrupt body: one byte changed
      std::string bytes = req->SerializeAsString();
      const size_t k = *rc::gen::inRange<size_t>(0, bytes.size());
      const char v = *rc::gen::arbitrary<char>();
      bytes[k] = v;
      req->Clear();
      if (!req->ParseFromString(bytes)) return "an unparsable body";
      return "byte " + std::to_string(k) + " = " + std::to_string(int{v});
    }
  }
}

// A forward_backward request changed in one way, then a valid one and a
// step: the changed request never fails as the server's fault, and when it
// is refused the window goes on as if it had never come.
RC_GTEST_PROP(TrainerRequests,
              ForwardBackwardRefusesWhatItCannotTakeAndChangesNothing, ()) {
  tinker_public::ForwardBackwardRequest req;
  const Command valid = forward_backward();
  RC_ASSERT(req.ParseFromString(valid.blob));
  // One to three changes: some defects need two (a shape whose element
  // count overflows to the size of the bytes sent).
  std::string what;
  const int changes = *rc::gen::inRange(1, 4);
  for (int c = 0; c < changes && what.find("unparsable") == std::string::npos;
       ++c)
    what += (what.empty() ? "" : ", ") + mutate(&req);
  Command changed = valid;
  changed.blob = req.SerializeAsString();
  if (what.find("an unparsable body") != std::string::npos)
    changed.blob = "\x0a\xff";
  RC_LOG() << "forward_backward with " << what << std::endl;
  const std::vector<CommandResult> r = execute(
      {command("create_model", request_named("create_model").args), changed,
       valid, command("optim_step", request_named("optim_step").args)});
  const CommandResult& got = r[1];
  RC_LOG() << (got.ok ? std::string("accepted")
                      : "refused (" + got.category + "): " + got.error)
           << std::endl;
  RC_ASSERT(r[0].ok);
  RC_ASSERT(got.ok || got.category == "user");
  if (got.ok) return;
  RC_ASSERT(r[2].ok);
  RC_ASSERT(r[3].ok);
  RC_ASSERT(digest_of(r[3]) == reference_digest());
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep

int main(int argc, char** argv) {
  zerostep::prepare_property_run(zerostep::tinker::kCiMaxSuccess);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
