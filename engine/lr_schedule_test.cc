#include "engine/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
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

}  // namespace
}  // namespace zerostep
