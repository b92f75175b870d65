#include "tools/tinker/stability.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

ProvenanceSpanIn span(bool sampled, const std::string& id, int64_t offset,
                      int64_t length) {
  return {sampled, id, offset, length};
}

TensorValue ints(std::vector<int64_t> v) {
  TensorValue t;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

TensorValue floats(std::vector<float> v) {
  TensorValue t;
  t.is_float = true;
  t.shape = {static_cast<int64_t>(v.size())};
  t.floats = std::move(v);
  return t;
}

// The rl_loop recipe's datum for prompt [10, 11, 12] and sampled [20, 21]:
// input = prompt + sampled[:-1], targets = [0, 0] placeholders + sampled.
DatumIn recipe_datum(const std::string& id) {
  DatumIn d;
  d.tokens = {10, 11, 12, 20};
  d.inputs["target_tokens"] = ints({0, 0, 20, 21});
  d.inputs["advantages"] = floats({0, 0, 0.5f, 0.5f});
  d.has_provenance = true;
  d.input_spans = {span(false, id, 0, 3), span(true, id, 0, 1)};
  d.target_spans = {span(false, id, 1, 2), span(true, id, 0, 2)};
  return d;
}

struct Fixture : ::testing::Test {
  double now = 1000.0;
  StabilityRecords records{[this] { return now; }, 100.0};

  void SetUp() override {
    records.record("req-7:0", {"alice", "session-x-1", {10, 11, 12}, {20, 21},
                               {-0.5f, -1.25f}});
  }

  std::string error(const std::string& tenant, const std::string& session,
                    const DatumIn& d) {
    try {
      records.resolve(tenant, session, d, 3);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  }
};

TEST(StabilitySessionOf, EveryIdKindMapsToItsSession) {
  EXPECT_EQ(session_of("session-ab-1"), "session-ab-1");
  EXPECT_EQ(session_of("session-ab-1:train:0"), "session-ab-1");
  EXPECT_EQ(session_of("session-ab-1:sample:4"), "session-ab-1");
  EXPECT_EQ(session_of("session-ab-1:train:2:sample:0"), "session-ab-1");
  EXPECT_EQ(session_of("model-ab-3:sample:0"), "model-ab-3");
}

TEST_F(Fixture, SampledTargetsGetTheRecordedLogprobsPromptOnesNaN) {
  const std::vector<float> q =
      records.resolve("alice", "session-x-1", recipe_datum("req-7:0"), 0);
  ASSERT_EQ(q.size(), 4u);
  EXPECT_TRUE(std::isnan(q[0]) && std::isnan(q[1]));
  EXPECT_EQ(q[2], -0.5f);
  EXPECT_EQ(q[3], -1.25f);
}

TEST_F(Fixture, AnotherSessionsOrTenantsSequenceReadsAsAMissingOne) {
  const std::string missing =
      error("alice", "session-x-1", recipe_datum("req-9:0"));
  ASSERT_NE(missing.find("names sequence_id 'req-9:0', which this session "
                         "has no record of"),
            std::string::npos)
      << missing;
  EXPECT_EQ(missing.rfind("data[3].model_input_spans[0]", 0), 0u) << missing;
  // Same words, whoever asks (only the id differs).
  auto same = [&](const std::string& tenant, const std::string& session) {
    std::string e = error(tenant, session, recipe_datum("req-7:0"));
    const size_t at = e.find("req-7:0");
    if (at != std::string::npos) e.replace(at, 7, "req-9:0");
    return e;
  };
  EXPECT_EQ(same("alice", "session-x-2"), missing);
  EXPECT_EQ(same("bob", "session-x-1"), missing);
}

TEST_F(Fixture, ADayPassesUnlessATrainingRequestUsesTheSequence) {
  now += 99.0;
  records.resolve("alice", "session-x-1", recipe_datum("req-7:0"), 0);
  now += 99.0;  // 198 s after sampling, 99 after the last use
  EXPECT_EQ(error("alice", "session-x-1", recipe_datum("req-7:0")), "");
  now += 100.0;
  EXPECT_NE(error("alice", "session-x-1", recipe_datum("req-7:0")), "");
  EXPECT_EQ(records.expire(), 0u);
}

TEST_F(Fixture, AFailedRequestDoesNotRestartTheDay) {
  now += 60.0;
  DatumIn d = recipe_datum("req-7:0");
  d.inputs["target_tokens"].ints[3] = 99;
  EXPECT_NE(error("alice", "session-x-1", d), "");
  now += 50.0;  // 110 s after sampling
  EXPECT_NE(error("alice", "session-x-1", recipe_datum("req-7:0")), "");
}

TEST_F(Fixture, TokensAndRangesMustMatchTheRecord) {
  DatumIn d = recipe_datum("req-7:0");
  d.tokens[1] = 99;
  EXPECT_EQ(error("alice", "session-x-1", d),
            "data[3].model_input_spans[0]: model_input[1] = 99 but the "
            "sequence's prompt token 1 is 11");
  d = recipe_datum("req-7:0");
  d.inputs["target_tokens"].ints[3] = 22;
  EXPECT_EQ(error("alice", "session-x-1", d),
            "data[3].loss_fn_input_spans[1]: "
            "loss_fn_inputs['target_tokens'][3] = 22 but the sequence's "
            "sampled token 1 is 21");
  d = recipe_datum("req-7:0");
  d.target_spans[1] = span(true, "req-7:0", 1, 2);
  EXPECT_EQ(error("alice", "session-x-1", d),
            "data[3].loss_fn_input_spans[1] covers sampled tokens [1, 3) of "
            "sequence 'req-7:0', which has 2");
  d = recipe_datum("req-7:0");
  d.inputs["advantages"].floats[0] = 1.0f;
  EXPECT_EQ(error("alice", "session-x-1", d).rfind(
                "data[3].loss_fn_inputs['advantages'][0] = 1.000000 at a "
                "prompt position (data[3].loss_fn_input_spans[0])",
                0),
            0u);
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
