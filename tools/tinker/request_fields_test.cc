#include "tools/tinker/request_fields.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

using nlohmann::json;

// The message of the UsageError `f` throws ("" when it throws none).
template <typename F>
std::string usage_error(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(GetOr, MissingFieldTakesItsDefault) {
  EXPECT_EQ(get_or<double>(json::object(), "learning_rate", 1e-4), 1e-4);
  EXPECT_EQ(get_or<double>(json(), "learning_rate", 1e-4), 1e-4);
  EXPECT_EQ(get_or<double>(json{{"learning_rate", 0.5}}, "learning_rate", 1e-4),
            0.5);
}

// The SDK serializes float('nan') and float('inf') as JSON null.
TEST(GetOr, NullNumberIsAnErrorNamingTheField) {
  const json p = {{"learning_rate", nullptr}};
  const std::string e = usage_error(
      [&] { get_or<double>(p, "learning_rate", 1e-4, "adam_params."); });
  EXPECT_NE(e.find("adam_params.learning_rate"), std::string::npos) << e;
  EXPECT_NE(e.find("null"), std::string::npos) << e;
  EXPECT_NE(usage_error([&] { get_or<int64_t>(p, "learning_rate", 1); }), "");
}

TEST(GetOr, NonFiniteNumberIsAnError) {
  for (double bad : {std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    const json p = {{"beta1", bad}};
    const std::string e =
        usage_error([&] { get_or<double>(p, "beta1", 0.9, "adam_params."); });
    EXPECT_NE(e.find("adam_params.beta1"), std::string::npos) << e;
  }
}

TEST(GetOr, NullOfOtherTypesTakesItsDefault) {
  const json j = {{"overwrite", nullptr}, {"type", nullptr}};
  EXPECT_TRUE(get_or<bool>(j, "overwrite", true));
  EXPECT_EQ(get_or<std::string>(j, "type", "adamw"), "adamw");
}

TEST(GetOr, WrongTypeIsAnErrorNamingTheField) {
  const std::string e = usage_error([] {
    get_or<double>(json{{"eps", "small"}}, "eps", 1e-8, "adam_params.");
  });
  EXPECT_NE(e.find("adam_params.eps"), std::string::npos) << e;
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
