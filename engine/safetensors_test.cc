// The safetensors encoding: the header's layout and padding, offsets, and
// every malformed file refused with an IoError that says why.
#include "engine/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/errors.h"

namespace zerostep {
namespace {

std::string floats(std::initializer_list<float> values) {
  std::string out;
  for (float v : values)
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

SafetensorsFile two_tensors() {
  SafetensorsFile f;
  f.tensors.push_back(
      {"layer.weight", "F32", {2, 3}, floats({1, 2, 3, 4, 5, 6})});
  f.tensors.push_back({"a.bias", "BF16", {1}, std::string("\x80\x3f", 2)});
  f.metadata["format"] = "pt";
  return f;
}

uint64_t header_length(const std::string& bytes) {
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[b])) << (8 * b);
  return n;
}

// A file whose header is `header` (padded as the writer pads) and whose
// data is `data`.
std::string file_with(const std::string& header, const std::string& data) {
  std::string json = header;
  std::string out;
  const uint64_t n = json.size();
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(n >> (8 * b)));
  return out + json + data;
}

// The IoError's message decoding `bytes` gives ("" if none).
std::string decode_error(const std::string& bytes) {
  try {
    decode_safetensors(bytes, "m.safetensors");
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsTest, HeaderIsPaddedWithSpacesAndTensorsFollowInOrder) {
  const std::string bytes = encode_safetensors(two_tensors(), "m");
  const uint64_t n = header_length(bytes);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 24 + 2);
  const std::string header = bytes.substr(8, n);
  const size_t end = header.find_last_not_of(' ');
  EXPECT_LT(n - (end + 1), 8u);  // at most 7 spaces of padding
  EXPECT_EQ(header[end], '}');
  const nlohmann::ordered_json h = nlohmann::ordered_json::parse(header);
  // Entries in the order given, metadata first; offsets without gaps.
  std::vector<std::string> keys;
  for (const auto& [k, v] : h.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "layer.weight",
                                            "a.bias"}));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["layer.weight"]["dtype"], "F32");
  EXPECT_EQ(h["layer.weight"]["shape"], nlohmann::ordered_json({2, 3}));
  EXPECT_EQ(h["layer.weight"]["data_offsets"], nlohmann::ordered_json({0, 24}));
  EXPECT_EQ(h["a.bias"]["data_offsets"], nlohmann::ordered_json({24, 26}));
  EXPECT_EQ(bytes.substr(8 + n, 24), floats({1, 2, 3, 4, 5, 6}));
}

TEST(SafetensorsTest, RoundTrips) {
  const SafetensorsFile in = two_tensors();
  const SafetensorsFile out =
      decode_safetensors(encode_safetensors(in, "m"), "m");
  ASSERT_EQ(out.tensors.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out.tensors[i].name, in.tensors[i].name);
    EXPECT_EQ(out.tensors[i].dtype, in.tensors[i].dtype);
    EXPECT_EQ(out.tensors[i].shape, in.tensors[i].shape);
    EXPECT_EQ(out.tensors[i].data, in.tensors[i].data);
  }
  EXPECT_EQ(out.metadata, in.metadata);
}

TEST(SafetensorsTest, ReadsAFileLaidOutInAnotherOrderWithScalarsAndEmpties) {
  // As the reference writer lays out tensors (not in header order), with a
  // scalar and an empty tensor sharing an offset.
  const std::string data = floats({7}) + floats({1, 2});
  const std::string bytes = file_with(
      "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
      "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}   ",
      data);
  const SafetensorsFile f = decode_safetensors(bytes, "m");
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].name, "a");
  EXPECT_EQ(f.tensors[0].data, floats({7}));
  EXPECT_EQ(f.tensors[1].name, "e");
  EXPECT_EQ(f.tensors[2].name, "b");
  EXPECT_EQ(f.tensors[2].data, floats({1, 2}));
}

TEST(SafetensorsTest, MalformedFilesAreIoErrorsThatSayWhy) {
  const std::string good = encode_safetensors(two_tensors(), "m");
  const std::string f4 = floats({1});
  const auto one = [&](const std::string& entry, const std::string& data) {
    return file_with("{\"x\":" + entry + "}", data);
  };
  struct Case {
    std::string what;
    std::string bytes;
    std::string says;
  };
  const auto with_length = [&](uint64_t length) {
    std::string out = good;
    for (int b = 0; b < 8; ++b) out[b] = static_cast<char>(length >> (8 * b));
    return out;
  };
  const std::string long_header = with_length(good.size() - 7);
  const std::string huge_header = with_length(uint64_t{1} << 56);
  const std::vector<Case> cases = {
      {"shorter than 8 bytes", "abc", "shorter than its 8-byte header length"},
      {"header length beyond the file", long_header, "bad header length"},
      {"header length above the limit", huge_header, "bad header length"},
      {"not JSON", file_with("{nope", ""), "not valid JSON"},
      {"not an object", file_with("[1]", ""), "not a JSON object"},
      {"empty header", file_with("", ""), "not a JSON object"},
      {"unknown dtype",
       one("{\"dtype\":\"F33\",\"shape\":[1],"
           "\"data_offsets\":[0,4]}",
           f4),
       "unknown dtype 'F33'"},
      {"shape and size disagree",
       one("{\"dtype\":\"F32\",\"shape\":[2],"
           "\"data_offsets\":[0,4]}",
           f4),
       "F32 of shape [2] is 8 bytes"},
      {"negative dimension",
       one("{\"dtype\":\"F32\",\"shape\":[-1],"
           "\"data_offsets\":[0,4]}",
           f4),
       "not a non-negative integer"},
      {"offsets out of range",
       one("{\"dtype\":\"F32\",\"shape\":[1],"
           "\"data_offsets\":[4,8]}",
           f4),
       "beyond its 4 bytes of data"},
      {"offsets reversed",
       one("{\"dtype\":\"F32\",\"shape\":[1],"
           "\"data_offsets\":[8,4]}",
           f4),
       "end before they begin"},
      {"missing field", one("{\"dtype\":\"F32\",\"shape\":[1]}", f4),
       "no \"data_offsets\""},
      {"trailing bytes",
       one("{\"dtype\":\"F32\",\"shape\":[1],"
           "\"data_offsets\":[0,4]}",
           f4 + "xy"),
       "2 trailing bytes"},
      {"a gap",
       one("{\"dtype\":\"F32\",\"shape\":[1],"
           "\"data_offsets\":[4,8]}",
           f4 + f4),
       "leaves bytes [0, 4) of its data unused"},
      {"overlap",
       file_with("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                 "8]},\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":"
                 "[4,8]}}",
                 f4 + f4),
       "overlapping the tensor before it"},
      {"duplicate names",
       file_with("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,"
                 "4]},\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":"
                 "[4,8]}}",
                 f4 + f4),
       "names tensor 'x' twice"},
      {"metadata not strings", file_with("{\"__metadata__\":{\"k\":1}}", ""),
       "value 'k' that is not a string"},
  };
  for (const Case& c : cases) {
    const std::string message = decode_error(c.bytes);
    EXPECT_NE(message.find("'m.safetensors'"), std::string::npos)
        << c.what << ": " << message;
    EXPECT_NE(message.find(c.says), std::string::npos)
        << c.what << ": " << message;
  }
}

TEST(SafetensorsTest, EncodingRefusesWhatCannotBeWritten) {
  SafetensorsFile f = two_tensors();
  f.tensors[0].data.pop_back();
  EXPECT_THROW(encode_safetensors(f, "m"), IoError);
  f = two_tensors();
  f.tensors[1].name = f.tensors[0].name;
  EXPECT_THROW(encode_safetensors(f, "m"), IoError);
  f = two_tensors();
  f.tensors[1].dtype = "F33";
  EXPECT_THROW(encode_safetensors(f, "m"), IoError);
  f = two_tensors();
  f.tensors[1].name = "__metadata__";
  EXPECT_THROW(encode_safetensors(f, "m"), IoError);
}

TEST(SafetensorsTest, Bf16RoundsToNearestEven) {
  const auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return float_to_bf16(f);
  };
  EXPECT_EQ(bits(0x3f800000u), 0x3f80);  // 1.0 exactly
  EXPECT_EQ(bits(0x3f808000u), 0x3f80);  // halfway, even below: down
  EXPECT_EQ(bits(0x3f818000u), 0x3f82);  // halfway, odd below: up
  EXPECT_EQ(bits(0x3f808001u), 0x3f81);  // above halfway: up
  EXPECT_EQ(bits(0x3f807fffu), 0x3f80);  // below halfway: down
  EXPECT_EQ(bits(0x7f7fffffu), 0x7f80);  // the largest float: to +inf
  EXPECT_EQ(bits(0xff800000u), 0xff80);  // -inf
  EXPECT_TRUE(std::isnan(bf16_to_float(bits(0x7f800001u))));  // NaN stays
  EXPECT_EQ(bf16_to_float(0x3fc0), 1.5f);
}

// Every binary16 bit pattern against the compiler's own _Float16
// conversion (GCC's soft-float routine on x86-64): the same float32 bits,
// NaN payloads included.
TEST(SafetensorsTest, F16WidensExactlyForEveryBitPattern) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    _Float16 half;
    std::memcpy(&half, &h, sizeof half);
    const float want = static_cast<float>(half), got = f16_to_float(h);
    uint32_t want_bits, got_bits;
    std::memcpy(&want_bits, &want, 4);
    std::memcpy(&got_bits, &got, 4);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << b;
      // A quiet NaN's payload moves up unchanged; the compiler may quiet a
      // signalling one.
      ASSERT_EQ(got_bits | 0x00400000u, want_bits | 0x00400000u)
          << std::hex << b;
    } else {
      ASSERT_EQ(got_bits, want_bits) << std::hex << b;
    }
  }
}

}  // namespace
}  // namespace zerostep
