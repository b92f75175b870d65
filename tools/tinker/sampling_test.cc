#include "tools/tinker/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "common/errors.h"
#include "tools/tinker/tinker_public.pb.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

// What the SDK (tinker 0.38.0) sends for sample(prompt=[1, 2, 3],
// num_samples=2, SamplingParams(max_tokens=5, seed=3, stop=["ab"]),
// include_prompt_logprobs=True).
json sdk_request() {
  return json::parse(R"({
    "num_samples": 2,
    "prompt": {"chunks": [{"tokens": [1, 2, 3], "type": "encoded_text"}]},
    "sampling_params": {"max_tokens": 5, "seed": 3, "stop": ["ab"],
                        "temperature": 1.0, "top_k": -1, "top_p": 1.0},
    "sampling_session_id": "s", "seq_id": 0, "prompt_logprobs": true,
    "topk_prompt_logprobs": 0, "topk_sample_logprobs": 0,
    "prompt_alt_tokens_k": 0, "record_stability_info": false,
    "type": "sample"})");
}

std::string error_of(const json& request) {
  try {
    parse_sample_request(request, 0);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ParseSampleRequest, ReadsTheSdksFields) {
  SampleRequestIn in = parse_sample_request(sdk_request(), 99);
  EXPECT_EQ(in.prompt, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(in.num_samples, 2);
  EXPECT_TRUE(in.max_tokens_given);
  EXPECT_EQ(in.options.max_tokens, 5);
  EXPECT_EQ(in.options.seed, 3u);
  EXPECT_EQ(in.options.top_k, -1);
  EXPECT_TRUE(in.options.prompt_logprobs);
  EXPECT_TRUE(in.options.stop.empty());
  EXPECT_EQ(in.options.stop_strings, (std::vector<std::string>{"ab"}));
}

TEST(ParseSampleRequest, StopFormsAndDefaults) {
  json r = sdk_request();
  r["sampling_params"].erase("seed");
  r["sampling_params"].erase("max_tokens");
  r["sampling_params"]["stop"] = {10, 11};
  SampleRequestIn in = parse_sample_request(r, 99);
  EXPECT_EQ(in.options.seed, 99u);  // absent: the caller's default
  EXPECT_FALSE(in.max_tokens_given);
  EXPECT_EQ(in.options.stop, (std::vector<std::vector<int64_t>>{{10}, {11}}));
  EXPECT_TRUE(in.options.stop_strings.empty());
  r["sampling_params"]["stop"] = "\n";
  EXPECT_EQ(parse_sample_request(r, 0).options.stop_strings,
            (std::vector<std::string>{"\n"}));
  r["sampling_params"].erase("stop");
  EXPECT_TRUE(parse_sample_request(r, 0).options.stop.empty());
}

TEST(ParseSampleRequest, BadFieldsNameThemselves) {
  json r = sdk_request();
  r["sampling_params"]["temperature"] = nullptr;  // the SDK's NaN
  EXPECT_NE(error_of(r).find("'sampling_params.temperature' is null"),
            std::string::npos)
      << error_of(r);
  r = sdk_request();
  r["sampling_params"]["stop"] = json::array({"a", 1});
  EXPECT_NE(error_of(r).find("not a mix"), std::string::npos) << error_of(r);
  r = sdk_request();
  r["topk_prompt_logprobs"] = -3;
  EXPECT_EQ(error_of(r),
            "topk_prompt_logprobs = -3 must be >= 0 (0: not asked)");
  r = sdk_request();
  r["prompt"]["chunks"][0]["type"] = "image";
  EXPECT_NE(error_of(r).find("prompt chunk 0 has type 'image'"),
            std::string::npos);
  r = sdk_request();
  r.erase("prompt");
  EXPECT_NE(error_of(r).find("missing field 'prompt'"), std::string::npos);
  r = sdk_request();
  r["prompt_logprobs_last_n"] = 3;  // prompt of 3: at most 2
  EXPECT_NE(error_of(r).find("prompt_logprobs_last_n = 3 must be in [1, "),
            std::string::npos)
      << error_of(r);
}

TEST(ParseSampleRequest, LogprobFieldsAndTheirRules) {
  json r = sdk_request();
  r["topk_prompt_logprobs"] = 4;
  r["topk_sample_logprobs"] = 2;
  r["prompt_alt_tokens_k"] = 3;
  r["record_stability_info"] = true;
  // Dense [len(prompt) - 1, K] = [2, 2], -1 asks nothing.
  r["target_prompt_logprobs"] = {
      {"data", {7, -1, 9, 250}}, {"dtype", "int64"}, {"shape", {2, 2}}};
  SampleRequestIn in = parse_sample_request(r, 0);
  EXPECT_EQ(in.topk_prompt, 4);
  EXPECT_EQ(in.topk_sample, 2);
  EXPECT_EQ(in.alt_tokens_k, 3);
  EXPECT_TRUE(in.record_stability_info);
  ASSERT_TRUE(in.target_prompt.has_value());
  EXPECT_FALSE(in.target_prompt->sparse);
  EXPECT_EQ(in.target_prompt->values, (std::vector<int64_t>{7, -1, 9, 250}));
  check_logprob_requests(in, 256);
  EXPECT_THROW(check_logprob_requests(in, 200), UsageError);  // id 250
  // The SDK's sparse CSR form (from_torch_sparse(ids, pad_value=-1)).
  r["target_prompt_logprobs"] = {{"data", {9}},
                                 {"dtype", "int64"},
                                 {"shape", {2, 3}},
                                 {"sparse_crow_indices", {0, 0, 1}},
                                 {"sparse_col_indices", {2}}};
  in = parse_sample_request(r, 0);
  EXPECT_TRUE(in.target_prompt->sparse);
  auto target_error = [&](json t) {
    json q = sdk_request();
    q["target_prompt_logprobs"] = std::move(t);
    return error_of(q);
  };
  EXPECT_EQ(target_error({{"data", {1, 2}}, {"dtype", "int64"},
                          {"shape", {3, 1}}}),
            "target_prompt_logprobs has shape [3, 1] (it must be an int64 "
            "tensor of shape [len(prompt) - 1, K] = [2, K], dense or sparse "
            "CSR)");
  EXPECT_EQ(target_error({{"data", {-1, -1}}, {"dtype", "int64"},
                          {"shape", {2, 1}}}),
            "target_prompt_logprobs names no token id (every cell is -1). "
            "Fix: name at least one, or leave the field unset");
  EXPECT_NE(target_error({{"data", {1.5, 2}}, {"dtype", "float32"},
                          {"shape", {2, 1}}})
                .find("has dtype 'float32'"),
            std::string::npos);
  EXPECT_NE(target_error({{"data", {9}},
                          {"dtype", "int64"},
                          {"shape", {2, 3}},
                          {"sparse_crow_indices", {0, 1, 0}},
                          {"sparse_col_indices", {2}}})
                .find("is not a consistent CSR tensor"),
            std::string::npos);
  in = parse_sample_request(sdk_request(), 0);
  in.topk_prompt = 257;
  try {
    check_logprob_requests(in, 256);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "topk_prompt_logprobs = 257 exceeds the model's vocabulary of "
              "256 tokens");
  }
}

// Note [Prompt and top-k logprobs]: every extra equals the log-softmax of a
// full forward (TinyGptImpl::forward) of the tokens concerned, bit for
// bit, at the right positions; top-k rows are that row sorted (stable,
// descending).
class SampleExtrasTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TinyGptOptions o;
    o.vocab_size = 256;
    o.block_size = 32;
    torch::manual_seed(11);
    net = TinyGpt(o);
    for (torch::Tensor& p : net->parameters()) p.set_requires_grad(false);
    in.prompt = {104, 101, 108, 108, 111, 32};
    in.num_samples = 2;
    in.options.max_tokens = 5;
    in.options.seed = 7;
    out = zerostep::sample(net, in.prompt, in.num_samples, in.options);
  }

  torch::Tensor full(const std::vector<int64_t>& tokens) {
    torch::NoGradGuard g;
    return torch::log_softmax(
        net->forward(torch::tensor(tokens, torch::kInt64).view({1, -1}))[0],
        -1);
  }

  TinyGpt net{nullptr};
  SampleRequestIn in;
  SampleOutput out;
};

TEST_F(SampleExtrasTest, TopkPromptRowsAreTheFullForwardsSortedRows) {
  in.topk_prompt = 5;
  const SampleExtras x = compute_sample_extras(*net, in, out);
  ASSERT_TRUE(x.topk_prompt.has_value());
  const TopkRows& t = *x.topk_prompt;
  ASSERT_EQ(t.length, 6);
  ASSERT_EQ(t.k, 5);
  const torch::Tensor lp = full(in.prompt);
  for (int64_t j = 0; j < 5; ++j) {  // row 0: no context
    EXPECT_EQ(t.ids[j], 0);
    EXPECT_EQ(t.logprobs[j], -99999.0f);
  }
  for (int64_t p = 1; p < 6; ++p) {
    const auto sorted = torch::sort(lp[p - 1], true, 0, true);
    for (int64_t j = 0; j < 5; ++j) {
      EXPECT_EQ(t.logprobs[p * 5 + j], std::get<0>(sorted)[j].item<float>());
      EXPECT_EQ(t.ids[p * 5 + j], std::get<1>(sorted)[j].item<int64_t>());
      // Its logprob is the row's entry for that id, exactly.
      EXPECT_EQ(t.logprobs[p * 5 + j],
                lp[p - 1][t.ids[p * 5 + j]].item<float>());
    }
  }
  // prompt_logprobs_last_n = 2: only the last two rows.
  in.prompt_logprobs_last_n = 2;
  const TopkRows last = *compute_sample_extras(*net, in, out).topk_prompt;
  for (int64_t p = 0; p < 4; ++p) EXPECT_EQ(last.logprobs[p * 5], -99999.0f);
  for (int64_t i = 20; i < 30; ++i) EXPECT_EQ(last.ids[i], t.ids[i]);
}

TEST_F(SampleExtrasTest, TopkSampleRowsFollowEachSequence) {
  in.topk_sample = 3;
  const SampleExtras x = compute_sample_extras(*net, in, out);
  ASSERT_EQ(x.topk_sample.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    // The prompt and every sampled token but the last (the forward the
    // server runs; the same shapes, so the same bits).
    std::vector<int64_t> seq = in.prompt;
    seq.insert(seq.end(), out.sequences[s].tokens.begin(),
               out.sequences[s].tokens.end() - 1);
    const torch::Tensor lp = full(seq);
    const TopkRows& t = x.topk_sample[s];
    ASSERT_EQ(t.length, static_cast<int64_t>(out.sequences[s].tokens.size()));
    for (int64_t i = 0; i < t.length; ++i) {
      const auto sorted = torch::sort(lp[5 + i], true, 0, true);
      for (int64_t j = 0; j < 3; ++j) {
        EXPECT_EQ(t.ids[i * 3 + j], std::get<1>(sorted)[j].item<int64_t>());
        EXPECT_EQ(t.logprobs[i * 3 + j], std::get<0>(sorted)[j].item<float>());
      }
      // The sampled token's logprob (KV-cached decoding) agrees within
      // float rounding of other matmul shapes.
      EXPECT_NEAR(lp[5 + i][out.sequences[s].tokens[i]].item<float>(),
                  out.sequences[s].logprobs[i], 1e-5);
    }
  }
}

TEST_F(SampleExtrasTest, TargetLogprobsScorePositionIPlusOneInAnyLayout) {
  // Dense [5, 2]; row i scores prompt position i + 1.
  IdTable ids;
  ids.rows = 5;
  ids.cols = 2;
  ids.values = {1, 2, -1, 200, 3, 4, 5, -1, 104, 105};
  in.target_prompt = ids;
  SampleExtras x = compute_sample_extras(*net, in, out);
  const torch::Tensor lp = full(in.prompt);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t id = ids.values[i * 2 + j];
      EXPECT_EQ(x.target_logprobs[i * 2 + j],
                id == -1 ? 0.0f : lp[i][id].item<float>())
          << i << "," << j;
    }
  // CSR: cells [1, 1] = 200 and [4, 0] = 104.
  IdTable csr;
  csr.rows = 5;
  csr.cols = 2;
  csr.sparse = true;
  csr.values = {200, 104};
  csr.crow = {0, 0, 1, 1, 1, 2};
  csr.col = {1, 0};
  in.target_prompt = csr;
  x = compute_sample_extras(*net, in, out);
  EXPECT_EQ(x.target_logprobs,
            (std::vector<float>{lp[1][200].item<float>(),
                                lp[4][104].item<float>()}));
  tinker_public::SampleResponse r;
  ASSERT_TRUE(r.ParseFromString(encode_sample_response(out, x)));
  ASSERT_TRUE(r.target_prompt_logprobs().has_sparse_csr());
  EXPECT_EQ(r.target_prompt_logprobs().sparse_csr().crow_indices().size(),
            6 * sizeof(int64_t));
  EXPECT_EQ(r.target_prompt_logprobs().shape_size(), 2);
}

TEST_F(SampleExtrasTest, AltTokensAreSeededDrawsWithTheirLogprobs) {
  in.alt_tokens_k = 3;
  const SampleExtras a = compute_sample_extras(*net, in, out);
  ASSERT_EQ(a.alt_tokens.size(), 15u);
  const torch::Tensor lp = full(in.prompt);
  for (size_t c = 0; c < 15; ++c)
    EXPECT_EQ(a.alt_logprobs[c], lp[c / 3][a.alt_tokens[c]].item<float>());
  EXPECT_EQ(compute_sample_extras(*net, in, out).alt_tokens, a.alt_tokens);
  // Temperature 0: every draw is the row's argmax (lowest id on ties).
  in.options.temperature = 0.0;
  const SampleExtras g = compute_sample_extras(*net, in, out);
  for (size_t c = 0; c < 15; ++c)
    EXPECT_EQ(g.alt_tokens[c], lp[c / 3].argmax().item<int64_t>());
  tinker_public::SampleResponse r;
  ASSERT_TRUE(r.ParseFromString(encode_sample_response(out, a)));
  EXPECT_EQ(r.prompt_alt_tokens().tokens().dtype(), tinker_public::DTYPE_INT64);
  EXPECT_EQ(r.prompt_alt_tokens().tokens().dense().size(), 15 * 8u);
  EXPECT_EQ(r.prompt_alt_tokens().logprobs().shape(1), 3);
}

TEST(EncodeSampleResponse, TheSdksWireFormat) {
  SampleOutput out;
  out.sequences.resize(2);
  out.sequences[0].tokens = {5, 250};
  out.sequences[0].logprobs = {-0.5f, -1.25f};
  out.sequences[0].stopped = true;
  out.sequences[1].tokens = {7};
  out.sequences[1].logprobs = {-2.0f};
  out.prompt_logprobs = {std::numeric_limits<float>::quiet_NaN(), -3.0f};
  tinker_public::SampleResponse r;
  ASSERT_TRUE(r.ParseFromString(encode_sample_response(out)));
  ASSERT_EQ(r.sequences_size(), 2);
  EXPECT_EQ(r.sequences(0).stop_reason(), tinker_public::STOP_REASON_STOP);
  EXPECT_EQ(r.sequences(1).stop_reason(), tinker_public::STOP_REASON_LENGTH);
  const std::string& t = r.sequences(0).tokens();
  ASSERT_EQ(t.size(), 8u);  // int32 each
  int32_t second = 0;
  std::memcpy(&second, t.data() + 4, 4);
  EXPECT_EQ(second, 250);
  ASSERT_EQ(r.sequences(0).logprobs().size(), 8u);  // float32 each
  float lp = 0;
  std::memcpy(&lp, r.sequences(0).logprobs().data() + 4, 4);
  EXPECT_EQ(lp, -1.25f);
  ASSERT_EQ(r.prompt_logprobs().size(), 8u);
  float first = 0;
  std::memcpy(&first, r.prompt_logprobs().data(), 4);
  EXPECT_TRUE(std::isnan(first));
  out.prompt_logprobs.clear();  // not asked for: absent
  ASSERT_TRUE(r.ParseFromString(encode_sample_response(out)));
  EXPECT_TRUE(r.prompt_logprobs().empty());
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
