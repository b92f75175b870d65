#include "parity/fault_run.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "engine/engine.h"
#include "models/task.h"
#include "parity/engine_snapshot.h"
#include "sim/sim_world.h"

namespace zerostep {
namespace {

std::string type_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const CommError&) {
    return "CommError";
  } catch (const UsageError&) {
    return "UsageError";
  } catch (const InternalError&) {
    return "InternalError";
  } catch (const std::exception&) {
    return "std::exception";
  } catch (...) {
    return "unknown";
  }
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "(non-standard exception)";
  }
}

struct Trained {
  std::vector<FaultRankOutcome> ranks;
  std::vector<CollectiveTiming> schedule;  // rank 0's
  int64_t collectives = 0;
  double time_s = 0.0;
};

Trained train(const FaultScenario& run, const FaultOptions& faults) {
  const Scenario& s = run.scenario;
  SimOptions so;
  so.world_size = s.world_size;
  so.seed = s.seed;
  so.faults = faults;
  SimWorld world(so);
  std::unique_ptr<Task> task = make_task(s.model, s.model_scale);
  int64_t total = 0;
  for (int n : s.backwards)
    total += static_cast<int64_t>(n) * s.world_size * s.micro_batch;
  const Batch data = task->make_data(s.seed ^ 0x5eed, total);
  const Config config = scenario_config(s, run.managed);
  const bool varying =
      std::adjacent_find(s.backwards.begin(), s.backwards.end(),
                         std::not_equal_to<int>()) != s.backwards.end();
  const bool drive_override = run.managed && varying;
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < s.world_size; ++r)
    models.push_back(task->make_model(s.seed));
  Trained out;
  out.ranks.resize(s.world_size);
  std::vector<std::string> failed_call(s.world_size);
  auto errors = world.run_collect([&](int r) {
    FaultRankOutcome& o = out.ranks[r];
    // The constructor broadcasts rank 0's parameters: a fault there fails
    // construction, before there is any state to keep.
    o.failed_call = "Engine construction";
    Engine engine(models[r], config, &world.comm(r));
    o.failed_call.clear();
    const double params = static_cast<double>(engine.layout().numel);
    int64_t base = 0;
    std::string call;
    EngineSnapshot before;
    // Runs one engine call; on an error, checks what the call left behind.
    auto guarded = [&](const std::string& name,
                       const std::function<void()>& f) {
      call = name;
      before = capture_engine_snapshot(engine);
      try {
        f();
      } catch (const CommError&) {
        o.failed_call = name;
        o.state_unchanged = capture_engine_snapshot(engine) == before;
        try {
          engine.step();
          o.refused_after = false;
        } catch (const UsageError&) {
        } catch (...) {
          o.refused_after = false;
        }
        throw;
      } catch (...) {
        o.failed_call = name;
        o.state_unchanged = capture_engine_snapshot(engine) == before;
        throw;
      }
    };
    for (size_t k = 0; k < s.backwards.size(); ++k) {
      const int n = s.backwards[k];
      for (int i = 0; i < n; ++i) {
        const int64_t first =
            base + (static_cast<int64_t>(i) * s.world_size + r) * s.micro_batch;
        // Modelled compute of this micro-batch's forward and backward
        // (Note [Cost model]: one token per sample for these models).
        const double tokens = static_cast<double>(s.micro_batch);
        world.compute(r, so.cost.forward_seconds(params, tokens) +
                             so.cost.backward_seconds(params, tokens));
        const std::string where = " of window " + std::to_string(k);
        guarded("backward " + std::to_string(i + 1) + where, [&] {
          torch::Tensor loss =
              task->loss(*models[r], slice(data, first, s.micro_batch));
          if (drive_override)
            engine.set_gradient_accumulation_boundary(i == n - 1);
          engine.backward(loss);
        });
        if (run.managed) guarded("step" + where, [&] { engine.step(); });
      }
      if (!run.managed)
        guarded("step of window " + std::to_string(k), [&] { engine.step(); });
      base += static_cast<int64_t>(n) * s.world_size * s.micro_batch;
    }
    const std::vector<float> mine = engine.owned_parameters();
    o.digest = fnv1a_hex(mine.data(), mine.size() * sizeof(float));
  });
  for (int r = 0; r < s.world_size; ++r) {
    FaultRankOutcome& o = out.ranks[r];
    if (errors[r]) {
      o.error = what_of(errors[r]);
      o.error_type = type_of(errors[r]);
    }
    o.virtual_time_s = world.clock(r).now_s;
    o.exposed_comm_s = world.clock(r).exposed_comm_s;
  }
  out.schedule = world.timeline(0);
  out.collectives = static_cast<int64_t>(out.schedule.size());
  out.time_s = world.clock(0).now_s;
  return out;
}

// Whether `msg` names a fault of `faults` that covers the collective it
// reports ("collective #K"), with its rank.
bool names_a_fault(const std::string& msg, const FaultOptions& faults) {
  static const std::regex collective("collective #([0-9]+)");
  std::vector<int64_t> ks;
  for (std::sregex_iterator it(msg.begin(), msg.end(), collective), end;
       it != end; ++it)
    ks.push_back(std::stoll((*it)[1].str()));
  // "rank 2" and "ranks 0, 1": the ranks the message names.
  static const std::regex ranks("ranks? ([0-9]+(, [0-9]+)*)");
  static const std::regex number("[0-9]+");
  std::set<int64_t> named_ranks;
  for (std::sregex_iterator it(msg.begin(), msg.end(), ranks), end; it != end;
       ++it) {
    const std::string list = (*it)[1].str();
    for (std::sregex_iterator n(list.begin(), list.end(), number); n != end;
         ++n)
      named_ranks.insert(std::stoll(n->str()));
  }
  for (const Fault& f : faults.faults) {
    if (msg.find("injected fault " + f.to_string()) == std::string::npos)
      continue;
    if (named_ranks.count(f.rank) == 0) continue;
    for (int64_t k : ks)
      if (f.hits(f.rank, k)) return true;
  }
  return false;
}

}  // namespace

std::string replay_command(const FaultScenario& run) {
  return "./bazelw run //tools:harness -- --faults=" + run.faults.to_string() +
         " --managed=" + (run.managed ? "true" : "false") +
         harness_flags(run.scenario);
}

std::vector<CollectiveTiming> baseline_schedule(const FaultScenario& run) {
  return train(run, FaultOptions{}).schedule;
}

FaultRunResult run_fault_scenario(const FaultScenario& run) {
  const Scenario& s = run.scenario;
  if (s.backend != "sim")
    throw UsageError("fault scenarios run on the simulator only (backend '" +
                     s.backend + "')");
  if (s.backwards.empty())
    throw UsageError("a fault scenario needs at least one window");
  validate(run.faults, s.world_size);
  FaultRunResult res;
  res.run = run;
  res.replay = replay_command(run);
  FaultOptions no_faults;
  no_faults.timeout_s = run.faults.timeout_s;
  const Trained base = train(run, no_faults);
  res.baseline_collectives = base.collectives;
  res.baseline_time_s = base.time_s;
  res.baseline_digest = base.ranks[0].digest;
  const Trained faulty = train(run, run.faults);
  res.ranks = faulty.ranks;
  auto fail = [&](const std::string& why) { res.failures.push_back(why); };
  for (int r = 0; r < s.world_size; ++r) {
    if (!base.ranks[r].error.empty())
      fail("rank " + std::to_string(r) +
           " failed without faults: " + base.ranks[r].error);
    res.any_failed = res.any_failed || !res.ranks[r].error.empty();
  }
  double delays = 0.0;
  for (const Fault& f : run.faults.faults)
    if (f.kind == FaultKind::kStraggle) delays += f.delay_s * f.count;
  const double bound = base.time_s + delays + run.faults.timeout_s;
  for (int r = 0; r < s.world_size; ++r) {
    const FaultRankOutcome& o = res.ranks[r];
    const std::string who = "rank " + std::to_string(r) + ": ";
    if (o.virtual_time_s > bound * (1 + 1e-12))
      fail(who + "virtual time " + std::to_string(o.virtual_time_s) +
           " s exceeds the bound " + std::to_string(bound) + " s");
    if (!res.any_failed) {
      if (o.digest != base.ranks[r].digest)
        fail(who + "finished with other parameters than without faults");
      continue;
    }
    if (o.error.empty()) {
      fail(who + "finished although another rank failed");
      continue;
    }
    if (o.error_type != "CommError")
      fail(who + "ended with " + o.error_type + ", not CommError: " + o.error);
    if (!names_a_fault(o.error, run.faults))
      fail(who +
           "the error does not name the injected fault, its rank and "
           "collective: " +
           o.error);
    const bool names_call =
        o.error.find("step() at global step") != std::string::npos ||
        o.error.find("backward() number") != std::string::npos ||
        o.error.find("forward of a ZeRO-3 block") != std::string::npos ||
        (o.failed_call == "Engine construction" &&
         o.error.find("phase setup") != std::string::npos);
    if (!names_call)
      fail(who + "the error does not name the engine call: " + o.error);
    if (!o.state_unchanged)
      fail(who +
           "parameters, optimizer state or counters changed in the "
           "failed call (" +
           o.failed_call + ")");
    if (!o.refused_after)
      fail(who +
           "a step() after the failure was not refused with "
           "UsageError");
  }
  res.ok = res.failures.empty();
  return res;
}

}  // namespace zerostep
