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

// Note [Integer fields]: nlohmann's get<int64_t>() made 2.5 into 2, 1e30
// into undefined behaviour, -1 into 2^64 - 1 for a uint64_t, and true
// into 1.
TEST(GetOr, AnIntegerFieldIsNeverRoundedWrappedOrReadFromABoolean) {
  const auto error_of = [](const std::string& body, auto fallback) {
    return usage_error([&] {
      get_or<decltype(fallback)>(json::parse(body), "n", fallback, "p.");
    });
  };
  const std::string fraction = error_of(R"({"n": 2.5})", int64_t{1});
  EXPECT_NE(fraction.find("field 'p.n' = 2.5 is not a whole number: it must "
                          "be an integer from -9223372036854775808 to "
                          "9223372036854775807"),
            std::string::npos)
      << fraction;
  for (const char* body :
       {R"({"n": 1e30})", R"({"n": -1e30})", R"({"n": 9223372036854775808})",
        R"({"n": 18446744073709551615})", R"({"n": 9.3e18})"}) {
    const std::string e = error_of(body, int64_t{1});
    EXPECT_NE(e.find("is out of range"), std::string::npos) << body << e;
  }
  for (const char* body :
       {R"({"n": -1})", R"({"n": -1.0})", R"({"n": 18446744073709551616})",
        R"({"n": 2e19})"}) {
    const std::string e = error_of(body, uint64_t{1});
    EXPECT_NE(e.find("it must be an integer from 0 to 18446744073709551615"),
              std::string::npos)
        << body << e;
  }
  for (const char* body : {R"({"n": 2147483648})", R"({"n": -2147483649})"})
    EXPECT_NE(error_of(body, int{1}).find("is out of range"), std::string::npos)
        << body;
  for (const char* body :
       {R"({"n": true})", R"({"n": "3"})", R"({"n": [3]})"}) {
    EXPECT_NE(error_of(body, int64_t{1}).find("has the wrong type"),
              std::string::npos)
        << body;
    EXPECT_NE(error_of(body, 1.0).find("has the wrong type"), std::string::npos)
        << body;
  }
}

TEST(GetOr, AnIntegerFieldTakesEveryIntegerItsTypeHolds) {
  const auto read = [](const std::string& body, auto fallback) {
    return get_or<decltype(fallback)>(json::parse(body), "n", fallback);
  };
  EXPECT_EQ(read(R"({"n": 2.0})", int64_t{1}), 2);
  EXPECT_EQ(read(R"({"n": -3})", int64_t{1}), -3);
  EXPECT_EQ(read(R"({"n": 9223372036854775807})", int64_t{1}),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(read(R"({"n": -9223372036854775808})", int64_t{1}),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(read(R"({"n": -9.223372036854775808e18})", int64_t{1}),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(read(R"({"n": 18446744073709551615})", uint64_t{1}),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(read(R"({"n": 2147483647})", int{1}), 2147483647);
  EXPECT_EQ(read(R"({"n": 7})", uint64_t{1}), 7u);
  // Built in code, a positive integer is stored signed.
  EXPECT_EQ(get_or<int>(json{{"n", int64_t{5}}}, "n", 1), 5);
  EXPECT_NE(usage_error([] {
              get_or<int>(json{{"n", int64_t{1} << 40}}, "n", 1);
            }),
            "");
  EXPECT_EQ(read(R"({"n": 0.5})", 1.0), 0.5);
}

TEST(GetInt64, OnlyAnIntegerThatAnInt64Holds) {
  int64_t out = 42;
  EXPECT_TRUE(get_int64(json::parse(R"({"seq_id": 9223372036854775807})"),
                        "seq_id", &out));
  EXPECT_EQ(out, std::numeric_limits<int64_t>::max());
  out = 42;
  for (const char* body :
       {R"({"seq_id": 9223372036854775808})", R"({"seq_id": 2.0})",
        R"({"seq_id": "3"})", R"({"seq_id": true})", R"({})", R"([1])"}) {
    EXPECT_FALSE(get_int64(json::parse(body), "seq_id", &out)) << body;
    EXPECT_EQ(out, 42) << body;
  }
  EXPECT_TRUE(get_int64(json::parse(R"({"seq_id": -4})"), "seq_id", &out));
  EXPECT_EQ(out, -4);
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
