#include "common/errors.h"

#include <gtest/gtest.h>

namespace zerostep {
namespace {

TEST(ConfigErrorTest, ListsEveryProblemWithKeyValueRuleAndFix) {
  ConfigError e({{"zero_optimization.stage", "7", "must be 0, 1, 2 or 3",
                  "set it to one of 0, 1, 2, 3"},
                 {"train_batch_size", "", "is required", "give it"}});
  std::string what = e.what();
  EXPECT_NE(what.find("2 problems"), std::string::npos) << what;
  EXPECT_NE(what.find("zero_optimization.stage = 7: must be 0, 1, 2 or 3"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("Fix: give it"), std::string::npos) << what;
  EXPECT_EQ(e.problems().size(), 2u);
}

TEST(ElideTest, KeepsShortTextAndCutsLongTextAtACharacterBoundary) {
  EXPECT_EQ(elide("abc", 3), "abc");
  const std::string x(100, 'x');
  EXPECT_EQ(elide(x, 30), std::string(15, 'x') + "... (100 bytes)");
  // "é" is two bytes (C3 A9); a cut between them backs off before it.
  const std::string accented =
      std::string(13, 'a') + "\xC3\xA9" + std::string(20, 'z');
  EXPECT_EQ(elide(accented, 28), std::string(13, 'a') + "... (35 bytes)");
  // Eliding again keeps the original size.
  EXPECT_EQ(elide(elide(x, 30), 30), elide(x, 30));
}

TEST(ConfigErrorTest, LongKeysAndValuesAreCutInTheMessageAndTheProblems) {
  const std::string huge(1 << 20, 'v');
  ConfigError e({{std::string(5000, 'k'), huge, "is not a key", "remove it"}});
  const std::string what = e.what();
  EXPECT_LT(what.size(), 1000u) << what.substr(0, 200);
  EXPECT_NE(what.find("... (1048576 bytes)"), std::string::npos);
  EXPECT_NE(what.find("... (5000 bytes)"), std::string::npos);
  EXPECT_LE(e.problems()[0].value.size(), kConfigProblemFieldBytes);
  EXPECT_NE(what.find("Fix: remove it"), std::string::npos);
  // Rethrown with a source (as load_config_file does): the sizes stay true.
  const std::string again = ConfigError(e.problems(), "f.json").what();
  EXPECT_NE(again.find("... (1048576 bytes)"), std::string::npos);
}

TEST(CheckTest, FailingCheckThrowsInternalErrorNamingTheCondition) {
  int x = 3;
  try {
    ZS_CHECK_MSG(x == 4, "x is " << x);
    FAIL() << "ZS_CHECK_MSG did not throw";
  } catch (const InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("x == 4"), std::string::npos) << what;
    EXPECT_NE(what.find("x is 3"), std::string::npos) << what;
  }
}

TEST(CheckTest, PassingCheckDoesNothing) { EXPECT_NO_THROW(ZS_CHECK(1 + 1 == 2)); }

}  // namespace
}  // namespace zerostep
