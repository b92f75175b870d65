#include "tools/tinker/trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "tools/tinker/command.h"
#include "tools/tinker/tinker_public.pb.h"
#include "tools/tinker/trainer_test_util.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

const char kModel[] = "m";

// Datum i of a window: byte-level text of 8 to 20 tokens, cross_entropy.
void add_datum(tinker_public::ForwardBackwardRequest* req, int i) {
  std::vector<int32_t> tokens;
  const int n = 9 + (i * 7) % 13;
  for (int k = 0; k < n; ++k) tokens.push_back((i * 31 + k * 17 + 5) % 256);
  tinker_public::Datum* d = req->add_data();
  std::vector<int32_t> input(tokens.begin(), tokens.end() - 1);
  d->add_model_input()->mutable_encoded_text()->set_tokens(
      std::string(reinterpret_cast<const char*>(input.data()),
                  input.size() * sizeof(int32_t)));
  std::vector<int64_t> targets(tokens.begin() + 1, tokens.end());
  tinker_public::Tensor& t = (*d->mutable_loss_fn_inputs())["target_tokens"];
  t.set_dtype(tinker_public::DTYPE_INT64);
  t.add_shape(static_cast<int64_t>(targets.size()));
  t.set_dense(std::string(reinterpret_cast<const char*>(targets.data()),
                          targets.size() * sizeof(int64_t)));
  std::vector<float> weights(targets.size());
  for (size_t k = 0; k < weights.size(); ++k)
    weights[k] = 0.5f + 0.1f * static_cast<float>((i + k) % 7);
  tinker_public::Tensor& w = (*d->mutable_loss_fn_inputs())["weights"];
  w.set_dtype(tinker_public::DTYPE_FLOAT32);
  w.add_shape(static_cast<int64_t>(weights.size()));
  w.set_dense(std::string(reinterpret_cast<const char*>(weights.data()),
                          weights.size() * sizeof(float)));
}

// A forward_backward of the window's datums [first, first + count).
Command forward_backward(int first, int count, bool forward_only = false) {
  tinker_public::ForwardBackwardRequest req;
  req.set_model_id(kModel);
  req.set_loss_fn("cross_entropy");
  req.set_forward_only(forward_only);
  for (int i = first; i < first + count; ++i) add_datum(&req, i);
  Command c;
  c.op = "forward_backward";
  c.blob = req.SerializeAsString();
  return c;
}

Command optim_step(double lr = 1e-2) {
  Command c;
  c.op = "optim_step";
  c.args = {{"model_id", kModel},
            {"adam_params", {{"learning_rate", lr}, {"eps", 1e-8}}}};
  return c;
}

Command create_model() {
  Command c;
  c.op = "create_model";
  c.args = {{"model_id", kModel},
            {"base_model", "zerostep/tiny-gpt"},
            {"lora_config", {{"rank", 4}, {"seed", 3}}}};
  return c;
}

// The per-datum logprobs of a forward_backward result, as raw bits.
std::vector<std::vector<float>> logprobs_of(const CommandResult& r) {
  tinker_public::ForwardBackwardOutput out;
  EXPECT_TRUE(out.ParseFromString(r.proto));
  const tinker_public::BatchedTensor& bt =
      out.loss_fn_outputs(0).fields().at("logprobs");
  std::vector<int64_t> offsets(bt.offsets().size() / sizeof(int64_t));
  std::memcpy(offsets.data(), bt.offsets().data(), bt.offsets().size());
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    std::vector<float> row((offsets[i + 1] - offsets[i]) / sizeof(float));
    std::memcpy(row.data(), bt.data().data() + offsets[i],
                row.size() * sizeof(float));
    rows.push_back(row);
  }
  return rows;
}

struct WindowRun {
  std::vector<std::string> digests;          // after each optim_step
  std::vector<std::vector<float>> logprobs;  // every datum, in window order
};

std::string ds_config(int stage) {
  json c = {{"zero_optimization", {{"stage", stage}}}};
  if (stage == 3)
    c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  return c.dump();
}

// Runs `commands` on a simulated world of `world` ranks, every rank
// executing each command in order (as run_follower does after rank 0's
// broadcast); returns rank 0's results and checks every command succeeded
// unless `allow_errors`.
std::vector<CommandResult> execute(int world, int stage,
                                   const std::vector<Command>& commands,
                                   bool allow_errors = false) {
  TrainerOptions o;
  o.ds_config_json = ds_config(stage);
  const char* tmp = std::getenv("TEST_TMPDIR");
  o.state_dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/trainer_test";
  const std::vector<CommandResult> results =
      execute_on_sim_world(world, o, commands);
  if (!allow_errors) {
    for (size_t i = 0; i < results.size(); ++i)
      EXPECT_TRUE(results[i].ok) << commands[i].op << ": " << results[i].error;
  }
  return results;
}

// Two windows of `total` datums each, the client's calls of each window
// `split` (sizes summing to `total`), then one optim_step.
WindowRun run_windows(int world, int stage, const std::vector<int>& split) {
  const int total = std::accumulate(split.begin(), split.end(), 0);
  std::vector<Command> commands = {create_model()};
  for (int window = 0; window < 2; ++window) {
    int first = window * total;
    for (int n : split) {
      commands.push_back(forward_backward(first, n));
      first += n;
    }
    commands.push_back(optim_step());
  }
  const std::vector<CommandResult> results = execute(world, stage, commands);
  WindowRun run;
  for (size_t i = 0; i < results.size(); ++i) {
    if (commands[i].op == "optim_step" && results[i].ok)
      run.digests.push_back(digest_of(results[i]));
    if (commands[i].op == "forward_backward" && results[i].ok)
      for (auto& lp : logprobs_of(results[i])) run.logprobs.push_back(lp);
  }
  return run;
}

class ChunkingTest : public ::testing::TestWithParam<int> {};

// Issue 15: 101 datums on 2 ranks as [101], [51, 50] and 101 x [1] gave
// three different digests. Note [Window positions] in trainer.h: a datum's
// rank and backward() call follow from its position in the window, so the
// update (and every returned logprob) is bitwise the same however the
// client splits the window, at every world size, counts it does not
// divide included. Two windows: the second starts from the first's state.
TEST_P(ChunkingTest, MakesNoDifference) {
  const int stage = GetParam();
  const std::vector<std::vector<int>> splits = {
      {101},
      {51, 50},
      std::vector<int>(101, 1),
      {1, 2, 3, 5, 7, 11, 13, 17, 19, 23},
      {50, 1, 49, 1},
  };
  for (int world : {1, 2, 3}) {
    const WindowRun whole = run_windows(world, stage, splits[0]);
    ASSERT_EQ(whole.digests.size(), 2u);
    ASSERT_EQ(whole.logprobs.size(), 202u);
    for (size_t s = 1; s < splits.size(); ++s) {
      const WindowRun split = run_windows(world, stage, splits[s]);
      EXPECT_EQ(split.digests, whole.digests)
          << "stage " << stage << ", world " << world << ", split #" << s;
      EXPECT_TRUE(split.logprobs == whole.logprobs)
          << "stage " << stage << ", world " << world << ", split #" << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ChunkingTest, ::testing::Values(0, 2, 3));

Command with_model(const char* op, json args) {
  Command c;
  c.op = op;
  c.args = std::move(args);
  c.args["model_id"] = kModel;
  return c;
}

// A bad optim_step changes nothing, the window's pending row included; a
// forward_only request is not part of the window.
TEST(TrainerTest, BadStepAndForwardOnlyLeaveTheWindowAlone) {
  const std::vector<CommandResult> plain =
      execute(2, 2, {create_model(), forward_backward(0, 3), optim_step()});
  const std::vector<CommandResult> detour = execute(
      2, 2,
      {create_model(), forward_backward(0, 1), forward_backward(7, 2, true),
       forward_backward(1, 2), optim_step(-1.0),
       with_model("get_info", json::object()), optim_step()},
      /*allow_errors=*/true);
  ASSERT_FALSE(detour[4].ok);
  EXPECT_NE(detour[4].error.find("lr = -1.000000 must be a finite number"),
            std::string::npos)
      << detour[4].error;
  EXPECT_EQ(detour[5].json["window_datums"], 3) << detour[5].json;
  ASSERT_TRUE(detour[6].ok) << detour[6].error;
  EXPECT_EQ(digest_of(detour[6]), digest_of(plain[2]));
}

// A checkpoint inside an open window is refused, a pending row alone
// included (the engine has no backward() of the window yet).
TEST(TrainerTest, SaveInsideAnOpenWindowIsRefused) {
  const std::vector<CommandResult> r =
      execute(2, 0,
              {create_model(), forward_backward(0, 1),
               with_model("save_weights", {{"path", "w"}}), optim_step(),
               with_model("save_weights", {{"path", "w"}})},
              /*allow_errors=*/true);
  ASSERT_FALSE(r[2].ok);
  EXPECT_EQ(r[2].error,
            "save_weights on 'm' inside an open window (1 datum by "
            "forward_backward since its last optim_step). Nothing was "
            "changed; call optim_step first");
  EXPECT_TRUE(r[3].ok) << r[3].error;
  EXPECT_TRUE(r[4].ok) << r[4].error;
}

// Note [A model that cannot fit]: a create_model whose floor exceeds what
// the process may take is refused on every rank with nothing built; the
// same request fits when the memory is there, and the ranks in the process
// multiply the floor.
TEST(TrainerTest, AModelThatCannotFitIsRefusedAndNothingIsBuilt) {
  const auto with_memory = [](uint64_t bytes, int ranks_in_process) {
    TrainerOptions o;
    o.ds_config_json = ds_config(0);
    const char* tmp = std::getenv("TEST_TMPDIR");
    o.state_dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/trainer_test";
    o.ranks_in_process = ranks_in_process;
    o.available_memory = [bytes]() -> std::optional<AvailableMemory> {
      return AvailableMemory{bytes, "the test's limit"};
    };
    return o;
  };
  Command full = create_model();
  full.args.erase("lora_config");  // every parameter trains: 16 bytes each
  // tiny-gpt has 44,160 parameters: a floor of 706,560 bytes per rank at
  // stage 0.
  const std::vector<CommandResult> refused = execute_on_sim_world(
      2, with_memory(1'000'000, 2),
      {full, with_model("get_info", json::object()), create_model()});
  ASSERT_FALSE(refused[0].ok);
  EXPECT_EQ(refused[0].category, "user");
  EXPECT_NE(refused[0].error.find(
                "model 'm' (zerostep/tiny-gpt, 44160 trainable and 0 frozen "
                "parameters, ZeRO stage 0) needs at least"),
            std::string::npos)
      << refused[0].error;
  EXPECT_NE(refused[0].error.find("on the 2 rank(s) in this server's "
                                  "process"),
            std::string::npos)
      << refused[0].error;
  EXPECT_NE(refused[0].error.find("(the test's limit). Nothing was created"),
            std::string::npos)
      << refused[0].error;
  EXPECT_FALSE(refused[1].ok);  // no model 'm'
  // LoRA: the frozen weights count 4 bytes each, the adapters 16.
  EXPECT_TRUE(refused[2].ok) << refused[2].error;
  // One rank in the process: the same model fits.
  const std::vector<CommandResult> fits =
      execute_on_sim_world(2, with_memory(1'000'000, 1), {full});
  EXPECT_TRUE(fits[0].ok) << fits[0].error;
}

// Issue 45 (Note [One tenant check] in tenancy.h): each tenant's models
// and files are its own. The same checkpoint name by two tenants lands in
// two folders; another tenant's model, checkpoint path, sampler weights or
// run is answered exactly as one that does not exist; listings and
// deletes see the caller's only.
TEST(TrainerTest, EachTenantSeesItsOwnModelsAndCheckpoints) {
  auto as = [](const std::string& tenant, Command c) {
    c.caller.tenant = tenant;
    return c;
  };
  auto model = [&](const std::string& tenant, const std::string& id) {
    Command c = create_model();
    c.args["model_id"] = id;
    return as(tenant, c);
  };
  auto op = [&](const std::string& tenant, const char* name, json args) {
    Command c;
    c.op = name;
    c.args = std::move(args);
    return as(tenant, c);
  };
  TrainerOptions o;
  o.ds_config_json = ds_config(2);
  const char* tmp = std::getenv("TEST_TMPDIR");
  o.state_dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/tenants_test";
  const std::vector<Command> commands = {
      model("alice", "a1"),                                              // 0
      model("bob", "b1"),                                                // 1
      op("alice", "save_weights", {{"model_id", "a1"}, {"path", "same"}}),
      op("bob", "save_weights", {{"model_id", "b1"}, {"path", "same"}}),
      // bob names alice's model, then a model nobody has.                 4
      op("bob", "save_weights", {{"model_id", "a1"}, {"path", "x"}}),
      op("bob", "save_weights", {{"model_id", "zz"}, {"path", "x"}}),
      // bob loads alice's checkpoint, then one nobody has.                6
      op("bob", "load_weights",
         {{"model_id", "b2"}, {"create", true},
          {"path", "tinker://a1/weights/same"}}),
      op("bob", "load_weights",
         {{"model_id", "b2"}, {"create", true},
          {"path", "tinker://zz/weights/same"}}),
      op("alice", "save_weights_for_sampler",
         {{"model_id", "a1"}, {"path", "s"}}),                          // 8
      op("bob", "create_sampling_session",
         {{"session_id", "sb"}, {"sampling_session_seq_id", 0},
          {"model_path", "tinker://a1/sampler_weights/s"}}),
      op("bob", "create_sampling_session",
         {{"session_id", "sb"}, {"sampling_session_seq_id", 0},
          {"model_path", "tinker://zz/sampler_weights/s"}}),
      op("alice", "list_checkpoints", {{"limit", 100}, {"offset", 0}}),  // 11
      op("bob", "list_checkpoints", {{"model_id", "a1"}, {"live", false}}),
      op("bob", "list_checkpoints", {{"model_id", "zz"}, {"live", false}}),
      op("bob", "delete_checkpoint", {{"path", "tinker://a1/weights/same"}}),
      op("alice", "delete_checkpoint", {{"path", "tinker://a1/weights/same"}}),
      op("alice", "list_checkpoints", {{"model_id", "a1"}, {"live", true}}),
      // Her own model and checkpoint still load for bob's namesake: 17
      op("bob", "load_weights",
         {{"model_id", "b1"}, {"path", "tinker://b1/weights/same"}}),
  };
  const std::vector<CommandResult> r = execute_on_sim_world(2, o, commands);
  for (int i : {0, 1, 2, 3, 8, 11, 15, 16, 17})
    EXPECT_TRUE(r[i].ok) << i << ": " << r[i].error;
  auto same = [&](int theirs, int none, const std::string& id_theirs,
                  const std::string& id_none) {
    ASSERT_FALSE(r[theirs].ok);
    ASSERT_FALSE(r[none].ok);
    std::string a = r[theirs].error, b = r[none].error;
    a.replace(a.find(id_theirs), id_theirs.size(), "<id>");
    b.replace(b.find(id_none), id_none.size(), "<id>");
    EXPECT_EQ(a, b);
    EXPECT_EQ(r[theirs].http_status, r[none].http_status);
  };
  same(4, 5, "'a1'", "'zz'");
  EXPECT_NE(r[4].error.find("your models on this server: b1)"),
            std::string::npos)
      << r[4].error;
  same(6, 7, "tinker://a1/", "tinker://zz/");
  same(9, 10, "tinker://a1/", "tinker://zz/");
  same(12, 13, "'a1'", "'zz'");
  EXPECT_EQ(r[12].http_status, 404);
  ASSERT_FALSE(r[14].ok);  // bob cannot delete alice's
  EXPECT_EQ(r[14].http_status, 404);
  // One folder per tenant, the same name in each.
  const std::string root = o.state_dir + "/tenants/";
  EXPECT_TRUE(std::ifstream(root + "bob/b1/same/manifest.json").good());
  EXPECT_TRUE(
      std::ifstream(root + "alice/a1/sampler_weights/s/weights.pt").good());
  EXPECT_FALSE(std::ifstream(root + "alice/a1/same/manifest.json").good());
  // alice's listing before her delete: her checkpoint and sampler weights.
  const json& listed = r[11].json;
  ASSERT_EQ(listed["checkpoints"].size(), 2u) << listed;
  EXPECT_EQ(listed["cursor"]["total_count"], 2);
  std::vector<std::string> paths;
  for (const json& c : listed["checkpoints"]) {
    paths.push_back(c["tinker_path"]);
    EXPECT_GT(c["size_bytes"].get<int64_t>(), 0);
  }
  std::sort(paths.begin(), paths.end());
  EXPECT_EQ(paths, (std::vector<std::string>{"tinker://a1/sampler_weights/s",
                                             "tinker://a1/weights/same"}));
  // After the delete, her run lists the sampler weights alone.
  ASSERT_EQ(r[16].json["checkpoints"].size(), 1u) << r[16].json;
  EXPECT_EQ(r[16].json["checkpoints"][0]["checkpoint_id"],
            "sampler_weights/s");
}

// The sequences of a sample result (SampleResponse protobuf): tokens and
// logprobs per sequence.
std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> sequences_of(
    const CommandResult& r) {
  tinker_public::SampleResponse out;
  EXPECT_TRUE(out.ParseFromString(r.proto));
  std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> seqs;
  for (const auto& s : out.sequences()) {
    std::vector<int32_t> t(s.tokens().size() / 4);
    std::memcpy(t.data(), s.tokens().data(), s.tokens().size());
    std::vector<float> lp(s.logprobs().size() / 4);
    std::memcpy(lp.data(), s.logprobs().data(), s.logprobs().size());
    seqs.emplace_back(t, lp);
  }
  return seqs;
}

const std::vector<int32_t> kPrompt = {104, 105, 32, 116, 104};

Command sample_command(const std::string& request_id) {
  Command c;
  c.op = "sample";
  c.args = {{"sampling_session_id", std::string(kModel) + ":sample:0"},
            {"seq_id", 0},
            {"num_samples", 2},
            {"prompt", {{"chunks", {{{"type", "encoded_text"},
                                     {"tokens", kPrompt}}}}}},
            {"sampling_params", {{"max_tokens", 4}, {"temperature", 0.0}}},
            {"record_stability_info", true},
            {"zerostep_request_id", request_id}};
  return c;
}

Command sampler_session() {
  Command c;
  c.op = "save_weights_for_sampler";
  c.args = {{"model_id", kModel}, {"sampling_session_seq_id", 0}};
  return c;
}

// A stable_reinforce request over `sampled` (greedy, so the same for every
// sample) as the rl_loop recipe builds it: input = prompt + sampled[:-1],
// targets = placeholders over the prompt + sampled, one datum per
// sequence id with advantage +1 / -1.
Command stable_reinforce(const std::vector<int32_t>& sampled,
                         const std::vector<std::string>& ids,
                         const std::string& model = kModel) {
  tinker_public::ForwardBackwardRequest req;
  req.set_model_id(model);
  req.set_loss_fn("stable_reinforce");
  const int p = static_cast<int>(kPrompt.size());
  const int n = static_cast<int>(sampled.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    tinker_public::Datum* d = req.add_data();
    std::vector<int32_t> input = kPrompt;
    input.insert(input.end(), sampled.begin(), sampled.end() - 1);
    d->add_model_input()->mutable_encoded_text()->set_tokens(std::string(
        reinterpret_cast<const char*>(input.data()), input.size() * 4));
    std::vector<int64_t> targets(p - 1, 0);
    targets.insert(targets.end(), sampled.begin(), sampled.end());
    std::vector<float> adv(p - 1, 0.0f);
    adv.insert(adv.end(), n, i == 0 ? 1.0f : -1.0f);
    auto set = [&](const char* key, tinker_public::DType dtype,
                   const void* data, size_t bytes, int64_t len) {
      tinker_public::Tensor& t = (*d->mutable_loss_fn_inputs())[key];
      t.set_dtype(dtype);
      t.add_shape(len);
      t.set_dense(std::string(static_cast<const char*>(data), bytes));
    };
    set("target_tokens", tinker_public::DTYPE_INT64, targets.data(),
        targets.size() * 8, static_cast<int64_t>(targets.size()));
    set("advantages", tinker_public::DTYPE_FLOAT32, adv.data(), adv.size() * 4,
        static_cast<int64_t>(adv.size()));
    auto span = [&](google::protobuf::RepeatedPtrField<
                        tinker_public::ProvenanceSpan>* spans,
                    bool sampled_run, int64_t offset, int64_t length) {
      tinker_public::ProvenanceSpan* s = spans->Add();
      if (sampled_run) {
        s->mutable_sampled_tokens()->set_sequence_id(ids[i]);
        s->mutable_sampled_tokens()->set_offset(offset);
        s->mutable_sampled_tokens()->set_length(length);
      } else {
        s->mutable_prompt_tokens()->set_sequence_id(ids[i]);
        s->mutable_prompt_tokens()->set_offset(offset);
        s->mutable_prompt_tokens()->set_length(length);
      }
    };
    span(d->mutable_model_input_spans(), false, 0, p);
    span(d->mutable_model_input_spans(), true, 0, n - 1);
    span(d->mutable_loss_fn_input_spans(), false, 1, p - 1);
    span(d->mutable_loss_fn_input_spans(), true, 0, n);
  }
  Command c;
  c.op = "forward_backward";
  c.blob = req.SerializeAsString();
  return c;
}

// Issue 43 item 1: a sample recorded with record_stability_info trains
// with stable_reinforce on every rank (rank 0 resolves the provenance and
// broadcasts q); another tenant's or an unknown sequence is refused alike,
// on every rank, with nothing changed.
TEST(TrainerTest, StableReinforceTrainsOnRecordedSequences) {
  // Greedy tokens of the untrained model (the same model in any world).
  const std::vector<CommandResult> first =
      execute(1, 0, {create_model(), sampler_session(), sample_command("r")});
  const auto greedy = sequences_of(first[2]);
  ASSERT_EQ(greedy.size(), 2u);
  const std::vector<int32_t> sampled = greedy[0].first;
  ASSERT_EQ(sampled.size(), 4u);
  // bob's own model "b": another tenant and another session.
  Command bob_model = create_model();
  bob_model.args["model_id"] = "b";
  bob_model.caller.tenant = "bob";
  Command bob_fb = stable_reinforce(sampled, {"req-9:0", "req-9:1"}, "b");
  bob_fb.caller.tenant = "bob";
  const std::vector<CommandResult> r = execute(
      2, 2,
      {create_model(), sampler_session(), sample_command("req-9"),
       stable_reinforce(sampled, {"req-9:0", "req-9:1"}),             // 3
       stable_reinforce(sampled, {"req-9:0", "req-8:1"}),             // 4
       bob_model, bob_fb,                                             // 5, 6
       optim_step()},                                                 // 7
      /*allow_errors=*/true);
  ASSERT_TRUE(r[3].ok) << r[3].error;
  ASSERT_TRUE(r[5].ok) << r[5].error;
  ASSERT_TRUE(r[7].ok) << r[7].error;
  // Refused: an unknown sequence, and the default tenant's sequences named
  // by bob, alike (Note [One tenant check]).
  ASSERT_FALSE(r[4].ok);
  EXPECT_NE(r[4].error.find("data[1].model_input_spans[0] names sequence_id "
                            "'req-8:1', which this session has no record of"),
            std::string::npos)
      << r[4].error;
  ASSERT_FALSE(r[6].ok);
  std::string bob = r[6].error;
  bob.replace(bob.find("data[0]"), 7, "data[1]");
  bob.replace(bob.find("req-9:0"), 7, "req-8:1");
  EXPECT_EQ(bob, r[4].error);
  // loss:sum is Note [stable_reinforce]'s formula of the returned logprobs
  // and the recorded ones (q).
  const auto recorded = sequences_of(r[2]);
  tinker_public::ForwardBackwardOutput out;
  ASSERT_TRUE(out.ParseFromString(r[3].proto));
  const std::vector<std::vector<float>> lp = logprobs_of(r[3]);
  ASSERT_EQ(lp.size(), 2u);
  const size_t p = kPrompt.size();
  double want = 0;
  for (size_t i = 0; i < 2; ++i) {
    const double a = i == 0 ? 1.0 : -1.0;
    for (size_t t = 0; t < sampled.size(); ++t) {
      const double logp = lp[i][p - 1 + t];
      const double q = recorded[i].second[t];
      const double w = std::min(1.0, std::exp(logp - q));
      want += -w * a * logp;
      // On policy: the learner's and the sampler's logprobs agree within
      // float rounding of other matmul shapes.
      EXPECT_NEAR(logp, q, 1e-5);
    }
  }
  EXPECT_NEAR(out.metrics().at("loss:sum"), want, 1e-5 * (1 + std::abs(want)));
}

// Issue 43 item 5: the external weights hold the bits the server trains:
// FNV-1a 64 over the adapters' data in the file is get_info's digest.
TEST(TrainerTest, ExternalWeightsHoldTheDigestedBits) {
  Command info;
  info.op = "get_info";
  info.args = {{"model_id", kModel}};
  Command ext;
  ext.op = "save_weights_external";
  ext.args = {{"model_id", kModel}, {"path", "digest"}};
  const std::vector<CommandResult> r =
      execute(1, 0, {create_model(), info, ext});
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string file =
      std::string(tmp != nullptr ? tmp : "/tmp") +
      "/trainer_test/tenants/default/m/external_weights/digest/"
      "adapter_model.safetensors";
  std::ifstream in(file, std::ios::binary);
  const std::string raw((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
  ASSERT_GT(raw.size(), 8u);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  const std::string data = raw.substr(8 + n);
  EXPECT_EQ(digest_hex(digest_floats(reinterpret_cast<const float*>(data.data()),
                                     data.size() / 4)),
            r[1].json["param_digest"]);
}

// Issue 43 item 2: cross_entropy with [T, K] soft targets returns [T, K]
// logprobs (trailing shape K), one per (position, target).
TEST(TrainerTest, SoftTargetsReturnALogprobPerTarget) {
  tinker_public::ForwardBackwardRequest req;
  req.set_model_id(kModel);
  req.set_loss_fn("cross_entropy");
  add_datum(&req, 0);
  tinker_public::Datum* d = req.mutable_data(0);
  const int64_t t = (*d->mutable_loss_fn_inputs())["target_tokens"].shape(0);
  std::vector<int64_t> ids;
  std::vector<float> w;
  for (int64_t i = 0; i < t; ++i)
    for (int64_t k = 0; k < 3; ++k) {
      ids.push_back((i * 7 + k * 11) % 256);
      w.push_back(k == 0 ? 0.5f : 0.25f);
    }
  auto set2 = [&](const char* key, tinker_public::DType dtype,
                  const void* data, size_t bytes) {
    tinker_public::Tensor& x = (*d->mutable_loss_fn_inputs())[key];
    x.Clear();
    x.set_dtype(dtype);
    x.add_shape(t);
    x.add_shape(3);
    x.set_dense(std::string(static_cast<const char*>(data), bytes));
  };
  set2("target_tokens", tinker_public::DTYPE_INT64, ids.data(), ids.size() * 8);
  set2("weights", tinker_public::DTYPE_FLOAT32, w.data(), w.size() * 4);
  add_datum(&req, 1);  // a 1-D datum after it: a record of its own
  Command c;
  c.op = "forward_backward";
  c.blob = req.SerializeAsString();
  const std::vector<CommandResult> r =
      execute(2, 0, {create_model(), c, optim_step()});
  tinker_public::ForwardBackwardOutput out;
  ASSERT_TRUE(out.ParseFromString(r[1].proto));
  ASSERT_EQ(out.loss_fn_outputs_size(), 2);
  const auto& soft = out.loss_fn_outputs(0).fields().at("logprobs");
  ASSERT_EQ(soft.trailing_shape_size(), 1);
  EXPECT_EQ(soft.trailing_shape(0), 3);
  EXPECT_EQ(soft.data().size(), static_cast<size_t>(t * 3 * 4));
  EXPECT_EQ(out.loss_fn_outputs(1).fields().at("logprobs").trailing_shape_size(),
            0);
  // loss:sum = -sum(w * logp) over both datums.
  std::vector<float> lp(t * 3);
  std::memcpy(lp.data(), soft.data().data(), soft.data().size());
  double want = 0;
  for (size_t i = 0; i < lp.size(); ++i) want += -w[i] * lp[i];
  const auto& hard = out.loss_fn_outputs(1).fields().at("elementwise_loss");
  std::vector<float> el(hard.data().size() / 4);
  std::memcpy(el.data(), hard.data().data(), hard.data().size());
  for (float e : el) want += e;
  EXPECT_NEAR(out.metrics().at("loss:sum"), want, 1e-4 * (1 + std::abs(want)));
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
