// Property-based tests of the simulator's faults and shape-only schedule,
// with RapidCheck on top of Google Test.
//
//   FaultSwarm.EveryFaultMixKeepsTheFaultContract
//       A random scenario (stage 0-3, world 1-4, managed or not, 1-3
//       windows of N in 1..4, micro batch 1-2, overlap_comm at stage 2,
//       seed) and a random mix of 1-3 faults (crash, straggle, mismatch,
//       lost peer at random ranks and collectives, straggle delays within
//       and beyond the timeout; a mismatch needs two ranks, so at world 1
//       it is a lost peer): run_fault_scenario() must keep Note [Fault
//       contract]. Faults are generated as values, not from a seed, so
//       RapidCheck shrinks a failure to the fewest, earliest, simplest
//       faults on the smallest scenario; the log gives the harness line
//       that replays it (`seed=... options=...` and
//       `./bazelw run //tools:harness -- ...`).
//   ShapeOnlySchedule.MatchesTheLedger
//       zero/schedule.h's collectives for random scenarios (the same space,
//       model mlp or gpt) equal the ledger of the real run, as a multiset.
//   Generators.*
//       Each generator above reaches every value its property claims
//       (Note [Closed ranges] in propertytests/generators.h).
//
// CI budget: main() defaults RapidCheck to max_success=kCiMaxSuccess unless
// RC_PARAMS sets max_success (a few seconds); long mode and reproduction:
// propertytests/README.md.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "models/task.h"
#include "parity/fault_run.h"
#include "parity/model_shape.h"
#include "sim/faults.h"
#include "propertytests/generators.h"
#include "propertytests/property_main.h"
#include "runtime/runtime_info.h"
#include "zero/schedule.h"

namespace zerostep {
namespace {

constexpr int kCiMaxSuccess = 30;

// A fault, with its position as a fraction (per mille) of the run's
// collectives, resolved once the scenario's length is known.
struct FaultDraw {
  int kind = 0;      // crash, straggle, mismatch, lost
  int rank = 0;      // modulo the world
  int position = 0;  // 0..1100 per mille: some land beyond the run
  int count = 1;     // straggle: 1..3 collectives
  int delay_ms = 1;  // straggle: 1 ms .. 120 s (timeout 60 s)
  int field = 0;     // mismatch: op, dtype, count
};

rc::Gen<FaultDraw> fault_draw() {
  return rc::gen::build<FaultDraw>(
      rc::gen::set(&FaultDraw::kind, uniform_closed(0, 3)),
      rc::gen::set(&FaultDraw::rank, uniform_closed(0, 3)),
      rc::gen::set(&FaultDraw::position, uniform_closed(0, 1100)),
      rc::gen::set(&FaultDraw::count, uniform_closed(1, 3)),
      rc::gen::set(&FaultDraw::delay_ms, uniform_closed(1, 120000)),
      rc::gen::set(&FaultDraw::field, uniform_closed(0, 2)));
}

// The fault a draw stands for in a run of `collectives` collectives at
// `world` ranks. A mismatch needs two ranks (Note [Fault model] in
// sim/faults.h): at world 1 it becomes a lost peer.
Fault resolve_fault(const FaultDraw& d, int world, int64_t collectives) {
  Fault x;
  x.kind = d.kind == 0                 ? FaultKind::kCrash
           : d.kind == 1               ? FaultKind::kStraggle
           : d.kind == 2 && world >= 2 ? FaultKind::kMismatch
                                       : FaultKind::kLostPeer;
  x.rank = d.rank % world;
  x.collective = d.position * collectives / 1000;
  if (x.kind == FaultKind::kStraggle) {
    x.count = d.count;
    x.delay_s = d.delay_ms / 1000.0;
  }
  x.field = static_cast<MismatchField>(d.field);
  return x;
}

// Stage 0-3, world 1-4, 1-3 windows of N in 1..4, micro batch 1-2, each
// scaling, persistence threshold, clipping; at stage 2 overlap_comm and,
// half the time, bucket sizes of 64..4000 elements. `fault_sized`: the mlp
// (the default model); otherwise mlp or gpt.
Scenario draw_scenario(bool fault_sized) {
  Scenario s;
  s.stage = *uniform_closed(0, 3);
  s.world_size = *uniform_closed(1, 4);
  // Scenario's default is one window of N = 4: replaced, not appended to.
  s.backwards = *rc::gen::container<std::vector<int>>(
      static_cast<size_t>(*uniform_closed(1, 3)), uniform_closed(1, 4));
  s.seed = *uniform_closed<uint64_t>(1, 1000000);
  s.scaling = static_cast<GradAccumScaling>(*uniform_closed(0, 2));
  s.micro_batch = *uniform_closed<int64_t>(1, 2);
  s.persistence_threshold = *rc::gen::element<int64_t>(0, 40, 100000);
  s.gradient_clipping = *rc::gen::element(0.0, 1.0);
  if (s.stage == 2) {
    s.overlap_comm = *rc::gen::arbitrary<bool>();
    if (*rc::gen::arbitrary<bool>()) {
      s.reduce_bucket_size = *uniform_closed<int64_t>(64, 4000);
      s.allgather_bucket_size = *uniform_closed<int64_t>(64, 4000);
    }
  }
  if (!fault_sized) s.model = *rc::gen::element<std::string>("mlp", "gpt");
  return s;
}

// A fault swarm case before its faults are placed: the scenario, the mode
// and 1-3 fault draws.
struct SwarmDraw {
  FaultScenario run;
  std::vector<FaultDraw> draws;
};

SwarmDraw draw_swarm() {
  SwarmDraw c;
  c.run.scenario = draw_scenario(/*fault_sized=*/true);
  c.run.managed = *rc::gen::arbitrary<bool>();
  c.draws = *rc::gen::resize(
      rc::kNominalSize, rc::gen::container<std::vector<FaultDraw>>(
                            *uniform_closed<size_t>(1, 3), fault_draw()));
  return c;
}

RC_GTEST_PROP(FaultSwarm, EveryFaultMixKeepsTheFaultContract, ()) {
  SwarmDraw c = draw_swarm();
  FaultScenario& f = c.run;
  const int64_t n = static_cast<int64_t>(baseline_schedule(f).size());
  for (const FaultDraw& d : c.draws)
    f.faults.faults.push_back(resolve_fault(d, f.scenario.world_size, n));
  RC_TAG("stage " + std::to_string(f.scenario.stage));
  const FaultRunResult r = run_fault_scenario(f);
  RC_TAG(r.any_failed ? "a fault fired" : "no error");
  RC_LOG() << "seed=" << f.scenario.seed << " options=" << f.faults.to_string()
           << "\nreplay: " << r.replay << "\n";
  for (size_t i = 0; i < r.ranks.size(); ++i)
    RC_LOG() << "rank " << i << ": " << r.ranks[i].error << "\n";
  for (const std::string& why : r.failures)
    RC_LOG() << "failure: " << why << "\n";
  RC_ASSERT(r.failures.empty());
  RC_ASSERT(r.ok);
}

using Key = std::tuple<CollectiveKind, std::string, uint64_t>;

RC_GTEST_PROP(ShapeOnlySchedule, MatchesTheLedger, ()) {
  FaultScenario f;
  f.scenario = draw_scenario(/*fault_sized=*/false);
  f.managed = *rc::gen::arbitrary<bool>();
  const Scenario& s = f.scenario;
  std::map<Key, int> real, plan;
  for (const CollectiveTiming& c : baseline_schedule(f))
    ++real[{c.kind, c.label, c.bytes}];
  const ModelShape shape =
      model_shape(*make_task(s.model)->make_model(1), s.model);
  ScheduleOptions o;
  o.stage = s.stage;
  o.world_size = s.world_size;
  o.managed = f.managed;
  o.overlap_comm = s.overlap_comm;
  o.persistence_threshold = s.persistence_threshold;
  if (s.reduce_bucket_size > 0) o.reduce_bucket_size = s.reduce_bucket_size;
  if (s.allgather_bucket_size > 0)
    o.allgather_bucket_size = s.allgather_bucket_size;
  auto add = [&](const std::vector<ScheduleEvent>& events) {
    for (const ScheduleEvent& e : events)
      if (e.type == ScheduleEvent::Type::kCollective)
        ++plan[{e.kind, e.phase, e.numel * dtype_size(e.dtype)}];
  };
  add(setup_schedule(shape, o));
  for (int n : s.backwards) {
    o.backwards = n;
    add(window_schedule(shape, o));
  }
  RC_LOG() << "scenario: " << replay_command(f) << "\n";
  RC_ASSERT(real == plan);
}

// Note [Closed ranges] (propertytests/generators.h): the generators above
// reach every value the properties claim. kDraws draws of each, from a
// fixed seed, at the sizes a property's run gives its cases.
constexpr int kDraws = 3000;

// What both properties draw through draw_scenario().
void expect_scenario_coverage(const std::vector<Scenario>& s) {
  EXPECT_EQ(values_of(s, [](const Scenario& x) { return x.stage; }),
            ints_in(0, 3));
  EXPECT_EQ(values_of(s, [](const Scenario& x) { return x.world_size; }),
            ints_in(1, 4));
  EXPECT_EQ(values_of(s, [](const Scenario& x) {
              return static_cast<int>(x.backwards.size());
            }),
            ints_in(1, 3))
      << "windows";
  std::set<int> n;
  for (const Scenario& x : s) n.insert(x.backwards.begin(), x.backwards.end());
  EXPECT_EQ(n, ints_in(1, 4)) << "N per window";
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return static_cast<int>(x.micro_batch);
                      }),
            ints_in(1, 2));
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return std::string(to_string(x.scaling));
                      }),
            (std::set<std::string>{"configured", "per_step_count", "none"}));
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return static_cast<int>(x.persistence_threshold);
                      }),
            (std::set<int>{0, 40, 100000}));
  EXPECT_EQ(
      values_of(s, [](const Scenario& x) { return x.gradient_clipping; }),
      (std::set<double>{0.0, 1.0}));
  // Stage 2's overlap_comm both ways, with default and with small buckets.
  std::set<std::pair<bool, bool>> stage2;
  for (const Scenario& x : s)
    if (x.stage == 2) stage2.insert({x.overlap_comm, x.reduce_bucket_size > 0});
  EXPECT_EQ(stage2.size(), 4u);
}

TEST(Generators, FaultSwarmReachesEveryClaimedValue) {
  const std::vector<SwarmDraw> draws =
      sample_draws(rc::gen::exec(draw_swarm), kDraws);
  std::vector<Scenario> scenarios;
  for (const SwarmDraw& d : draws) scenarios.push_back(d.run.scenario);
  expect_scenario_coverage(scenarios);
  EXPECT_EQ(values_of(scenarios, [](const Scenario& x) { return x.model; }),
            std::set<std::string>{"mlp"});
  EXPECT_EQ(values_of(draws, [](const SwarmDraw& d) { return d.run.managed; }),
            (std::set<bool>{false, true}));
  EXPECT_EQ(values_of(draws,
                      [](const SwarmDraw& d) {
                        return static_cast<int>(d.draws.size());
                      }),
            ints_in(1, 3))
      << "faults per case";
  // Placed in a run of 100 collectives, as the property places them in the
  // scenario's own: every kind at every world where it means something
  // (mismatch from world 2), every rank of every world, each mismatch
  // field, straggles of 1-3 collectives within and beyond the 60 s
  // timeout, and positions inside and beyond the run.
  constexpr int64_t kCollectives = 100;
  std::set<std::pair<std::string, int>> kinds, ranks;
  std::set<std::string> fields;
  std::set<int64_t> straggle_counts;
  std::set<bool> beyond_timeout, beyond_run;
  for (const SwarmDraw& d : draws) {
    const int w = d.run.scenario.world_size;
    for (const FaultDraw& fd : d.draws) {
      const Fault x = resolve_fault(fd, w, kCollectives);
      kinds.insert({to_string(x.kind), w});
      ranks.insert({"world " + std::to_string(w), x.rank});
      if (x.kind == FaultKind::kMismatch) fields.insert(to_string(x.field));
      if (x.kind == FaultKind::kStraggle) {
        straggle_counts.insert(x.count);
        beyond_timeout.insert(x.delay_s > 60.0);
      }
      beyond_run.insert(x.collective >= kCollectives);
    }
  }
  std::set<std::pair<std::string, int>> want_kinds, want_ranks;
  for (int w = 1; w <= 4; ++w) {
    for (FaultKind k : {FaultKind::kCrash, FaultKind::kStraggle,
                        FaultKind::kMismatch, FaultKind::kLostPeer})
      if (k != FaultKind::kMismatch || w >= 2)
        want_kinds.insert({to_string(k), w});
    for (int r = 0; r < w; ++r)
      want_ranks.insert({"world " + std::to_string(w), r});
  }
  EXPECT_EQ(kinds, want_kinds);
  EXPECT_EQ(ranks, want_ranks);
  EXPECT_EQ(fields, (std::set<std::string>{"op", "dtype", "count"}));
  EXPECT_EQ(straggle_counts, (std::set<int64_t>{1, 2, 3}));
  EXPECT_EQ(beyond_timeout, (std::set<bool>{false, true}));
  EXPECT_EQ(beyond_run, (std::set<bool>{false, true}));
}

TEST(Generators, ShapeOnlyScheduleReachesEveryClaimedValue) {
  const std::vector<Scenario> s = sample_draws(
      rc::gen::exec([] { return draw_scenario(/*fault_sized=*/false); }),
      kDraws);
  expect_scenario_coverage(s);
  EXPECT_EQ(values_of(s, [](const Scenario& x) { return x.model; }),
            (std::set<std::string>{"mlp", "gpt"}));
}


}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  zerostep::prepare_property_run(zerostep::kCiMaxSuccess);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
