// HfCheckpointSource over folders written here: single and sharded files,
// F32/BF16/F16 ranges widened exactly, and every refusal. The folders that
// transformers writes are read in models/hf_parity_test.sh.
#include "engine/hf_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "engine/safetensors.h"

namespace zerostep {
namespace {

namespace fs = std::filesystem;

std::string bytes_of(const void* p, size_t n) {
  return std::string(static_cast<const char*>(p), n);
}

std::string f32_bytes(const std::vector<float>& v) {
  return bytes_of(v.data(), v.size() * 4);
}

std::string u16_bytes(const std::vector<uint16_t>& v) {
  return bytes_of(v.data(), v.size() * 2);
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

class HfCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void write_safetensors(const std::string& name, const SafetensorsFile& f) {
    write_file(dir_ / name, encode_safetensors(f, name));
  }
  std::string dir() const { return dir_.string(); }
  fs::path dir_;
};

std::vector<float> iota(int n, float start) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + 0.25f * i;
  return v;
}

TEST_F(HfCheckpointTest, ReadsAnyRangeOfEachDtypeExactly) {
  const std::vector<float> w = iota(24, -3.0f);
  // bf16 and f16 bit patterns with their exact float values (subnormal,
  // negative, large).
  const std::vector<uint16_t> bf = {0x3f80, 0xc040, 0x0001, 0x7f7f, 0x8000};
  const std::vector<uint16_t> hf = {0x3c00, 0xc200, 0x0001, 0x7bff, 0x03ff};
  SafetensorsFile f;
  f.tensors.push_back({"model.w", "F32", {4, 6}, f32_bytes(w)});
  f.tensors.push_back({"model.b", "BF16", {5}, u16_bytes(bf)});
  f.tensors.push_back({"model.h", "F16", {5}, u16_bytes(hf)});
  write_safetensors(kHfWeightsFile, f);

  HfCheckpointSource source(dir());
  EXPECT_EQ(source.tensors().size(), 3u);
  EXPECT_EQ(source.tensor("model.w").shape, (std::vector<int64_t>{4, 6}));
  std::vector<float> out(24, 99.0f);
  source.read("model.w", 0, 24, out.data());
  EXPECT_EQ(out, w);
  std::fill(out.begin(), out.end(), 99.0f);
  source.read("model.w", 7, 5, out.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], w[7 + i]);
  EXPECT_EQ(out[5], 99.0f);  // nothing beyond the range is written

  source.read("model.b", 1, 4, out.data());
  EXPECT_EQ(out[0], -3.0f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -133));  // bf16's smallest subnormal
  EXPECT_EQ(out[2], 0x1.fep127f);
  EXPECT_TRUE(std::signbit(out[3]) && out[3] == 0.0f);

  source.read("model.h", 0, 5, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));  // f16's smallest subnormal
  EXPECT_EQ(out[3], 65504.0f);               // f16's largest
  EXPECT_EQ(out[4], std::ldexp(1023.0f, -24));
  source.read("model.h", 5, 0, nullptr);  // an empty range at the end
}

TEST_F(HfCheckpointTest, LongBf16RangesCrossConversionChunks) {
  // More than one 64 Ki-element chunk, starting at an odd element.
  const int n = 150'000;
  std::vector<uint16_t> bits(n);
  for (int i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(0x3f80 + i % 97);
  SafetensorsFile f;
  f.tensors.push_back({"big", "BF16", {static_cast<uint64_t>(n)}, u16_bytes(bits)});
  write_safetensors(kHfWeightsFile, f);
  HfCheckpointSource source(dir());
  std::vector<float> out(n - 3);
  source.read("big", 3, n - 3, out.data());
  for (int i = 0; i < n - 3; ++i)
    ASSERT_EQ(out[i], bf16_to_float(bits[i + 3])) << i;
}

TEST_F(HfCheckpointTest, ShardedFolderFollowsItsIndex) {
  SafetensorsFile a, b;
  a.tensors.push_back({"x", "F32", {3}, f32_bytes({1, 2, 3})});
  // A stale copy of "y" in the first shard: the index says the second.
  a.tensors.push_back({"y", "F32", {1}, f32_bytes({-1})});
  b.tensors.push_back({"y", "F32", {2}, f32_bytes({4, 5})});
  write_safetensors("model-00001-of-00002.safetensors", a);
  write_safetensors("model-00002-of-00002.safetensors", b);
  write_file(dir_ / kHfWeightsIndexFile,
             R"({"metadata": {"total_size": 20}, "weight_map": {
                 "x": "model-00001-of-00002.safetensors",
                 "y": "model-00002-of-00002.safetensors"}})");
  // The index wins over a single file beside it.
  SafetensorsFile stale;
  stale.tensors.push_back({"z", "F32", {1}, f32_bytes({0})});
  write_safetensors(kHfWeightsFile, stale);

  HfCheckpointSource source(dir());
  EXPECT_EQ(source.tensors().size(), 2u);
  EXPECT_FALSE(source.contains("z"));
  float out[3];
  source.read("x", 0, 3, out);
  EXPECT_EQ(out[2], 3.0f);
  source.read("y", 0, 2, out);
  EXPECT_EQ(out[0], 4.0f);
  EXPECT_EQ(out[1], 5.0f);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(HfCheckpointTest, BadReadsAreUsageErrorsNamingTheTensor) {
  SafetensorsFile f;
  f.tensors.push_back({"w", "F32", {2, 2}, f32_bytes({1, 2, 3, 4})});
  f.tensors.push_back({"steps", "I64", {1}, std::string(8, '\0')});
  write_safetensors(kHfWeightsFile, f);
  HfCheckpointSource source(dir());
  float out[8];
  EXPECT_THROW(source.read("nope", 0, 1, out), UsageError);
  EXPECT_NE(error_of([&] { source.read("nope", 0, 1, out); }).find("'nope'"),
            std::string::npos);
  EXPECT_THROW(source.read("w", 3, 2, out), UsageError);
  EXPECT_THROW(source.read("w", -1, 1, out), UsageError);
  EXPECT_THROW(source.read("w", 0, -1, out), UsageError);
  EXPECT_NE(error_of([&] { source.read("w", 3, 2, out); })
                .find("outside its 4 elements"),
            std::string::npos);
  const std::string e = error_of([&] { source.read("steps", 0, 1, out); });
  EXPECT_NE(e.find("I64"), std::string::npos) << e;
  EXPECT_NE(e.find("F32, BF16 or F16"), std::string::npos) << e;
}

TEST_F(HfCheckpointTest, BadFoldersAreIoErrorsNamingThePath) {
  // Empty folder.
  std::string e = error_of([&] { HfCheckpointSource s(dir()); });
  EXPECT_NE(e.find("neither model.safetensors nor"), std::string::npos) << e;

  // A truncated file: its header promises more data than there is.
  SafetensorsFile f;
  f.tensors.push_back({"w", "F32", {4}, f32_bytes({1, 2, 3, 4})});
  std::string bytes = encode_safetensors(f, "m");
  write_file(dir_ / kHfWeightsFile, bytes.substr(0, bytes.size() - 4));
  e = error_of([&] { HfCheckpointSource s(dir()); });
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find(kHfWeightsFile), std::string::npos) << e;

  // An index naming a file outside the folder, a missing shard, a tensor
  // its shard lacks, and one that is not JSON.
  write_file(dir_ / kHfWeightsFile, bytes);
  const auto with_index = [&](const std::string& text) {
    write_file(dir_ / kHfWeightsIndexFile, text);
    return error_of([&] { HfCheckpointSource s(dir()); });
  };
  e = with_index(R"({"weight_map": {"w": "../model.safetensors"}})");
  EXPECT_NE(e.find("not the name of a file in the folder"), std::string::npos)
      << e;
  e = with_index(R"({"weight_map": {"w": "gone.safetensors"}})");
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;
  e = with_index(R"({"weight_map": {"v": "model.safetensors"}})");
  EXPECT_NE(e.find("does not hold it"), std::string::npos) << e;
  e = with_index(R"({"weight_map": )");
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
  e = with_index(R"({"metadata": {}})");
  EXPECT_NE(e.find("no \"weight_map\""), std::string::npos) << e;
}

TEST_F(HfCheckpointTest, ReadsAWholeSafetensorsFile) {
  SafetensorsFile f;
  f.metadata["format"] = "pt";
  f.tensors.push_back({"a.lora_A.weight", "F32", {2, 2}, f32_bytes({1, 2, 3, 4})});
  f.tensors.push_back({"a.lora_B.weight", "BF16", {1}, u16_bytes({0x3f80})});
  write_safetensors("adapter.safetensors", f);
  const SafetensorsFile got =
      read_safetensors_file((dir_ / "adapter.safetensors").string());
  EXPECT_EQ(got.metadata, f.metadata);
  ASSERT_EQ(got.tensors.size(), 2u);
  EXPECT_EQ(got.tensors[1].name, "a.lora_B.weight");
  EXPECT_EQ(got.tensors[1].data, f.tensors[1].data);

  const std::string missing = (dir_ / "none.safetensors").string();
  const std::string e = error_of([&] { read_safetensors_file(missing); });
  EXPECT_NE(e.find("cannot read '" + missing + "'"), std::string::npos) << e;
}

}  // namespace
}  // namespace zerostep
