// Property-based tests of the simulator's faults and shape-only schedule,
// with RapidCheck on top of Google Test.
//
//   FaultSwarm.EveryFaultMixKeepsTheFaultContract
//       A random scenario (stage 0-3, world 1-4, managed or not, 1-3
//       windows of N in 1..4, overlap_comm at stage 2, seed) and a random
//       mix of 1-3 faults (crash, straggle, mismatch, lost peer at random
//       ranks and collectives, straggle delays within and beyond the
//       timeout): run_fault_scenario() must keep Note [Fault contract].
//       Faults are generated as values, not from a seed, so RapidCheck
//       shrinks a failure to the fewest, earliest, simplest faults on the
//       smallest scenario; the log gives the harness line that replays it
//       (`seed=... options=...` and `./bazelw run //tools:harness -- ...`).
//   ShapeOnlySchedule.MatchesTheLedger
//       zero/schedule.h's collectives for random scenarios (stage, world,
//       mode, N sequence, overlap, bucket sizes, model) equal the ledger of
//       the real run, as a multiset.
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
#include <string>
#include <tuple>
#include <vector>

#include "models/task.h"
#include "parity/fault_run.h"
#include "parity/model_shape.h"
#include "sim/faults.h"
#include "propertytests/property_main.h"
#include "runtime/runtime_info.h"
#include "zero/schedule.h"

namespace zerostep {
namespace {

constexpr int kCiMaxSuccess = 30;

// Uniform at full size from the first case (see parity_property_test.cc).
template <typename T>
rc::Gen<T> uniform_in(T min, T max) {
  return rc::gen::resize(rc::kNominalSize, rc::gen::inRange<T>(min, max));
}

// A fault, with its position as a fraction (per mille) of the run's
// collectives, resolved once the scenario's length is known.
struct FaultDraw {
  int kind = 0;      // crash, straggle, mismatch, lost
  int rank = 0;      // modulo the world
  int position = 0;  // 0..1100 per mille: some land beyond the run
  int count = 1;     // straggle
  int delay_ms = 1;  // straggle: 1 ms .. 120 s (timeout 60 s)
  int field = 0;     // mismatch
};

rc::Gen<FaultDraw> fault_draw() {
  return rc::gen::build<FaultDraw>(
      rc::gen::set(&FaultDraw::kind, uniform_in(0, 3)),
      rc::gen::set(&FaultDraw::rank, uniform_in(0, 3)),
      rc::gen::set(&FaultDraw::position, uniform_in(0, 1100)),
      rc::gen::set(&FaultDraw::count, uniform_in(1, 3)),
      rc::gen::set(&FaultDraw::delay_ms, uniform_in(1, 120000)),
      rc::gen::set(&FaultDraw::field, uniform_in(0, 2)));
}

Scenario draw_scenario(bool fault_sized) {
  Scenario s;
  s.stage = *uniform_in(0, 3);
  s.world_size = *uniform_in(1, 4);
  const int windows = *uniform_in(1, 3);
  for (int k = 0; k < windows; ++k) s.backwards.push_back(*uniform_in(1, 4));
  s.seed = *uniform_in<uint64_t>(1, 1000000);
  s.scaling = static_cast<GradAccumScaling>(*uniform_in(0, 2));
  s.micro_batch = *uniform_in<int64_t>(1, 2);
  s.persistence_threshold = *rc::gen::element<int64_t>(0, 40, 100000);
  s.gradient_clipping = *rc::gen::element(0.0, 1.0);
  if (s.stage == 2) {
    s.overlap_comm = *rc::gen::arbitrary<bool>();
    if (*rc::gen::arbitrary<bool>()) {
      s.reduce_bucket_size = *uniform_in<int64_t>(64, 4000);
      s.allgather_bucket_size = *uniform_in<int64_t>(64, 4000);
    }
  }
  if (!fault_sized) s.model = *rc::gen::element<std::string>("mlp", "gpt");
  return s;
}

RC_GTEST_PROP(FaultSwarm, EveryFaultMixKeepsTheFaultContract, ()) {
  FaultScenario f;
  f.scenario = draw_scenario(/*fault_sized=*/true);
  f.managed = *rc::gen::arbitrary<bool>();
  const auto draws = *rc::gen::resize(
      rc::kNominalSize, rc::gen::container<std::vector<FaultDraw>>(
                            *uniform_in<size_t>(1, 3), fault_draw()));
  const int64_t n = static_cast<int64_t>(baseline_schedule(f).size());
  const int w = f.scenario.world_size;
  for (const FaultDraw& d : draws) {
    Fault x;
    x.kind = d.kind == 0             ? FaultKind::kCrash
             : d.kind == 1           ? FaultKind::kStraggle
             : d.kind == 2 && w >= 2 ? FaultKind::kMismatch
                                     : FaultKind::kLostPeer;
    x.rank = d.rank % w;
    x.collective = d.position * n / 1000;
    if (x.kind == FaultKind::kStraggle) {
      x.count = d.count;
      x.delay_s = d.delay_ms / 1000.0;
    }
    x.field = static_cast<MismatchField>(d.field);
    f.faults.faults.push_back(x);
  }
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


}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  zerostep::prepare_property_run(zerostep::kCiMaxSuccess);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
