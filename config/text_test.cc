#include "config/text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace zerostep {
namespace {

using config_text::closest;
using config_text::levenshtein;
using config_text::looks_numeric;
using config_text::nesting_depth;
using config_text::lower;

TEST(ConfigTextTest, LowerFoldsAsciiOnly) {
  EXPECT_EQ(lower("Per_Step_COUNT"), "per_step_count");
  EXPECT_EQ(lower("x1-Y"), "x1-y");
}

TEST(ConfigTextTest, LevenshteinCountsEdits) {
  EXPECT_EQ(levenshtein("", "abc"), 3u);
  EXPECT_EQ(levenshtein("stage", "stage"), 0u);
  EXPECT_EQ(levenshtein("overlap_com", "overlap_comm"), 1u);
  EXPECT_EQ(levenshtein("kitten", "sitting"), 3u);
}

TEST(ConfigTextTest, ClosestIgnoresCaseAndKeepsTheCandidatesSpelling) {
  const std::vector<std::string> keys = {"tensorboard", "wandb"};
  EXPECT_EQ(closest("TensorBoard", {&keys}), "tensorboard");
}

TEST(ConfigTextTest, ClosestAllowsMaxOfTwoAndAThirdOfTheLength) {
  const std::vector<std::string> a = {"abcdefghijkl"};  // 12 letters: 4 edits
  EXPECT_EQ(closest("abcdefghWXYZ", {&a}), "abcdefghijkl");
  EXPECT_EQ(closest("abcdefgVWXYZ", {&a}), "");
  const std::vector<std::string> b = {"lr"};  // short words: 2 edits
  EXPECT_EQ(closest("xy", {&b}), "lr");
  EXPECT_EQ(closest("xyz", {&b}), "");
}

TEST(ConfigTextTest, ClosestPrefersTheFirstOfEquallyCloseCandidates) {
  const std::vector<std::string> first = {"abcd"};
  const std::vector<std::string> second = {"abce"};
  EXPECT_EQ(closest("abcf", {&first, &second}), "abcd");
  EXPECT_EQ(closest("abcf", {&second, &first}), "abce");
}

TEST(ConfigTextTest, NestingDepthCountsBracketsOutsideStrings) {
  EXPECT_EQ(nesting_depth("1"), 0u);
  EXPECT_EQ(nesting_depth("{}"), 1u);
  EXPECT_EQ(nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4u);
  EXPECT_EQ(nesting_depth(R"({"a": "[[[{{{", "b": "\"[[["})"), 1u);
  EXPECT_EQ(nesting_depth(std::string(100000, '[')), 100000u);
}

TEST(ConfigTextTest, ClosestSkipsWordsLongerThanAnyKey) {
  // One edit from a 100-letter key: suggested at 100 letters, not at 101.
  const std::vector<std::string> keys = {std::string(100, 'a')};
  EXPECT_EQ(closest(std::string(99, 'a') + "b", {&keys}), keys[0]);
  EXPECT_EQ(closest(std::string(101, 'a'), {&keys}), "");
}

TEST(ConfigTextTest, LooksNumericOnlyForWholeJsonLikeNumbers) {
  for (const char* s : {"4", "-3", "1e-6", "0.5", ".5", "5e8"})
    EXPECT_TRUE(looks_numeric(s)) << s;
  for (const char* s : {"", " 4", "4 ", "nan", "inf", "x", "4x", "+4"})
    EXPECT_FALSE(looks_numeric(s)) << s;
}

}  // namespace
}  // namespace zerostep
