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
