#include "config/problems.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace {

class ProblemReporterTest : public ::testing::Test {
 protected:
  std::vector<ConfigProblem> problems_;
  std::vector<std::string> ignored_;
  ProblemReporter report_{&problems_, &ignored_};
};

TEST_F(ProblemReporterTest, AddAppendsInCallOrder) {
  report_.add("a", "1", "rule a", "fix a");
  report_.add("b", "", "rule b", "fix b");
  ASSERT_EQ(report_.size(), 2u);
  EXPECT_EQ(problems_[0].key, "a");
  EXPECT_EQ(problems_[1].key, "b");
  report_.problem(1).fix = "amended";
  EXPECT_EQ(problems_[1].fix, "amended");
}

TEST_F(ProblemReporterTest, IgnoredKeysAreListedOnce) {
  report_.ignore("tensorboard");
  report_.ignore("wandb");
  report_.ignore("tensorboard");
  EXPECT_EQ(ignored_, (std::vector<std::string>{"tensorboard", "wandb"}));
  EXPECT_TRUE(report_.empty());
}

TEST(ProblemReporterNoIgnoreListTest, IgnoreIsABug) {
  std::vector<ConfigProblem> problems;
  ProblemReporter report(&problems, nullptr);
  EXPECT_THROW(report.ignore("x"), InternalError);
}

TEST_F(ProblemReporterTest, UnknownKeyWithAndWithoutASuggestion) {
  report_.unknown_key("colour", ConfigJson("blue"), "ds_config", "");
  report_.unknown_key("zero_optimization.overlap_com", ConfigJson(true),
                      "zero_optimization", "overlap_comm");
  ASSERT_EQ(problems_.size(), 2u);
  EXPECT_EQ(problems_[0].value, "\"blue\"");
  EXPECT_EQ(problems_[0].rule, "is not a ds_config key zerostep knows");
  EXPECT_EQ(problems_[0].fix,
            "remove it; docs/config.md lists every supported key");
  EXPECT_EQ(problems_[1].rule,
            "is not a key zerostep knows in zero_optimization");
  EXPECT_EQ(problems_[1].fix, "did you mean \"overlap_comm\"?");
}

TEST_F(ProblemReporterTest, ReadWholeTakesIntegralFloatsUpTo2To63) {
  EXPECT_EQ(report_.read_whole("k", ConfigJson::parse("5e8"), "n"),
            int64_t{500000000});
  EXPECT_EQ(report_.read_whole("k", ConfigJson::parse("-7"), "n"), int64_t{-7});
  EXPECT_TRUE(report_.empty());
  EXPECT_EQ(report_.read_whole("k", ConfigJson::parse("9.3e18"), "n"),
            std::nullopt);
  EXPECT_EQ(
      report_.read_whole("k", ConfigJson::parse("18446744073709551615"), "n"),
      std::nullopt);
  EXPECT_EQ(report_.read_whole("k", ConfigJson::parse("1.5"), "n"),
            std::nullopt);
  ASSERT_EQ(problems_.size(), 3u);
  EXPECT_EQ(problems_[0].rule, "must be a whole number");
  EXPECT_EQ(problems_[1].rule, "is too large for a 64-bit integer");
  EXPECT_EQ(problems_[2].rule, "must be a whole number");
}

TEST_F(ProblemReporterTest, TypeErrorsNameAutoAndUnquoteNumbers) {
  EXPECT_EQ(report_.read_number("k", ConfigJson("auto"), "a number"),
            std::nullopt);
  EXPECT_EQ(report_.read_number("k", ConfigJson("0.1"), "a number"),
            std::nullopt);
  EXPECT_EQ(report_.read_bool("k", ConfigJson("TRUE")), std::nullopt);
  ASSERT_EQ(problems_.size(), 3u);
  EXPECT_EQ(problems_[0].rule, auto_rule("k"));
  EXPECT_EQ(problems_[0].fix, "write a number");
  EXPECT_EQ(problems_[1].rule, "must be a JSON number");
  EXPECT_EQ(problems_[1].fix, "write 0.1 (a JSON number, no quotes)");
  EXPECT_EQ(problems_[2].fix, "write true (a JSON boolean, no quotes)");
}

TEST(IsAutoTest, AnyLetterCaseOfTheStringOnly) {
  EXPECT_TRUE(is_auto(ConfigJson("auto")));
  EXPECT_TRUE(is_auto(ConfigJson("AUTO")));
  EXPECT_FALSE(is_auto(ConfigJson("automatic")));
  EXPECT_FALSE(is_auto(ConfigJson(nullptr)));
}

}  // namespace
}  // namespace zerostep
