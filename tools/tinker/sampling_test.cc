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
  ASSERT_EQ(in.options.stop.size(), 1u);
  EXPECT_EQ(in.options.stop[0], (std::vector<int64_t>{'a', 'b'}));
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
  r["sampling_params"]["stop"] = "\n";
  EXPECT_EQ(parse_sample_request(r, 0).options.stop,
            (std::vector<std::vector<int64_t>>{{10}}));
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
  r["topk_prompt_logprobs"] = 3;
  EXPECT_NE(error_of(r).find("topk_prompt_logprobs is not served"),
            std::string::npos);
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
