#include "engine/loss_scaler.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace {

struct Expect {
  bool overflow;
  double scale_after;
  int64_t hysteresis_after;
};

void run_table(const LossScalerOptions& o, double initial,
               const std::vector<Expect>& table) {
  LossScaler s(o);
  EXPECT_EQ(s.scale(), initial);
  for (size_t i = 0; i < table.size(); ++i) {
    s.update(table[i].overflow);
    EXPECT_EQ(s.scale(), table[i].scale_after) << "iteration " << i;
    EXPECT_EQ(s.state().hysteresis_left, table[i].hysteresis_after)
        << "iteration " << i;
    EXPECT_EQ(s.state().iteration, static_cast<int64_t>(i + 1));
  }
}

// The schedule worked out by hand from Note [Loss scale schedule]: scale
// 2^4, window 3, hysteresis 2.
TEST(LossScalerTest, DynamicScheduleStepByStep) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.scale_window = 3;
  o.hysteresis = 2;
  run_table(o, 16.0,
            {
                {true, 16, 1},   // 0: hysteresis absorbs the first overflow
                {true, 8, 1},    // 1: none left: halve
                {false, 8, 1},   // 2: 0 stable iterations before this one
                {false, 8, 1},   // 3: 1
                {false, 8, 1},   // 4: 2
                {false, 16, 2},  // 5: 3 = window: double, refill
                {false, 16, 2},  // 6
                {true, 16, 1},   // 7: absorbed again
                {false, 16, 1},  // 8: no refill without consecutive
                {true, 8, 1},    // 9: halve
            });
}

TEST(LossScalerTest, ConsecutiveHysteresisRefillsOnEveryCleanIteration) {
  LossScalerOptions o;
  o.initial_scale_power = 4;
  o.scale_window = 3;
  o.hysteresis = 2;
  o.consecutive_hysteresis = true;
  run_table(o, 16.0, {
                         {true, 16, 1},
                         {false, 16, 2},  // refilled
                         {true, 16, 1},   // absorbed again
                         {true, 8, 1},
                     });
}

TEST(LossScalerTest, GrowsEveryWindowWithoutOverflow) {
  LossScalerOptions o;
  o.initial_scale_power = 1;
  o.scale_window = 2;
  o.hysteresis = 1;
  // Stable counts 0,1,2,3,4 before iterations 0..4 (no overflow yet,
  // last_overflow = -1): doubles when that count is 2 and 4.
  run_table(o, 2.0, {
                        {false, 2, 1},
                        {false, 2, 1},
                        {false, 4, 1},
                        {false, 4, 1},
                        {false, 8, 1},
                    });
}

TEST(LossScalerTest, NeverBelowMinimumAndRaisesWhenStuckThere) {
  LossScalerOptions o;
  o.initial_scale_power = 2;  // 4
  o.hysteresis = 1;
  o.min_scale = 1.5;
  LossScaler s(o);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 1.5);  // clamped
  try {
    s.update(true);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("fp16.min_loss_scale"),
              std::string::npos);
  }
  EXPECT_EQ(s.scale(), 1.5);
  EXPECT_EQ(s.state().iteration, 3);
  EXPECT_EQ(s.state().last_overflow_iteration, 2);
  s.update(false);  // recovers
  EXPECT_EQ(s.state().iteration, 4);
}

TEST(LossScalerTest, StaticScaleNeverMoves) {
  LossScalerOptions o;
  o.dynamic = false;
  o.static_scale = 128.0;
  LossScaler s(o);
  for (bool overflow : {true, true, false, true, false}) {
    s.update(overflow);
    EXPECT_EQ(s.scale(), 128.0);
  }
  EXPECT_EQ(s.state().iteration, 5);
}

TEST(LossScalerTest, RestoreContinuesTheSameSchedule) {
  LossScalerOptions o;
  o.initial_scale_power = 3;
  o.scale_window = 2;
  LossScaler a(o), b(o);
  for (bool f : {true, false, true, false, false}) a.update(f);
  b.restore(a.state());
  for (bool f : {false, false, true, false, false, false}) {
    a.update(f);
    b.update(f);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.state().hysteresis_left, b.state().hysteresis_left);
  }
}

}  // namespace
}  // namespace zerostep
