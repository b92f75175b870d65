#include "config/scheduler.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "config/config_test_util.h"

namespace zerostep {
namespace {

using Type = LrScheduleSpec::Type;

TEST(LrScheduleSpecTest, ToString) {
  EXPECT_STREQ(to_string(Type::kNone), "none");
  EXPECT_STREQ(to_string(Type::kWarmupLR), "WarmupLR");
  EXPECT_STREQ(to_string(Type::kWarmupDecayLR), "WarmupDecayLR");
  EXPECT_STREQ(to_string(Type::kWarmupCosineLR), "WarmupCosineLR");
  EXPECT_STREQ(to_string(WarmupType::kLog), "log");
  EXPECT_STREQ(to_string(WarmupType::kLinear), "linear");
}

// --- parse_lr_schedule ---

std::vector<ConfigProblem> parse(const std::string& text, LrScheduleSpec* out) {
  std::vector<ConfigProblem> problems;
  parse_lr_schedule(nlohmann::ordered_json::parse(text), out, &problems);
  return problems;
}

std::vector<ConfigProblem> parse(const std::string& text) {
  LrScheduleSpec spec;
  return parse(text, &spec);
}

// The single problem `text` has (a failure if it has another number).
ConfigProblem only_problem(const std::string& text) {
  std::vector<ConfigProblem> p = parse(text);
  if (p.size() != 1) {
    ADD_FAILURE() << p.size() << " problems in " << text;
    for (const ConfigProblem& q : p) {
      ADD_FAILURE() << "  " << q.key << " = " << q.value << ": " << q.rule
                    << " / " << q.fix;
    }
  }
  return p.empty() ? ConfigProblem{} : p[0];
}

void expect_problem(const ConfigProblem& p, const std::string& key,
                    const std::string& value, const std::string& rule,
                    const std::string& fix) {
  EXPECT_EQ(p.key, key);
  EXPECT_EQ(p.value, value);
  EXPECT_EQ(p.rule, rule);
  EXPECT_EQ(p.fix, fix);
}

// "auto" where the Hugging Face integration fills nothing, and where it
// fills the trainer's value (the schedule's parser is given none).
std::string auto_nothing(const std::string& key) {
  return "\"auto\" stands for a trainer's value only in the keys Hugging "
         "Face's DeepSpeed integration fills (docs/config.md lists them), "
         "and " +
         key + " is not one of them";
}
std::string auto_trainer(const std::string& rule, const std::string& field) {
  return "\"auto\" is the trainer's value: Hugging Face's DeepSpeed "
         "integration fills it with " +
         rule + ", and parse_config was not given TrainerValues::" + field;
}
std::string set_field(const std::string& field, const std::string& write) {
  return "set TrainerValues::" + field +
         " in the trainer values given to parse_config, or " + write;
}

TEST(ParseLrScheduleTest, WarmupLRWithEveryParam) {
  LrScheduleSpec s;
  EXPECT_TRUE(parse(R"({"type": "WarmupLR", "params": {
      "warmup_min_lr": 1e-6, "warmup_max_lr": 0.0003,
      "warmup_num_steps": 500, "warmup_type": "linear",
      "last_batch_iteration": -1}})",
                    &s)
                  .empty());
  EXPECT_EQ(s.type, Type::kWarmupLR);
  EXPECT_EQ(s.warmup_min_lr, 1e-6);
  ASSERT_TRUE(s.warmup_max_lr.has_value());
  EXPECT_EQ(*s.warmup_max_lr, 0.0003);
  EXPECT_EQ(s.warmup_num_steps, 500);
  EXPECT_EQ(s.warmup_type, WarmupType::kLinear);
}

TEST(ParseLrScheduleTest, WarmupDecayLR) {
  LrScheduleSpec s;
  EXPECT_TRUE(parse(R"({"type": "WarmupDecayLR", "params": {
      "total_num_steps": 20000, "warmup_max_lr": 0.001,
      "warmup_num_steps": 100, "warmup_type": "log"}})",
                    &s)
                  .empty());
  EXPECT_EQ(s.type, Type::kWarmupDecayLR);
  EXPECT_EQ(s.total_num_steps, 20000);
  EXPECT_EQ(s.warmup_num_steps, 100);
  EXPECT_EQ(s.warmup_min_lr, 0.0);
  EXPECT_EQ(s.warmup_type, WarmupType::kLog);
}

TEST(ParseLrScheduleTest, WarmupCosineLR) {
  LrScheduleSpec s;
  EXPECT_TRUE(parse(R"({"type": "WarmupCosineLR", "params": {
      "total_num_steps": 1000, "warmup_min_ratio": 0.05,
      "warmup_num_steps": 50, "cos_min_ratio": 0.1}})",
                    &s)
                  .empty());
  EXPECT_EQ(s.type, Type::kWarmupCosineLR);
  EXPECT_EQ(s.total_num_steps, 1000);
  EXPECT_EQ(s.warmup_min_ratio, 0.05);
  EXPECT_EQ(s.warmup_num_steps, 50);
  EXPECT_EQ(s.cos_min_ratio, 0.1);
  EXPECT_EQ(s.warmup_type, WarmupType::kLog);
}

TEST(ParseLrScheduleTest, EmptyParamsKeepDeepSpeedsDefaults) {
  LrScheduleSpec s;
  s.warmup_num_steps = 7;  // parsing starts from the defaults
  EXPECT_TRUE(parse(R"({"type": "WarmupLR", "params": {}})", &s).empty());
  EXPECT_EQ(s.type, Type::kWarmupLR);
  EXPECT_EQ(s.warmup_min_lr, 0.0);
  EXPECT_FALSE(s.warmup_max_lr.has_value());  // WarmupLR: optimizer's lr
  EXPECT_EQ(s.warmup_num_steps, 1000);
  EXPECT_EQ(s.warmup_type, WarmupType::kLog);

  EXPECT_TRUE(parse(R"({"type": "WarmupCosineLR",
                        "params": {"total_num_steps": 10}})",
                    &s)
                  .empty());
  EXPECT_EQ(s.warmup_min_ratio, 0.0);
  EXPECT_EQ(s.cos_min_ratio, 0.0001);
  EXPECT_EQ(s.warmup_num_steps, 1000);
  EXPECT_EQ(s.warmup_type, WarmupType::kLog);
}

TEST(ParseLrScheduleTest, TotalNumStepsMayBeAWholeFloat) {
  LrScheduleSpec s;
  EXPECT_TRUE(parse(R"({"type": "WarmupDecayLR",
                        "params": {"total_num_steps": 1e4}})",
                    &s)
                  .empty());
  EXPECT_EQ(s.total_num_steps, 10000);
}

TEST(ParseLrScheduleTest, PlainJsonOverload) {
  LrScheduleSpec s;
  std::vector<ConfigProblem> problems;
  parse_lr_schedule(nlohmann::json::parse(R"({"type": "WarmupLR",
      "params": {"warmup_num_steps": 10}})"),
                    &s, &problems);
  EXPECT_TRUE(problems.empty());
  EXPECT_EQ(s.warmup_num_steps, 10);
}

TEST(ParseLrScheduleTest, SectionNotAnObject) {
  expect_problem(only_problem(R"("WarmupLR")"), "scheduler", "\"WarmupLR\"",
                 "must be a JSON object",
                 "write { \"type\": \"WarmupLR\", \"params\": { "
                 "\"warmup_num_steps\": 1000 } }, or remove the section for a "
                 "constant lr");
}

TEST(ParseLrScheduleTest, UnknownSectionKeyDidYouMean) {
  std::vector<ConfigProblem> p =
      parse(R"({"type": "WarmupLR", "params": {}, "param": {}})");
  ASSERT_EQ(p.size(), 1u);
  expect_problem(p[0], "scheduler.param", "{}",
                 "is not a key of the scheduler section (DeepSpeed reads only "
                 "\"type\" and \"params\")",
                 "did you mean \"params\"?");
  expect_problem(
      only_problem(R"({"type": "WarmupLR", "params": {}, "enabled": true})"),
      "scheduler.enabled", "true",
      "is not a key of the scheduler section (DeepSpeed reads only \"type\" "
      "and \"params\")",
      "remove it; schedule parameters go in \"params\"");
}

TEST(ParseLrScheduleTest, MissingType) {
  expect_problem(only_problem(R"({"params": {}})"), "scheduler.type", "",
                 "is required when the scheduler section is present (without "
                 "it DeepSpeed silently trains with a constant lr)",
                 "add \"type\": \"WarmupLR\" (or \"WarmupDecayLR\", "
                 "\"WarmupCosineLR\"), or remove the scheduler section");
}

TEST(ParseLrScheduleTest, TypeNotAString) {
  expect_problem(only_problem(R"({"type": 1, "params": {}})"), "scheduler.type",
                 "1", "must be a JSON string",
                 "write \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"");
}

TEST(ParseLrScheduleTest, TypeAuto) {
  expect_problem(only_problem(R"({"type": "auto", "params": {}})"),
                 "scheduler.type", "\"auto\"", auto_nothing("scheduler.type"),
                 "write \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"");
}

TEST(ParseLrScheduleTest, TypeInTheWrongLetterCase) {
  expect_problem(only_problem(R"({"type": "warmuplr", "params": {}})"),
                 "scheduler.type", "\"warmuplr\"",
                 "must be spelt exactly \"WarmupLR\" (DeepSpeed looks the "
                 "class up by name, case-sensitively)",
                 "did you mean \"WarmupLR\"?");
}

TEST(ParseLrScheduleTest, TypeTypoDidYouMean) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupCosinLR", "params": {"total_num_steps": 5}})"),
      "scheduler.type", "\"WarmupCosinLR\"",
      "is not a schedule zerostep implements; supported: WarmupLR, "
      "WarmupDecayLR, WarmupCosineLR",
      "did you mean \"WarmupCosineLR\"?");
}

TEST(ParseLrScheduleTest, TypeUnknownWithoutAGuess) {
  expect_problem(only_problem(R"({"type": "StepLR", "params": {}})"),
                 "scheduler.type", "\"StepLR\"",
                 "is not a schedule zerostep implements; supported: WarmupLR, "
                 "WarmupDecayLR, WarmupCosineLR",
                 "write \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"");
}

TEST(ParseLrScheduleTest, TypeOtherDeepSpeedSchedule) {
  expect_problem(only_problem(R"({"type": "OneCycle", "params": {}})"),
                 "scheduler.type", "\"OneCycle\"",
                 "is a DeepSpeed schedule zerostep does not implement; "
                 "supported: WarmupLR, WarmupDecayLR, WarmupCosineLR",
                 "use one of those, or remove the scheduler section for a "
                 "constant lr");
}

TEST(ParseLrScheduleTest, UnknownTypeStillChecksTheParams) {
  std::vector<ConfigProblem> p = parse(
      R"({"type": "LRRangeTest", "params": {"warmup_num_steps": "x",
                                            "warmup_num_step": 3}})");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].key, "scheduler.type");
  EXPECT_EQ(p[1].key, "scheduler.params.warmup_num_steps");
  expect_problem(p[2], "scheduler.params.warmup_num_step", "3",
                 "is not a parameter of any schedule zerostep implements",
                 "did you mean \"warmup_num_steps\"?");
}

TEST(ParseLrScheduleTest, MissingParams) {
  expect_problem(only_problem(R"({"type": "WarmupLR"})"), "scheduler.params",
                 "",
                 "is required when the scheduler section is present "
                 "(DeepSpeed calls the schedule's constructor with **params "
                 "and fails without it)",
                 "add \"params\": {} to keep every default, or e.g. "
                 "\"params\": { \"warmup_num_steps\": 1000 }");
  // One problem, not also total_num_steps.
  expect_problem(only_problem(R"({"type": "WarmupDecayLR"})"),
                 "scheduler.params", "",
                 "is required when the scheduler section is present "
                 "(DeepSpeed calls the schedule's constructor with **params "
                 "and fails without it)",
                 "add \"params\": { \"total_num_steps\": <optimizer steps in "
                 "the run> }");
}

TEST(ParseLrScheduleTest, ParamsNotAnObject) {
  expect_problem(only_problem(R"({"type": "WarmupLR", "params": [1]})"),
                 "scheduler.params", "[1]", "must be a JSON object",
                 "write { \"warmup_num_steps\": 1000, ... }");
  expect_problem(only_problem(R"({"type": "WarmupLR", "params": "auto"})"),
                 "scheduler.params", "\"auto\"",
                 auto_nothing("scheduler.params"),
                 "write { \"warmup_num_steps\": 1000, ... }");
}

TEST(ParseLrScheduleTest, UnknownParamDidYouMean) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_num_step": 100}})"),
      "scheduler.params.warmup_num_step", "100",
      "is not a parameter of WarmupLR", "did you mean \"warmup_num_steps\"?");
  expect_problem(only_problem(R"({"type": "WarmupCosineLR",
                       "params": {"total_num_steps": 9,
                                  "cos_min_ration": 0.1}})"),
                 "scheduler.params.cos_min_ration", "0.1",
                 "is not a parameter of WarmupCosineLR",
                 "did you mean \"cos_min_ratio\"?");
}

TEST(ParseLrScheduleTest, UnknownParamWithoutAGuess) {
  expect_problem(
      only_problem(R"({"type": "WarmupLR", "params": {"gamma": 0.5}})"),
      "scheduler.params.gamma", "0.5", "is not a parameter of WarmupLR",
      "remove it; WarmupLR takes warmup_min_lr, warmup_max_lr, "
      "warmup_num_steps, warmup_type, last_batch_iteration");
}

TEST(ParseLrScheduleTest, ParamOfAnotherSchedule) {
  expect_problem(
      only_problem(R"({"type": "WarmupCosineLR",
                       "params": {"total_num_steps": 9,
                                  "warmup_max_lr": 0.001}})"),
      "scheduler.params.warmup_max_lr", "0.001",
      "is a parameter of WarmupLR and WarmupDecayLR; WarmupCosineLR does not "
      "take it (DeepSpeed raises TypeError)",
      "remove it: WarmupCosineLR scales optimizer.params.lr by a ratio; set "
      "the peak lr there and the start as warmup_min_ratio");
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"total_num_steps": 100}})"),
      "scheduler.params.total_num_steps", "100",
      "is a parameter of WarmupDecayLR and WarmupCosineLR; WarmupLR does not "
      "take it (DeepSpeed raises TypeError)",
      "remove it, or use \"type\": \"WarmupDecayLR\" to decay after the "
      "warmup");
  expect_problem(
      only_problem(R"({"type": "WarmupDecayLR",
                       "params": {"total_num_steps": 9,
                                  "cos_min_ratio": 0.1}})"),
      "scheduler.params.cos_min_ratio", "0.1",
      "is a parameter of WarmupCosineLR; WarmupDecayLR does not take it "
      "(DeepSpeed raises TypeError)",
      "remove it, or use \"type\": \"WarmupCosineLR\" for ratios of "
      "optimizer.params.lr");
}

TEST(ParseLrScheduleTest, AutoIsRejectedWithTheValueToWrite) {
  std::vector<ConfigProblem> p = parse(R"({"type": "WarmupDecayLR", "params": {
      "warmup_max_lr": "auto", "warmup_num_steps": "auto",
      "total_num_steps": "auto", "warmup_type": "auto"}})");
  ASSERT_EQ(p.size(), 4u);
  expect_problem(p[0], "scheduler.params.warmup_max_lr", "\"auto\"",
                 auto_trainer("learning_rate", "learning_rate"),
                 set_field("learning_rate", "write the peak lr, e.g. 0.001"));
  const std::string warmup = "warmup_steps (or warmup_ratio with total_steps)";
  expect_problem(
      p[1], "scheduler.params.warmup_num_steps", "\"auto\"",
      auto_trainer("warmup_steps when > 0, else ceil(num_training_steps × "
                   "warmup_ratio)",
                   warmup),
      set_field(warmup, "write a positive integer, e.g. 1000"));
  expect_problem(
      p[2], "scheduler.params.total_num_steps", "\"auto\"",
      auto_trainer("num_training_steps", "total_steps"),
      set_field("total_steps",
                "write the number of optimizer steps in the run, e.g. 10000"));
  expect_problem(p[3], "scheduler.params.warmup_type", "\"auto\"",
                 auto_nothing("scheduler.params.warmup_type"),
                 "write \"log\" or \"linear\"");
}

TEST(ParseLrScheduleTest, NumbersInQuotes) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_min_lr": "1e-6"}})"),
      "scheduler.params.warmup_min_lr", "\"1e-6\"",
      "must be a JSON number (the lr at the start of the warmup)",
      "write 1e-6 (a JSON number, no quotes)");
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_num_steps": "100"}})"),
      "scheduler.params.warmup_num_steps", "\"100\"",
      "must be a JSON integer (the number of warmup steps)",
      "write 100 (a JSON number, no quotes)");
  expect_problem(
      only_problem(
          R"({"type": "WarmupDecayLR", "params": {"total_num_steps": "9"}})"),
      "scheduler.params.total_num_steps", "\"9\"",
      "must be a whole JSON number (optimizer steps)",
      "write 9 (a JSON number, no quotes)");
}

TEST(ParseLrScheduleTest, WrongJsonTypes) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_max_lr": true}})"),
      "scheduler.params.warmup_max_lr", "true",
      "must be a JSON number (the lr at the end of the warmup)",
      "write the peak lr, e.g. 0.001");
  expect_problem(
      only_problem(R"({"type": "WarmupCosineLR",
                       "params": {"total_num_steps": 9,
                                  "warmup_min_ratio": {}}})"),
      "scheduler.params.warmup_min_ratio", "{}",
      "must be a JSON number (the ratio of optimizer.params.lr at the start "
      "of the warmup)",
      "write a ratio such as 0 or 0.01");
  expect_problem(
      only_problem(R"({"type": "WarmupLR", "params": {"warmup_type": 1}})"),
      "scheduler.params.warmup_type", "1",
      "must be a JSON string, \"log\" or \"linear\"",
      "write \"log\" or \"linear\"");
}

TEST(ParseLrScheduleTest, PerParamGroupListsAreNotSupported) {
  expect_problem(
      only_problem(R"({"type": "WarmupLR",
                       "params": {"warmup_min_lr": [0, 0]}})"),
      "scheduler.params.warmup_min_lr", "[0,0]",
      "must be a single JSON number (the lr at the start of the warmup); "
      "DeepSpeed's per-parameter-group lists are not supported",
      "write one number, 0 or a small lr, e.g. 1e-6");
}

// null is DeepSpeed's None. WarmupLR reads it as optimizer.params.lr, its
// own default; WarmupDecayLR passes it on to the same code, so there it
// means optimizer.params.lr instead of its default 0.001.
TEST(ParseLrScheduleTest, WarmupMaxLrNullIsWarmupLRsDefaultOnly) {
  LrScheduleSpec s;
  EXPECT_TRUE(
      parse(R"({"type": "WarmupLR", "params": {"warmup_max_lr": null}})", &s)
          .empty());
  EXPECT_EQ(s.warmup_max_lr, std::nullopt);
  expect_problem(
      only_problem(R"({"type": "WarmupDecayLR", "params": {
          "total_num_steps": 10, "warmup_max_lr": null}})"),
      "scheduler.params.warmup_max_lr", "null",
      "null means optimizer.params.lr in DeepSpeed, which zerostep supports "
      "only as WarmupLR's default, not for WarmupDecayLR (whose default is "
      "0.001)",
      "write the peak lr, e.g. the value of optimizer.params.lr, or remove "
      "the key for 0.001");
}

// DeepSpeed warns about an unknown warmup_type and uses "log", its default;
// for None that is the default.
TEST(ParseLrScheduleTest, WarmupTypeNullIsTheDefault) {
  LrScheduleSpec s;
  EXPECT_TRUE(
      parse(R"({"type": "WarmupLR", "params": {"warmup_type": null}})", &s)
          .empty());
  EXPECT_EQ(s.warmup_type, WarmupType::kLog);
  EXPECT_TRUE(parse(R"({"type": "WarmupCosineLR", "params": {
                        "total_num_steps": 10, "warmup_type": null}})",
                    &s)
                  .empty());
  EXPECT_EQ(s.warmup_type, WarmupType::kLog);
}

// Other nulls are no default in DeepSpeed (its arithmetic fails on None).
TEST(ParseLrScheduleTest, OtherNullsAreRejected) {
  std::vector<ConfigProblem> p = parse(R"({"type": "WarmupCosineLR", "params": {
      "total_num_steps": null, "warmup_num_steps": null,
      "cos_min_ratio": null}})");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].key, "scheduler.params.total_num_steps");
  EXPECT_EQ(p[1].key, "scheduler.params.warmup_num_steps");
  EXPECT_EQ(p[2].key, "scheduler.params.cos_min_ratio");
  for (const ConfigProblem& q : p) EXPECT_EQ(q.value, "null");
}

// Other frameworks' names get the DeepSpeed name.
TEST(ParseLrScheduleTest, HuggingFaceNamesGetDidYouMean) {
  std::vector<ConfigProblem> p = parse(R"({"type": "WarmupDecayLR", "params": {
      "num_warmup_steps": 10, "num_training_steps": 100}})");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].key, "scheduler.params.num_warmup_steps");
  EXPECT_EQ(p[0].fix, "did you mean \"warmup_num_steps\"?");
  EXPECT_EQ(p[1].key, "scheduler.params.num_training_steps");
  EXPECT_EQ(p[1].fix, "did you mean \"total_num_steps\"?");
  EXPECT_EQ(p[2].key, "scheduler.params.total_num_steps");  // missing
}

TEST(ParseLrScheduleTest, NegativeValues) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_max_lr": -0.1}})"),
      "scheduler.params.warmup_max_lr", "-0.1",
      "must be a finite number >= 0 (the lr at the end of the warmup)",
      "write the peak lr, e.g. 0.001");
  expect_problem(
      only_problem(R"({"type": "WarmupCosineLR",
                       "params": {"total_num_steps": 9,
                                  "cos_min_ratio": -1}})"),
      "scheduler.params.cos_min_ratio", "-1",
      "must be a finite number >= 0 (the ratio of optimizer.params.lr at the "
      "end of the cosine decay)",
      "write a ratio such as 0.0001 or 0.1");
}

TEST(ParseLrScheduleTest, WarmupNumStepsMustBeAPositiveInteger) {
  const std::string rule_int =
      "must be a JSON integer (DeepSpeed raises ValueError unless it is an "
      "int: 1000.0 is not)";
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_num_steps": 1000.0}})"),
      "scheduler.params.warmup_num_steps", "1000.0", rule_int,
      "write 1000 (no decimal point)");
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_num_steps": 10.5}})"),
      "scheduler.params.warmup_num_steps", "10.5", rule_int,
      "write a positive integer, e.g. 1000");
  for (const char* v : {"0", "-3"}) {
    expect_problem(only_problem(std::string(R"({"type": "WarmupLR",
                                  "params": {"warmup_num_steps": )") +
                                v + "}}"),
                   "scheduler.params.warmup_num_steps", v,
                   "must be a positive integer (DeepSpeed raises ValueError)",
                   "write a positive integer, e.g. 1000; values below 2 act "
                   "as 2");
  }
  expect_problem(only_problem(R"({"type": "WarmupLR",
                       "params": {"warmup_num_steps": 18446744073709551615}})"),
                 "scheduler.params.warmup_num_steps", "18446744073709551615",
                 "is too large for a 64-bit integer",
                 "write a positive integer, e.g. 1000");
}

TEST(ParseLrScheduleTest, TotalNumStepsMustBeAtLeastOne) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 0}})"),
      "scheduler.params.total_num_steps", "0",
      "must be >= 1 (optimizer steps in the run)",
      "write the number of optimizer steps in the run, e.g. 10000");
  expect_problem(
      only_problem(
          R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 10.5}})"),
      "scheduler.params.total_num_steps", "10.5",
      "must be a whole number of optimizer steps",
      "write the number of optimizer steps in the run, e.g. 10000");
}

TEST(ParseLrScheduleTest, TotalNumStepsIsRequired) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}})"),
      "scheduler.params.total_num_steps", "",
      "is required by WarmupDecayLR (the step at which the decay reaches "
      "warmup_min_lr); DeepSpeed has no default",
      "add \"total_num_steps\": <the number of optimizer steps in the run>");
  expect_problem(only_problem(R"({"type": "WarmupCosineLR", "params": {}})"),
                 "scheduler.params.total_num_steps", "",
                 "is required by WarmupCosineLR (the step at which the ratio "
                 "reaches cos_min_ratio); DeepSpeed has no default",
                 "add \"total_num_steps\": <the number of optimizer steps in "
                 "the run>");
}

TEST(ParseLrScheduleTest, WarmupTypeMustBeLogOrLinear) {
  const std::string rule =
      "must be \"log\" or \"linear\", in lower case (DeepSpeed would silently "
      "warm up with \"log\" instead)";
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_type": "Linear"}})"),
      "scheduler.params.warmup_type", "\"Linear\"", rule,
      "did you mean \"linear\"?");
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_type": "cosine"}})"),
      "scheduler.params.warmup_type", "\"cosine\"", rule,
      "write \"log\" or \"linear\"");
}

TEST(ParseLrScheduleTest, LastBatchIterationOnlyMinusOne) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"last_batch_iteration": 5}})"),
      "scheduler.params.last_batch_iteration", "5",
      "only -1 (the default, start at the beginning) is supported; a resumed "
      "run takes the iteration from its checkpoint",
      "remove it");
}

TEST(ParseLrScheduleTest, EveryProblemAtOnceInDocumentOrder) {
  std::vector<ConfigProblem> p = parse(R"({
      "type": "WarmupDecayLR",
      "params": {"warmup_type": "lin", "warmup_num_steps": 0,
                 "warmup_min_lr": "x", "foo": 1},
      "extra": 1})");
  ASSERT_EQ(p.size(), 6u);
  EXPECT_EQ(p[0].key, "scheduler.extra");  // section keys are checked first
  EXPECT_EQ(p[1].key, "scheduler.params.warmup_type");
  EXPECT_EQ(p[2].key, "scheduler.params.warmup_num_steps");
  EXPECT_EQ(p[3].key, "scheduler.params.warmup_min_lr");
  EXPECT_EQ(p[4].key, "scheduler.params.foo");
  EXPECT_EQ(p[5].key, "scheduler.params.total_num_steps");

  // ConfigError lists them all.
  ConfigError e(p);
  const std::string what = e.what();
  EXPECT_NE(what.find("invalid ds_config: 6 problems"), std::string::npos)
      << what;
  EXPECT_NE(what.find("\n  - scheduler.params.warmup_num_steps = 0: must be a "
                      "positive integer (DeepSpeed raises ValueError). Fix: "
                      "write a positive integer, e.g. 1000; values below 2 "
                      "act as 2"),
            std::string::npos)
      << what;
}

// --- the section in parse_config ---

TEST(ParseConfigTest, SchedulerSectionIsParsed) {
  Config c = parse_config(
      R"({"train_micro_batch_size_per_gpu": 1,
          "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_num_steps": 10, "total_num_steps": 100,
            "warmup_max_lr": 0.01, "warmup_type": "linear"}}})",
      1);
  EXPECT_EQ(c.scheduler.type, LrScheduleSpec::Type::kWarmupDecayLR);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 10);
  EXPECT_EQ(c.scheduler.total_num_steps, 100);
  EXPECT_EQ(c.scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_TRUE(c.ignored_keys.empty());
}

TEST(ParseConfigTest, SchedulerProblemsJoinTheOthers) {
  ConfigProblem p = testing_config::only_problem(
      R"({"train_micro_batch_size_per_gpu": 1,
          "scheduler": {"type": "WarmupLR",
                        "params": {"warmup_num_step": 10}}})");
  EXPECT_EQ(p.key, "scheduler.params.warmup_num_step");
  EXPECT_HAS(p.fix, "warmup_num_steps");
}

}  // namespace
}  // namespace zerostep
