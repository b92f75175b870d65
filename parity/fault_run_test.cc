#include "parity/fault_run.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string_view>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "zero/phase.h"

namespace zerostep {
namespace {

FaultScenario base(int stage, bool managed, int world = 3) {
  FaultScenario f;
  f.scenario.stage = stage;
  f.scenario.world_size = world;
  f.scenario.backwards = {2, 2};
  f.scenario.seed = 5;
  f.scenario.persistence_threshold = 0;  // stage 3: partition every block
  f.scenario.gradient_clipping = 1.0;    // exercise the clip after the norm
  f.managed = managed;
  return f;
}

std::string describe(const FaultRunResult& r) {
  std::string s = r.replay + "\n";
  for (const std::string& f : r.failures) s += "  failure: " + f + "\n";
  for (size_t i = 0; i < r.ranks.size(); ++i)
    s += "  rank " + std::to_string(i) + ": " + r.ranks[i].error + "\n";
  return s;
}

// Whether the collective `c` belongs to the training phase `phase`.
bool in(const CollectiveTiming& c, const char* phase) {
  return std::string_view(c.label) == phase;
}

// One fault of each class (Note [Fault model] in sim/faults.h: every
// mismatch field) at collective k of the given rank.
std::vector<std::string> every_class(int rank, int64_t k) {
  const std::string at = std::to_string(rank) + "@" + std::to_string(k);
  return {"crash:" + at,
          "lost:" + at,
          "mismatch:" + at + ":op",
          "mismatch:" + at + ":count",
          "mismatch:" + at + ":dtype",
          "straggle:" + at + ":90"};
}

// Note [Fault contract] for a fault at every collective inside step(), of
// every class, at every stage, managed and unmanaged: every rank ends with
// CommError naming the fault, and no rank's parameters, optimizer state or
// counters moved in the failed step().
// Stage 3 once more with gather_once_per_step and reduce_once_per_step:
// its step all-gathers every block group too (Note [Stage 3 gather once per
// step]), all in flight at once, and reduce-scatters every group; and once
// with the config's persistence threshold, which keeps this MLP's groups
// whole: its step all-gathers them from the spare of the persistent
// partitions, and the moments are written only after that (Note
// [Transactional update]).
TEST(FaultRunTest, EveryFaultInsideStepIsAnErrorEverywhereAndNoPartialUpdate) {
  struct Run {
    int stage;
    bool once;
    bool persistent = false;
  };
  const std::vector<Run> runs = {{0, false}, {1, false},       {2, false},
                                 {3, false}, {3, true},        {3, false, true}};
  for (const auto& [stage, once, persistent] : runs) {
    for (bool managed : {false, true}) {
      FaultScenario f = base(stage, managed);
      f.scenario.gather_once_per_step = f.scenario.reduce_once_per_step = once;
      if (persistent) f.scenario.persistence_threshold = -1;
      const std::vector<CollectiveTiming> schedule = baseline_schedule(f);
      int in_step = 0;  // faults that hit inside step() itself
      for (const CollectiveTiming& c : schedule) {
        if (!in(c, phase::kStep)) continue;
        for (const std::string& text :
             every_class(static_cast<int>(c.seq % 3), c.seq)) {
          f.faults = parse_fault_options(text);
          const FaultRunResult r = run_fault_scenario(f);
          EXPECT_TRUE(r.ok) << describe(r);
          EXPECT_TRUE(r.any_failed) << describe(r);
          for (const FaultRankOutcome& o : r.ranks)
            EXPECT_NE(o.error.find(to_string(c.kind)), std::string::npos)
                << describe(r);
          in_step += r.ranks[0].failed_call.rfind("step", 0) == 0;
        }
      }
      // Managed stage 0 reduces (and agrees) in the boundary backward and
      // has no collective in step(); everywhere else at least the two
      // windows' agreement (unmanaged) or norm/all-gather (stages 1-3) are
      // inside step(), each hit by 6 faults.
      if (stage == 0 && managed) continue;
      EXPECT_GE(in_step, 2 * 6) << "stage " << stage << " managed " << managed
                                << " persistent " << persistent;
    }
  }
}

// The same contract with the optimizer state offloaded: in memory on the
// host (cpu) or streamed from an NVMe swap file (nvme), where the update's
// moments are only prepared until the all-gather succeeded (Note [NVMe
// optimizer state] in zero/optimizer.h).
TEST(FaultRunTest, NoPartialUpdateWithOffloadToo) {
  char tmpl[] = "/tmp/zerostep_fault_nvme_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  for (OffloadDevice offload : {OffloadDevice::kCpu, OffloadDevice::kNvme})
    for (int stage : {1, 2, 3})
      for (bool managed : {false, true}) {
        FaultScenario f = base(stage, managed);
        f.scenario.offload = offload;
        f.scenario.nvme_path = tmpl;
        f.scenario.sub_group_size = 700;  // several swap sub-groups
        const std::vector<CollectiveTiming> schedule = baseline_schedule(f);
        int in_step = 0;
        for (const CollectiveTiming& c : schedule) {
          if (!in(c, phase::kStep)) continue;
          for (const std::string cls : {"crash", "lost"}) {
            f.faults = parse_fault_options(
                cls + ":" + std::to_string(c.seq % 3) + "@" +
                std::to_string(c.seq));
            const FaultRunResult r = run_fault_scenario(f);
            EXPECT_TRUE(r.ok) << to_string(offload) << " " << describe(r);
            EXPECT_TRUE(r.any_failed) << describe(r);
            in_step += r.ranks[0].failed_call.rfind("step", 0) == 0;
          }
        }
        EXPECT_GE(in_step, 2 * 2) << to_string(offload) << " stage " << stage;
      }
  // Stage 3 with the parameter partitions on NVMe too.
  for (bool managed : {false, true}) {
    FaultScenario f = base(3, managed);
    f.scenario.offload = OffloadDevice::kNvme;
    f.scenario.offload_param = OffloadDevice::kNvme;
    f.scenario.nvme_path = tmpl;
    f.scenario.sub_group_size = 700;
    int failed = 0;
    for (const CollectiveTiming& c : baseline_schedule(f)) {
      if (!in(c, phase::kStep)) continue;
      f.faults = parse_fault_options("crash:" + std::to_string(c.seq % 3) +
                                     "@" + std::to_string(c.seq));
      const FaultRunResult r = run_fault_scenario(f);
      EXPECT_TRUE(r.ok) << "offload_param nvme " << describe(r);
      failed += r.any_failed;
    }
    EXPECT_GE(failed, 2);
  }
  std::filesystem::remove_all(tmpl);
}

// Faults in the collectives of backward (stages 2/3 reduce there; stage 3
// also gathers for forward and backward) end the same way.
TEST(FaultRunTest, FaultsInBackwardAndForwardCollectivesToo) {
  for (int stage : {2, 3}) {
    for (bool managed : {false, true}) {
      FaultScenario f = base(stage, managed);
      f.scenario.overlap_comm = stage == 2 && managed;
      const std::vector<CollectiveTiming> schedule = baseline_schedule(f);
      for (const CollectiveTiming& c : schedule) {
        if (!in(c, phase::kBackward) && !in(c, phase::kForward)) continue;
        if (c.seq % 3 != 0) continue;  // a sample keeps the test short
        for (const std::string& text : every_class(1, c.seq)) {
          f.faults = parse_fault_options(text);
          const FaultRunResult r = run_fault_scenario(f);
          EXPECT_TRUE(r.ok) << describe(r);
          EXPECT_TRUE(r.any_failed) << describe(r);
        }
      }
    }
  }
}

TEST(FaultRunTest, TheMessageNamesRankCollectiveOpStepAndTime) {
  FaultScenario f = base(1, /*managed=*/false);
  const std::vector<CollectiveTiming> schedule = baseline_schedule(f);
  int64_t gather = -1;  // the last step's all-gather
  for (const CollectiveTiming& c : schedule)
    if (c.kind == CollectiveKind::kAllGather && in(c, phase::kStep))
      gather = c.seq;
  ASSERT_GE(gather, 0);
  const std::string k = std::to_string(gather);
  f.faults = parse_fault_options("crash:2@" + k + ",timeout:30");
  const FaultRunResult r = run_fault_scenario(f);
  ASSERT_TRUE(r.ok) << describe(r);
  const std::string& m = r.ranks[0].error;
  EXPECT_NE(m.find("step() at global step 1 (window of 2 backward() calls) "
                   "failed on rank 0: rank 0: collective #" +
                   k +
                   " (all_gather, phase step) cannot complete: rank 2 left "
                   "the world before joining it (rank 2 crashed on entering "
                   "its collective #" +
                   k + " (all_gather, phase step) at t="),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("[injected fault crash:2@" + k + "]"), std::string::npos)
      << m;
  EXPECT_NE(m.find("gave up after the timeout of 30 s of virtual time"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("global_steps, global_samples and the lr schedule did not "
                   "advance"),
            std::string::npos)
      << m;
  // Rank 2's own error says it crashed.
  EXPECT_NE(
      r.ranks[2].error.find("rank 2 crashed on entering its collective #" + k),
      std::string::npos)
      << r.ranks[2].error;
  // Bounded: survivors stopped one timeout after the failed collective.
  EXPECT_LE(r.ranks[0].virtual_time_s, r.baseline_time_s + 30.0);
  EXPECT_GE(r.ranks[0].virtual_time_s, 30.0);
}

TEST(FaultRunTest, StragglersWithinTheTimeoutAndLateFaultsChangeNoBit) {
  for (int stage : {0, 1, 2, 3}) {
    FaultScenario f = base(stage, /*managed=*/false);
    const int64_t n = static_cast<int64_t>(baseline_schedule(f).size());
    f.faults = parse_fault_options(
        "straggle:1@0x3:0.5,straggle:0@3:2.5,"
        "crash:2@" +
        std::to_string(n) + ",lost:0@" + std::to_string(n + 5));
    const FaultRunResult r = run_fault_scenario(f);
    EXPECT_TRUE(r.ok) << describe(r);
    EXPECT_FALSE(r.any_failed) << describe(r);
    for (const FaultRankOutcome& o : r.ranks) {
      // Every rank waited for both stragglers (3 × 0.5 s, then 2.5 s).
      EXPECT_GE(o.virtual_time_s, r.baseline_time_s + 4.0 - 1e-9);
    }
  }
}

TEST(FaultRunTest, AFaultyRunIsDeterministicAndPrintsItsReplay) {
  FaultScenario f = base(2, /*managed=*/true);
  f.faults = parse_fault_options("straggle:0@3:1,mismatch:1@9:op");
  const FaultRunResult a = run_fault_scenario(f);
  const FaultRunResult b = run_fault_scenario(f);
  ASSERT_EQ(a.ranks.size(), b.ranks.size());
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    EXPECT_EQ(a.ranks[r].error, b.ranks[r].error);
    EXPECT_EQ(a.ranks[r].virtual_time_s, b.ranks[r].virtual_time_s);
  }
  EXPECT_EQ(a.replay,
            "./bazelw run //tools:harness -- "
            "--faults=straggle:0@3:1,mismatch:1@9:op,timeout:60 "
            "--managed=true --stages=2 --world=3 --backwards=2,2 "
            "--scaling=configured --model=mlp --model-scale=1 "
            "--micro-batch=2 --seed=5 --clip=1 --persistence-threshold=0");
}

TEST(FaultRunTest, FaultsThatDoNotFitAreRejectedUpFront) {
  FaultScenario f = base(0, false, /*world=*/2);
  f.faults = parse_fault_options("crash:5@1");
  EXPECT_THROW(run_fault_scenario(f), UsageError);
}

}  // namespace
}  // namespace zerostep
