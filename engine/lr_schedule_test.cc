#include "engine/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace {

using Type = LrScheduleSpec::Type;

// Expected values below are DeepSpeed's formulas (engine/lr_schedule.h, Note
// [DeepSpeed's step index]) evaluated by hand; i is last_batch_iteration, W =
// max(2, warmup_num_steps), T = total_num_steps. Hand-written decimals are
// compared with EXPECT_DOUBLE_EQ (4 ulps).

LrScheduleSpec warmup_lr(double min_lr, double max_lr, int64_t w,
                         WarmupType type) {
  LrScheduleSpec s;
  s.type = Type::kWarmupLR;
  s.warmup_min_lr = min_lr;
  s.warmup_max_lr = max_lr;
  s.warmup_num_steps = w;
  s.warmup_type = type;
  return s;
}

// --- schedules ---

TEST(LrScheduleTest, NoneIsTheBaseLrAtEveryStep) {
  LrSchedule s(LrScheduleSpec(), 0.02);
  EXPECT_EQ(s.lr(), 0.02);
  EXPECT_EQ(s.lr_at(0), 0.02);
  EXPECT_EQ(s.lr_at(1000000), 0.02);
  s.advance();
  EXPECT_EQ(s.lr(), 0.02);
  EXPECT_EQ(s.last_batch_iteration(), 0);
}

TEST(LrScheduleTest, WarmupLRLog) {
  // min 0, max 0.01, W 4: lr(i) = 0.01 * ln(i + 1) / ln(4) for i < 4.
  LrSchedule s(warmup_lr(0.0, 0.01, 4, WarmupType::kLog), /*base_lr=*/0.1);
  EXPECT_EQ(s.lr_at(-1), 0.0);  // not started: warmup_min_lr
  EXPECT_EQ(s.lr_at(0), 0.0);   // ln(1) = 0
  // 0.01 * ln 2 / ln 4 = 0.01 / 2
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.005);
  // 0.01 * ln 3 / ln 4 = 0.01 * 1.0986122886681098 / 1.3862943611198906
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.0079248125036057819);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.01);  // ln 4 / ln 4: log peaks at i = W - 1
  EXPECT_EQ(s.lr_at(4), 0.01);         // i >= W: gamma = 1
  EXPECT_EQ(s.lr_at(100000), 0.01);
}

TEST(LrScheduleTest, WarmupLRLinear) {
  // min 0.001, max 0.01, W 4: lr(i) = 0.001 + 0.009 * i / 4 for i < 4.
  LrSchedule s(warmup_lr(0.001, 0.01, 4, WarmupType::kLinear), 0.1);
  EXPECT_EQ(s.lr_at(-1), 0.001);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.001);    // 0.001 + 0.009 * 0
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.00325);  // 0.001 + 0.009 * 0.25
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.0055);   // 0.001 + 0.009 * 0.5
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.00775);  // 0.001 + 0.009 * 0.75
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.01);     // linear peaks only at i = W
  EXPECT_DOUBLE_EQ(s.lr_at(50), 0.01);
}

TEST(LrScheduleTest, LogAndLinearDifferInsideTheWarmupOnly) {
  LrSchedule log(warmup_lr(0.0, 1.0, 10, WarmupType::kLog), 1.0);
  LrSchedule lin(warmup_lr(0.0, 1.0, 10, WarmupType::kLinear), 1.0);
  // i = 4: log: ln 5 / ln 10 = 0.69897000433601886; linear: 4 / 10.
  EXPECT_DOUBLE_EQ(log.lr_at(4), 0.69897000433601886);
  EXPECT_DOUBLE_EQ(lin.lr_at(4), 0.4);
  // i = 9 = W - 1: log: ln 10 / ln 10 = 1; linear: 9 / 10.
  EXPECT_DOUBLE_EQ(log.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(lin.lr_at(9), 0.9);
  EXPECT_EQ(log.lr_at(10), 1.0);
  EXPECT_EQ(lin.lr_at(10), 1.0);
}

TEST(LrScheduleTest, WarmupLRWithoutMaxTakesTheOptimizersLr) {
  LrScheduleSpec spec;  // DeepSpeed's defaults: min 0, W 1000, log
  spec.type = Type::kWarmupLR;
  LrSchedule s(spec, /*base_lr=*/0.05);
  EXPECT_EQ(s.lr_at(-1), 0.0);
  EXPECT_EQ(s.lr_at(0), 0.0);
  // 0.05 * ln 2 / ln 1000 = 0.05 * 0.69314718055994531 / 6.9077552789821368
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.0050171665943996866);
  // 0.05 * ln 999 / ln 1000 = 0.05 * 6.9067547786485539 / 6.9077552789821368
  EXPECT_DOUBLE_EQ(s.lr_at(998), 0.04999275813709971);
  EXPECT_DOUBLE_EQ(s.lr_at(999), 0.05);
  EXPECT_EQ(s.lr_at(5000), 0.05);
}

TEST(LrScheduleTest, WarmupNumStepsBelowTwoActsAsTwo) {
  // DeepSpeed: W = max(2, warmup_num_steps).
  LrSchedule log(warmup_lr(0.0, 1.0, 1, WarmupType::kLog), 1.0);
  EXPECT_EQ(log.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(log.lr_at(1), 1.0);  // ln 2 / ln 2
  LrSchedule lin(warmup_lr(0.0, 1.0, 1, WarmupType::kLinear), 1.0);
  EXPECT_EQ(lin.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(lin.lr_at(1), 0.5);  // 1 / 2, not yet past the warmup
  EXPECT_EQ(lin.lr_at(2), 1.0);
}

TEST(LrScheduleTest, WarmupDecayLRDecaysLinearlyToWarmupMinLr) {
  // min 0.001, max 0.01, W 4, T 10, linear. After the warmup:
  // lr(i) = 0.001 + 0.009 * max(0, (10 - i) / (10 - 4)).
  LrScheduleSpec spec = warmup_lr(0.001, 0.01, 4, WarmupType::kLinear);
  spec.type = Type::kWarmupDecayLR;
  spec.total_num_steps = 10;
  LrSchedule s(spec, 0.1);
  EXPECT_EQ(s.lr_at(-1), 0.001);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.001);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 0.0055);   // warmup: 0.001 + 0.009 * 2/4
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.00775);  // 0.001 + 0.009 * 3/4
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.01);     // 0.001 + 0.009 * 6/6
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.0085);   // 0.001 + 0.009 * 5/6
  EXPECT_DOUBLE_EQ(s.lr_at(7), 0.0055);   // 0.001 + 0.009 * 3/6
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.0025);   // 0.001 + 0.009 * 1/6
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.001);   // gamma 0 at i = T: warmup_min_lr
  EXPECT_DOUBLE_EQ(s.lr_at(11), 0.001);   // max(0, -1/6) = 0
  EXPECT_DOUBLE_EQ(s.lr_at(1000000), 0.001);
}

TEST(LrScheduleTest, WarmupDecayLRWithMinZeroReachesZero) {
  // min 0, max 1, W 2, T 6, log: after the warmup lr(i) = (6 - i) / 4.
  LrScheduleSpec spec = warmup_lr(0.0, 1.0, 2, WarmupType::kLog);
  spec.type = Type::kWarmupDecayLR;
  spec.total_num_steps = 6;
  LrSchedule s(spec, 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 1.0);  // ln 2 / ln 2
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1.0);  // 4 / 4
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.75);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.25);
  EXPECT_EQ(s.lr_at(6), 0.0);
  EXPECT_EQ(s.lr_at(7), 0.0);
}

TEST(LrScheduleTest, WarmupDecayLRWithoutMaxUses0001NotTheOptimizersLr) {
  LrScheduleSpec spec;
  spec.type = Type::kWarmupDecayLR;
  spec.total_num_steps = 10;  // below W = 1000: DeepSpeed only warns
  LrSchedule s(spec, /*base_lr=*/0.1);
  // 0.001 * ln 2 / ln 1000
  EXPECT_DOUBLE_EQ(s.lr_at(1), 1.0034333188799373e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(999), 0.001);  // ln 1000 / ln 1000
  // i = 1000 >= W: gamma = max(0, (10 - 1000) / max(1, 10 - 1000)) = 0
  EXPECT_EQ(s.lr_at(1000), 0.0);
}

TEST(LrScheduleTest, WarmupCosineLRLinear) {
  // base 0.1, warmup_min_ratio 0.1, cos_min_ratio 0.01, W 4, T 10, linear.
  // Warmup: ratio = 0.1 + 0.9 * i / 4. After: p = min(1, (i - 3) / 6),
  // ratio = 0.01 + 0.99 * (1 + cos(pi p)) / 2; lr = 0.1 * ratio.
  LrScheduleSpec spec;
  spec.type = Type::kWarmupCosineLR;
  spec.warmup_min_ratio = 0.1;
  spec.cos_min_ratio = 0.01;
  spec.warmup_num_steps = 4;
  spec.total_num_steps = 10;
  spec.warmup_type = WarmupType::kLinear;
  LrSchedule s(spec, 0.1);
  EXPECT_EQ(s.lr_at(-1), 0.0);           // not started: 0, not the min ratio
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.01);    // 0.1 * 0.1
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.0325);  // 0.1 * (0.1 + 0.9 * 0.25)
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.0775);  // 0.1 * (0.1 + 0.9 * 0.75)
  // p = 1/6: (1 + cos(pi/6)) / 2 = (1 + 0.86602540378443865) / 2
  //   = 0.93301270189221932; 0.1 * (0.01 + 0.99 * 0.93301270189221932)
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.093368257487329728);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.07525);  // p = 1/3: 0.1 * (0.01 + 0.99*0.75)
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.0505);   // p = 1/2: 0.1 * (0.01 + 0.99*0.5)
  EXPECT_DOUBLE_EQ(s.lr_at(7), 0.02575);  // p = 2/3: 0.1 * (0.01 + 0.99*0.25)
  // p = 5/6: (1 - 0.86602540378443865) / 2 = 0.066987298107780677
  EXPECT_DOUBLE_EQ(s.lr_at(8), 0.0076317425126702842);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.001);   // p = 1 at i = T - 1: cos_min_ratio
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.001);  // p clamped to 1
  EXPECT_DOUBLE_EQ(s.lr_at(1000000), 0.001);
}

TEST(LrScheduleTest, WarmupCosineLRLogWithDefaultRatios) {
  // base 0.1, W 4, T 10, log, warmup_min_ratio 0, cos_min_ratio 0.0001.
  LrScheduleSpec spec;
  spec.type = Type::kWarmupCosineLR;
  spec.warmup_num_steps = 4;
  spec.total_num_steps = 10;
  LrSchedule s(spec, 0.1);
  EXPECT_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.05);  // 0.1 * ln 2 / ln 4
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.1);   // 0.1 * ln 4 / ln 4
  // p = 1/2: 0.1 * (0.0001 + 0.9999 * 0.5)
  EXPECT_DOUBLE_EQ(s.lr_at(6), 0.050005);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-5);  // 0.1 * 0.0001
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-5);
}

TEST(LrScheduleTest, WarmupCosineLRStartsAtZeroThenWarmupMinRatio) {
  LrScheduleSpec spec;
  spec.type = Type::kWarmupCosineLR;
  spec.warmup_min_ratio = 0.2;
  spec.warmup_num_steps = 4;
  spec.total_num_steps = 10;
  LrSchedule s(spec, 0.1);
  EXPECT_EQ(s.lr(), 0.0);  // the first update runs at lr 0
  s.advance();
  EXPECT_DOUBLE_EQ(s.lr(), 0.02);  // 0.1 * 0.2
  s.advance();
  EXPECT_DOUBLE_EQ(s.lr(), 0.06);  // 0.1 * (0.2 + 0.8 * ln 2 / ln 4)
}

TEST(LrScheduleTest, WarmupCosineLRTotalBelowWarmupHoldsTheFloor) {
  LrScheduleSpec spec;
  spec.type = Type::kWarmupCosineLR;
  spec.warmup_num_steps = 4;
  spec.total_num_steps = 3;
  LrSchedule s(spec, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.1);
  // p = min(1, (4 - 3) / max(1, 3 - 4)) = 1: cos_min_ratio at once.
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1e-5);
  EXPECT_DOUBLE_EQ(s.lr_at(5), 1e-5);
}

TEST(LrScheduleTest, AdvanceWalksTheScheduleFromMinusOne) {
  LrSchedule s(warmup_lr(0.001, 0.01, 4, WarmupType::kLinear), 0.1);
  EXPECT_EQ(s.last_batch_iteration(), -1);
  // The lr at construction (DeepSpeed writes it into the optimizer) is
  // lr(-1) = warmup_min_lr; it is the first update's.
  EXPECT_EQ(s.lr(), 0.001);
  const std::vector<double> want = {0.001,   0.00325, 0.0055,
                                    0.00775, 0.01,    0.01};
  for (size_t k = 0; k < want.size(); ++k) {
    s.advance();
    EXPECT_EQ(s.last_batch_iteration(), static_cast<int64_t>(k));
    EXPECT_DOUBLE_EQ(s.lr(), want[k]) << "after " << k + 1 << " advances";
  }
}

TEST(LrScheduleTest, SetLastBatchIterationResumes) {
  LrSchedule s(warmup_lr(0.0, 1.0, 10, WarmupType::kLinear), 1.0);
  s.set_last_batch_iteration(6);
  EXPECT_DOUBLE_EQ(s.lr(), 0.6);
  s.advance();
  EXPECT_EQ(s.last_batch_iteration(), 7);
  EXPECT_DOUBLE_EQ(s.lr(), 0.7);
}

TEST(LrScheduleTest, ConstructorRejectsUnusableSpecs) {
  LrScheduleSpec decay;
  decay.type = Type::kWarmupDecayLR;  // total_num_steps left 0
  try {
    LrSchedule s(decay, 0.1);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "LrSchedule(WarmupDecayLR): total_num_steps = 0 must be >= 1 "
              "(it has no default)");
  }
  LrScheduleSpec cosine;
  cosine.type = Type::kWarmupCosineLR;
  EXPECT_THROW(LrSchedule(cosine, 0.1), UsageError);
  LrScheduleSpec w = warmup_lr(0.0, 0.01, 0, WarmupType::kLog);
  try {
    LrSchedule s(w, 0.1);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "LrSchedule(WarmupLR): warmup_num_steps = 0 must be >= 1");
  }
  EXPECT_THROW(LrSchedule(warmup_lr(-1.0, 0.01, 4, WarmupType::kLog), 0.1),
               UsageError);
  EXPECT_THROW(LrSchedule(warmup_lr(0.0, NAN, 4, WarmupType::kLog), 0.1),
               UsageError);
  try {
    LrSchedule s(LrScheduleSpec(), -0.5);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "LrSchedule(none): base_lr = -0.5 must be a finite number >= 0");
  }
}

TEST(LrScheduleTest, ToString) {
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

const char* const kAuto =
    "\"auto\" is a placeholder that the Hugging Face Trainer replaces before "
    "DeepSpeed reads the file; zerostep reads the file as written";

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
                 "scheduler.type", "\"auto\"", kAuto,
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
                 "scheduler.params", "\"auto\"", kAuto,
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
  expect_problem(p[0], "scheduler.params.warmup_max_lr", "\"auto\"", kAuto,
                 "write the peak lr, e.g. 0.001");
  expect_problem(p[1], "scheduler.params.warmup_num_steps", "\"auto\"", kAuto,
                 "write a positive integer, e.g. 1000");
  expect_problem(p[2], "scheduler.params.total_num_steps", "\"auto\"", kAuto,
                 "write the number of optimizer steps in the run, e.g. 10000");
  expect_problem(p[3], "scheduler.params.warmup_type", "\"auto\"", kAuto,
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

TEST(ParseLrScheduleTest, WarmupMaxLrNull) {
  expect_problem(
      only_problem(
          R"({"type": "WarmupLR", "params": {"warmup_max_lr": null}})"),
      "scheduler.params.warmup_max_lr", "null",
      "must be a JSON number (DeepSpeed's null, meaning optimizer.params.lr, "
      "is not supported)",
      "remove the key for the default (WarmupLR: optimizer.params.lr; "
      "WarmupDecayLR: 0.001), or write the peak lr, e.g. 0.001");
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

}  // namespace
}  // namespace zerostep
