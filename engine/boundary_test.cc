#include "engine/boundary.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace {

BoundaryOptions managed_opts(int64_t gas) {
  BoundaryOptions o;
  o.managed = true;
  o.gradient_accumulation_steps = gas;
  o.micro_batch_size = 2;
  o.world_size = 3;
  o.train_batch_size = 2 * 3 * gas;
  return o;
}

BoundaryOptions unmanaged_opts(int64_t gas) {
  BoundaryOptions o = managed_opts(gas);
  o.managed = false;
  return o;
}

// Drives one backward the way the Engine does. Returns false if rejected.
bool do_backward(AccumulationBoundary& b, BackwardPlan* out = nullptr) {
  try {
    BackwardPlan p = b.plan_backward();
    b.commit_backward(p);
    if (out) *out = p;
    return true;
  } catch (const UsageError&) {
    return false;
  }
}

// Drives one step; returns the plan, or nullopt if rejected. Checks the
// boundary flag while "inside" step().
std::optional<StepPlan> do_step(AccumulationBoundary& b) {
  StepPlan p;
  try {
    p = b.plan_step();
  } catch (const UsageError&) {
    return std::nullopt;
  }
  b.enter_step();
  if (!b.managed()) {
    EXPECT_TRUE(b.is_gradient_accumulation_boundary());
  }
  b.finish_step(p, p.apply_update);
  return p;
}

TEST(BoundaryTest, ManagedStandardLoopUpdatesEveryGasMicroSteps) {
  for (int64_t gas = 1; gas <= 5; ++gas) {
    AccumulationBoundary b(managed_opts(gas));
    int updates = 0;
    for (int k = 0; k < 20; ++k) {
      const bool expect_boundary = (k + 1) % gas == 0;
      EXPECT_EQ(b.is_gradient_accumulation_boundary(), expect_boundary);
      BackwardPlan bp;
      ASSERT_TRUE(do_backward(b, &bp));
      EXPECT_EQ(bp.reduce_window, expect_boundary) << "gas " << gas << " k " << k;
      auto sp = do_step(b);
      ASSERT_TRUE(sp.has_value());
      EXPECT_EQ(sp->apply_update, expect_boundary);
      if (sp->apply_update) {
        ++updates;
        EXPECT_FALSE(sp->reduce_window_first);  // backward already reduced
        EXPECT_EQ(sp->window_backwards, gas);
      }
      EXPECT_EQ(b.micro_steps(), k + 1);
    }
    EXPECT_EQ(updates, 20 / gas);
    EXPECT_EQ(b.global_steps(), updates);
    EXPECT_EQ(b.global_samples(), updates * 2 * 3 * gas);
  }
}

TEST(BoundaryTest, ManagedOverrideDrivesVariableWindows) {
  AccumulationBoundary b(managed_opts(4));
  const int windows[] = {2, 5, 3};
  for (int n : windows) {
    for (int i = 0; i < n; ++i) {
      b.set_gradient_accumulation_boundary(i == n - 1);
      ASSERT_TRUE(do_backward(b));
      auto sp = do_step(b);
      ASSERT_TRUE(sp);
      EXPECT_EQ(sp->apply_update, i == n - 1);
      if (sp->apply_update) {
        EXPECT_EQ(sp->window_backwards, n);
      }
    }
  }
  EXPECT_EQ(b.global_steps(), 3);
  EXPECT_EQ(b.micro_steps(), 10);
}

TEST(BoundaryTest, ManagedBackwardAfterBoundaryBackwardIsRejected) {
  AccumulationBoundary b(managed_opts(1));
  ASSERT_TRUE(do_backward(b));
  try {
    b.plan_backward();
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("call step() after every backward()"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(b.window_backwards(), 1);
}

TEST(BoundaryTest, ManagedBoundaryStepWithoutBackwardIsRejected) {
  AccumulationBoundary b(managed_opts(1));
  EXPECT_THROW(b.plan_step(), UsageError);
  EXPECT_EQ(b.micro_steps(), 0);
}

TEST(BoundaryTest, ManagedStepAtBoundaryWithoutBoundaryBackwardReducesFirst) {
  AccumulationBoundary b(managed_opts(4));
  b.set_gradient_accumulation_boundary(false);
  ASSERT_TRUE(do_backward(b));
  b.set_gradient_accumulation_boundary(true);
  auto sp = do_step(b);
  ASSERT_TRUE(sp);
  EXPECT_TRUE(sp->apply_update);
  EXPECT_TRUE(sp->reduce_window_first);
}

TEST(BoundaryTest, UnmanagedRejectsSetBoundaryWithAClearMessage) {
  AccumulationBoundary b(unmanaged_opts(4));
  try {
    b.set_gradient_accumulation_boundary(true);
    FAIL();
  } catch (const UsageError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("managed_gradient_accumulation = false"),
              std::string::npos);
    EXPECT_NE(what.find("Fix:"), std::string::npos);
  }
  EXPECT_FALSE(b.is_gradient_accumulation_boundary());
}

TEST(BoundaryTest, UnmanagedStepWithNoBackwardIsAnErrorThatChangesNothing) {
  AccumulationBoundary b(unmanaged_opts(4));
  ASSERT_TRUE(do_backward(b));
  ASSERT_TRUE(do_step(b));
  const int64_t steps = b.global_steps(), samples = b.global_samples(),
                micro = b.micro_steps();
  try {
    b.plan_step();
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no backward() since the last step"),
              std::string::npos);
  }
  EXPECT_EQ(b.global_steps(), steps);
  EXPECT_EQ(b.global_samples(), samples);
  EXPECT_EQ(b.micro_steps(), micro);
  EXPECT_FALSE(b.in_step());
}

TEST(BoundaryTest, AbortStepRestoresTheWindow) {
  AccumulationBoundary b(unmanaged_opts(4));
  ASSERT_TRUE(do_backward(b));
  ASSERT_TRUE(do_backward(b));
  StepPlan p = b.plan_step();
  b.enter_step();
  b.abort_step();
  EXPECT_FALSE(b.in_step());
  EXPECT_FALSE(b.is_gradient_accumulation_boundary());
  EXPECT_EQ(b.window_backwards(), 2);
  EXPECT_EQ(b.global_steps(), 0);
  EXPECT_EQ(p.window_backwards, 2);
}

TEST(BoundaryTest, SkippedUpdateClosesTheWindowWithoutCountingAStep) {
  AccumulationBoundary b(unmanaged_opts(4));
  ASSERT_TRUE(do_backward(b));
  StepPlan p = b.plan_step();
  b.enter_step();
  b.finish_step(p, /*applied=*/false);
  EXPECT_EQ(b.global_steps(), 0);
  EXPECT_EQ(b.skipped_steps(), 1);
  EXPECT_EQ(b.window_backwards(), 0);
  EXPECT_EQ(b.global_samples(), 0);
}

// Exhaustive: every sequence of backward (B) and step (S) calls up to length
// 12 in unmanaged mode, checked against the rules of DESIGN.md §1 stated
// directly: a step applies iff at least one backward preceded it since the
// last applied step; otherwise it is rejected; the flag is false outside
// step(); backward never reduces; samples count actual backwards.
TEST(BoundaryTest, UnmanagedEverySequenceUpToLength12) {
  const int max_len = 12;
  for (int len = 0; len <= max_len; ++len) {
    for (uint32_t bits = 0; bits < (1u << len); ++bits) {
      AccumulationBoundary b(unmanaged_opts(3));
      int pending = 0, updates = 0, total_backwards = 0;
      for (int i = 0; i < len; ++i) {
        EXPECT_FALSE(b.is_gradient_accumulation_boundary());
        if (bits & (1u << i)) {
          BackwardPlan bp;
          ASSERT_TRUE(do_backward(b, &bp));
          EXPECT_FALSE(bp.reduce_window);
          ++pending;
          ++total_backwards;
        } else {
          auto sp = do_step(b);
          ASSERT_EQ(sp.has_value(), pending > 0) << "bits " << bits << " i " << i;
          if (sp) {
            EXPECT_TRUE(sp->apply_update);
            EXPECT_TRUE(sp->reduce_window_first);
            EXPECT_EQ(sp->window_backwards, pending);
            ++updates;
            pending = 0;
          }
        }
      }
      ASSERT_EQ(b.global_steps(), updates);
      ASSERT_EQ(b.micro_steps(), total_backwards);
      ASSERT_EQ(b.window_backwards(), pending);
      ASSERT_EQ(b.global_samples(), (total_backwards - pending) * 2 * 3);
    }
  }
}

TEST(BoundaryTest, RejectsNonPositiveOptions) {
  EXPECT_THROW(AccumulationBoundary(managed_opts(0)), UsageError);
  BoundaryOptions o = managed_opts(1);
  o.world_size = 0;
  EXPECT_THROW(AccumulationBoundary{o}, UsageError);
}

}  // namespace
}  // namespace zerostep
