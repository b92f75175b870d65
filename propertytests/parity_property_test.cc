// Property-based tests of the managed/unmanaged accumulation boundary
// (DESIGN.md §1), with RapidCheck on top of Google Test.
//
//   ParityProperty.UnmanagedMatchesManagedTwin
//       run_scenario() over random (world, stage, N sequence, scaling, model,
//       micro batch, seed): unmanaged == managed twin bitwise, same comm
//       bytes, every check of the scenario passes.
//   UnmanagedInvariants.RandomBackwardStepSequences
//       Engines (stage 0-3, world 1-4) in a SimWorld driven by a random
//       backward/step sequence (the same on every rank) in unmanaged mode.
//   ManagedInvariants.StandardLoopUpdatesEveryGasMicroSteps
//       Engines (stage 0-3, world 1-4) in managed mode with backward()+step()
//       per micro batch: the parameters move on every GAS-th micro-step and
//       only then.
//   Generators.*
//       Each generator above reaches every value its property claims
//       (Note [Closed ranges] in propertytests/generators.h).
//
// CI budget: main() below defaults RapidCheck to max_success=kCiMaxSuccess
// unless RC_PARAMS already sets max_success. Long mode and reproduction:
// propertytests/README.md.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <stdlib.h>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/ledger.h"
#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "parity/scenario.h"
#include "sim/sim_world.h"
#include "propertytests/generators.h"
#include "propertytests/property_main.h"
#include "runtime/runtime_info.h"
#include "zero/phase.h"

namespace zerostep {
namespace {

// Successful cases per property when RC_PARAMS does not say otherwise.
constexpr int kCiMaxSuccess = 40;

// How many times each property's body ran (generated cases plus shrink
// attempts), printed at exit so the CI budget can be checked in the log.
std::map<std::string, int>& body_runs() {
  static std::map<std::string, int> runs;
  return runs;
}
void count_run(const std::string& property) { ++body_runs()[property]; }

const std::vector<std::string>& scaling_names() {
  static const std::vector<std::string> names = {"configured", "per_step_count",
                                                 "none"};
  return names;
}

GradAccumScaling scaling_from(const std::string& name) {
  return grad_accum_scaling_from_string(name).value();
}

// One directory for the nvme scenarios of this process (each run uses its
// own files in it, one after another), removed at exit.
const std::string& nvme_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/zerostep_prop_nvme_XXXXXX";
    if (mkdtemp(tmpl) == nullptr) std::abort();
    return std::string(tmpl);
  }();
  static const struct Cleanup {
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup;
  return dir;
}

// The same scenario as a harness command line, to rerun it outside
// RapidCheck.
std::string harness_command(const Scenario& s) {
  return "./bazelw run //tools:harness --" + harness_flags(s);
}

Config engine_config(int world, int stage, bool managed, int64_t gas,
                     int64_t micro_batch, const std::string& scaling) {
  nlohmann::json j;
  j["train_micro_batch_size_per_gpu"] = micro_batch;
  j["gradient_accumulation_steps"] = gas;
  j["managed_gradient_accumulation"] = managed;
  j["gradient_accumulation_scaling"] = scaling;
  j["zero_optimization"] = {{"stage", stage}};
  j["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}};
  return parse_config(j.dump(), world);
}

// Per-rank violations, collected inside the rank threads (RapidCheck's
// RC_* macros are for the property's own thread) and asserted afterwards.
class Violations {
 public:
  explicit Violations(int world) : per_rank_(world) {}
  void expect(int rank, bool cond, const std::string& what) {
    if (!cond) per_rank_[rank].push_back(what);
  }
  // Logs every violation (rank-prefixed) and returns how many there were.
  size_t log_all() const {
    size_t n = 0;
    for (size_t r = 0; r < per_rank_.size(); ++r)
      for (const std::string& v : per_rank_[r]) {
        RC_LOG() << "rank " << r << ": " << v << "\n";
        ++n;
      }
    return n;
  }

 private:
  std::vector<std::vector<std::string>> per_rank_;
};

std::vector<std::shared_ptr<torch::nn::Module>> make_models(const Task& task,
                                                            int world,
                                                            uint64_t seed) {
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < world; ++r) models.push_back(task.make_model(seed));
  return models;
}

// Rank r's i-th backward uses samples [(i·W + r)·mb, +mb).
Batch micro_batch_of(const Batch& data, int64_t i, int world, int rank,
                     int64_t mb) {
  return slice(data, (i * world + rank) * mb, mb);
}

// ---------------------------------------------------------------------------
// a. Parity: unmanaged (N_k backward + 1 step per window) vs the managed twin
//    vs the single-rank reference, through run_scenario().
// ---------------------------------------------------------------------------
// The parity property's scenario: world 1-4, stage 0-3, 1-4 windows of N in
// 1..6, every scaling, mlp 9:1 gpt at model_scale 1-2, micro batch 1-3,
// clipping, no scheduler or one of three, fp32/bf16/fp16 (fp16 with or
// without an injected overflow, of either kind, at any window, rank and
// backward of it), offload none/cpu/nvme at stages 1-3, and each stage's
// own keys. Generators.ParityScenarioReachesEveryClaimedValue samples it.
Scenario draw_parity_scenario() {
  Scenario s;
  s.world_size = *uniform_closed(1, 4).as("world_size");
  s.stage = *uniform_closed(0, 3).as("stage");
  const int windows = *uniform_closed(1, 4).as("windows");
  s.backwards = *rc::gen::container<std::vector<int>>(
                     static_cast<size_t>(windows), uniform_closed(1, 6))
                     .as("backwards (N per window)");
  s.scaling = scaling_from(
      *rc::gen::elementOf(scaling_names()).as("gradient_accumulation_scaling"));
  s.model = *rc::gen::weightedElement<std::string>({{9, "mlp"}, {1, "gpt"}})
                 .as("model");
  s.model_scale = *uniform_closed(1, 2).as("model_scale");
  s.micro_batch = *uniform_closed<int64_t>(1, 3).as("micro_batch");
  s.seed = *uniform_closed<uint64_t>(0, (1u << 20) - 1).as("seed");
  s.gradient_clipping =
      *rc::gen::element<double>(0.0, 0.05, 1.0).as("gradient_clipping");
  const int schedule = *uniform_closed(0, 3).as("scheduler (0 = none)");
  if (schedule > 0) {
    static const char* kSchedules[] = {
        "",
        R"({"type": "WarmupLR", "params": {"warmup_num_steps": 3,
            "warmup_max_lr": 0.003, "warmup_type": "linear"}})",
        R"({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2,
            "total_num_steps": 4, "warmup_max_lr": 0.003}})",
        R"({"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2,
            "total_num_steps": 4}})"};
    s.base_config_json =
        std::string(R"({"train_micro_batch_size_per_gpu": 1,
                        "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
                        "scheduler": )") +
        kSchedules[schedule] + "}";
  }
  s.dtype = *rc::gen::weightedElement<Precision>({{2, Precision::kFp32},
                                                  {1, Precision::kBf16},
                                                  {1, Precision::kFp16}})
                 .as("dtype");
  if (s.dtype == Precision::kFp16 && *rc::gen::arbitrary<bool>().as("overflow")) {
    // One micro-batch of one rank overflows: that window must be skipped
    // on every rank, with the same loss-scale trajectory in all runs.
    // kLoss overflows every gradient element; kElement one element on the
    // drawn rank only, which at stages 1-3 one rank alone owns (Note
    // [Overflow in one element]). Shrinking tries kLoss first.
    s.overflow_window = *uniform_closed(0, windows - 1).as("overflow window");
    s.overflow_rank =
        *uniform_closed(0, s.world_size - 1).as("overflow rank");
    s.overflow_backward =
        *uniform_closed(0, s.backwards[s.overflow_window] - 1)
             .as("overflow backward");
    s.overflow_kind =
        *rc::gen::element(OverflowKind::kLoss, OverflowKind::kElement)
             .as("overflow kind");
  }
  if (s.stage >= 1) {
    s.offload = *rc::gen::weightedElement<OffloadDevice>(
                     {{2, OffloadDevice::kNone},
                      {1, OffloadDevice::kCpu},
                      {1, OffloadDevice::kNvme}})
                     .as("offload_optimizer.device");
    if (s.offload == OffloadDevice::kNvme) {
      s.nvme_path = nvme_dir();
      s.sub_group_size = *rc::gen::element<int64_t>(257, 1000, 100000)
                              .as("sub_group_size");
    }
  }
  if (s.stage == 3) {
    s.persistence_threshold =
        *rc::gen::element<int64_t>(0, 3000, 100000).as("persistence_threshold");
    // Note [Stage 3 gather once per step]: both modes with it, and the
    // scenario trains it again without it for the same bits.
    s.gather_once_per_step =
        *rc::gen::arbitrary<bool>().as("gather_once_per_step");
  }
  if (s.stage >= 2) {
    // Note [Reduce once per step] (zero/stage.h): both modes with it.
    s.reduce_once_per_step =
        *rc::gen::arbitrary<bool>().as("reduce_once_per_step");
  }
  if (s.stage == 2) {
    // Small buckets so that several buckets and all-gather pieces occur.
    s.overlap_comm = *rc::gen::arbitrary<bool>().as("overlap_comm");
    s.reduce_bucket_size =
        *rc::gen::element<int64_t>(0, 256, 1024, 4096).as("reduce_bucket_size");
    s.allgather_bucket_size = *rc::gen::element<int64_t>(0, 128, 1024)
                                   .as("allgather_bucket_size");
  }
  return s;
}

RC_GTEST_PROP(ParityProperty, UnmanagedMatchesManagedTwin, ()) {
  count_run("ParityProperty.UnmanagedMatchesManagedTwin");
  const Scenario s = draw_parity_scenario();
  RC_CLASSIFY(!s.base_config_json.empty(), "scheduler");
  RC_CLASSIFY(s.gradient_clipping > 0, "clipping");
  RC_TAG(std::string(to_string(s.dtype)), std::string(to_string(s.offload)));
  RC_CLASSIFY(s.overflow_window >= 0, "injected overflow");
  RC_CLASSIFY(
      s.overflow_window >= 0 && s.overflow_kind == OverflowKind::kElement,
      "overflow in one element");
  RC_CLASSIFY(s.gather_once_per_step, "gather once per step");
  RC_CLASSIFY(s.reduce_once_per_step, "reduce once per step");

  const bool varying =
      std::adjacent_find(s.backwards.begin(), s.backwards.end(),
                         std::not_equal_to<int>()) != s.backwards.end();
  RC_TAG("stage " + std::to_string(s.stage), std::string(to_string(s.scaling)));
  RC_CLASSIFY(varying, "varying N");
  RC_CLASSIFY(s.world_size == 1, "world 1");
  RC_CLASSIFY(s.model == "gpt", "gpt");

  const ScenarioResult res = run_scenario(s);
  RC_LOG() << "scenario: " << harness_command(s) << "\n"
           << "result:   " << to_json_line(res) << "\n";
  for (const std::string& f : res.failures)
    RC_LOG() << "failure: " << f << "\n";

  // The managed/unmanaged claims are exact and the reference check is a
  // relative-L2 tolerance (Note [Parity claims]); every check must pass.
  RC_ASSERT(res.bitwise_equal);
  RC_ASSERT(res.unmanaged.comm_bytes == res.managed.comm_bytes);
  RC_ASSERT(res.failures.empty());
  RC_ASSERT(res.ok);
}

// ---------------------------------------------------------------------------
// b. Unmanaged mode, a random sequence of backward ('B') and step ('S') calls,
//    identical on every rank.
// ---------------------------------------------------------------------------
struct RankCounters {
  int64_t micro_steps, global_steps, global_samples, skipped_steps,
      window_backwards;
  bool step_applied;
  bool operator==(const RankCounters& o) const {
    return micro_steps == o.micro_steps && global_steps == o.global_steps &&
           global_samples == o.global_samples &&
           skipped_steps == o.skipped_steps &&
           window_backwards == o.window_backwards &&
           step_applied == o.step_applied;
  }
};

RankCounters counters_of(const Engine& e) {
  return {e.micro_steps(),   e.global_steps(),     e.global_samples(),
          e.skipped_steps(), e.window_backwards(), e.was_step_applied()};
}

std::string show(const RankCounters& c) {
  std::ostringstream os;
  os << "{micro_steps " << c.micro_steps << ", global_steps " << c.global_steps
     << ", global_samples " << c.global_samples << ", skipped_steps "
     << c.skipped_steps << ", window_backwards " << c.window_backwards
     << ", was_step_applied " << c.step_applied << "}";
  return os.str();
}

// What both invariant properties draw: world 1-4, stage 0-3, every
// scaling, GAS 1-4 (unmanaged: read only by "configured"), micro batch 1-3,
// seed.
struct LoopDraw {
  int world = 1;
  int stage = 0;
  std::string scaling;
  int64_t gas = 1;
  int64_t mb = 1;
  uint64_t seed = 0;
};

LoopDraw draw_loop(const char* gas_label) {
  LoopDraw d;
  d.world = *uniform_closed(1, 4).as("world_size");
  d.stage = *uniform_closed(0, 3).as("stage");
  d.scaling =
      *rc::gen::elementOf(scaling_names()).as("gradient_accumulation_scaling");
  d.gas = *uniform_closed<int64_t>(1, 4).as(gas_label);
  d.mb = *uniform_closed<int64_t>(1, 3).as("micro_batch");
  d.seed = *uniform_closed<uint64_t>(0, (1u << 20) - 1).as("seed");
  return d;
}

// 1-12 ops, backward 2:1 step.
std::string draw_ops() {
  const int length = *uniform_closed(1, 12).as("ops length");
  return *rc::gen::container<std::string>(
              static_cast<size_t>(length),
              rc::gen::weightedElement<char>({{2, 'B'}, {1, 'S'}}))
              .as("ops (B = backward, S = step)");
}

// 1-12 backward()+step() pairs.
int64_t draw_micro_steps() {
  return *uniform_closed<int64_t>(1, 12).as(
      "micro-steps (backward+step pairs)");
}

// Every trainable parameter, gathered (a collective at stage 3: every
// rank calls it at the same point).
torch::Tensor parameters_now(Engine& e) { return e.full_parameters(); }

RC_GTEST_PROP(UnmanagedInvariants, RandomBackwardStepSequences, ()) {
  count_run("UnmanagedInvariants.RandomBackwardStepSequences");
  const LoopDraw d =
      draw_loop("gradient_accumulation_steps (configured only)");
  const std::string ops = draw_ops();
  const int world = d.world, stage = d.stage;
  const int64_t mb = d.mb;

  // The expected outcome, computed from the op sequence alone.
  int64_t backwards = 0, window = 0, consumed = 0, steps_ok = 0,
          empty_steps = 0;
  for (char op : ops) {
    if (op == 'B') {
      ++backwards;
      ++window;
    } else if (window > 0) {
      consumed += window;
      window = 0;
      ++steps_ok;
    } else {
      ++empty_steps;
    }
  }
  RC_TAG("stage " + std::to_string(stage));
  RC_CLASSIFY(empty_steps > 0, "step() with an empty window");
  RC_CLASSIFY(window > 0, "ends with an open window");

  const Config cfg =
      engine_config(world, stage, /*managed=*/false, d.gas, mb, d.scaling);
  std::unique_ptr<Task> task = make_task("mlp");
  const Batch data = task->make_data(
      d.seed ^ 0xb0b, std::max<int64_t>(1, backwards) * world * mb);
  auto models = make_models(*task, world, d.seed);
  SimWorld sim({world, d.seed});
  Violations v(world);
  std::vector<RankCounters> final_counters(world);
  std::vector<torch::Tensor> final_params(world);

  sim.run([&](int r) {
    Engine e(models[r], cfg, &sim.comm(r));
    int64_t i = 0;  // backward calls so far on this rank
    for (size_t k = 0; k < ops.size(); ++k) {
      const std::string at = "op " + std::to_string(k) + " '" + ops[k] + "'";
      v.expect(r, !e.is_gradient_accumulation_boundary(),
               at + ": is_gradient_accumulation_boundary() true before it");
      const RankCounters before = counters_of(e);
      if (ops[k] == 'B') {
        torch::Tensor loss =
            task->loss(*models[r], micro_batch_of(data, i++, world, r, mb));
        e.backward(loss);
        RankCounters want = before;
        ++want.micro_steps;
        ++want.window_backwards;
        v.expect(r, counters_of(e) == want,
                 at + ": counters " + show(counters_of(e)) + ", expected " +
                     show(want));
      } else if (before.window_backwards == 0) {
        const torch::Tensor params = parameters_now(e);
        // Stages 2 and 3 keep no full gradient to compare (Note [Stage 2
        // buckets] in zero/stage2.h; stage 3's are per group); the window
        // is empty here anyway.
        const torch::Tensor grads =
            stage < 2 ? e.flat_gradients().clone() : torch::Tensor();
        bool threw = false;
        try {
          e.step();
        } catch (const UsageError&) {
          threw = true;
        }
        v.expect(r, threw, at + ": step() with no backward did not throw");
        v.expect(r, torch::equal(parameters_now(e), params),
                 at + ": rejected step() changed the parameters");
        if (grads.defined())
          v.expect(r, torch::equal(e.flat_gradients(), grads),
                   at + ": rejected step() changed the gradients");
        v.expect(r, counters_of(e) == before,
                 at + ": rejected step() changed counters " + show(before) +
                     " -> " + show(counters_of(e)));
      } else {
        e.step();
        RankCounters want = before;
        ++want.global_steps;
        want.global_samples += mb * world * before.window_backwards;
        want.window_backwards = 0;
        want.step_applied = true;
        v.expect(r, counters_of(e) == want,
                 at + ": counters " + show(counters_of(e)) + ", expected " +
                     show(want));
        if (stage < 2) {
          v.expect(r, e.flat_gradients().abs().max().item<float>() == 0.0f,
                   at + ": gradients not cleared after step()");
        } else if (stage == 2) {
          bool none = true;
          for (const torch::Tensor& p : e.parameters())
            none = none && !p.grad().defined();
          v.expect(r, none, at + ": a .grad left after step()");
        }
        // Stage 3 has no gradient buffer to read: a gradient left over
        // would reach the next window, which ParityProperty's single-rank
        // reference check sees.
      }
      v.expect(r, !e.is_gradient_accumulation_boundary(),
               at + ": is_gradient_accumulation_boundary() true after it");
    }
    final_counters[r] = counters_of(e);
    final_params[r] = parameters_now(e);
  });

  RC_LOG() << "expected: global_steps " << steps_ok << ", backwards consumed "
           << consumed << ", open window " << window << "\n";
  for (int r = 0; r < world; ++r) {
    RC_LOG() << "rank " << r << " final " << show(final_counters[r])
             << ", backward-phase bytes "
             << sim.ledger(r).bytes_in(phase::kBackward) << "\n";
  }
  RC_ASSERT(v.log_all() == 0u);
  for (int r = 0; r < world; ++r) {
    const RankCounters& c = final_counters[r];
    RC_ASSERT(c.global_steps == steps_ok);
    RC_ASSERT(c.global_samples == mb * world * consumed);
    RC_ASSERT(c.micro_steps == backwards);
    RC_ASSERT(c.window_backwards == window);
    RC_ASSERT(c.skipped_steps == 0);
    // Stage 0/1 unmanaged: backward() never communicates. Stages 2/3
    // reduce-scatter in every backward (agreement + buckets or groups).
    if (stage < 2) {
      RC_ASSERT(sim.ledger(r).bytes_in(phase::kBackward) == 0u);
      RC_ASSERT(sim.ledger(r).count_in(phase::kBackward) == 0u);
    } else {
      RC_ASSERT(sim.ledger(r).count_in(phase::kBackward) >=
                2 * static_cast<size_t>(backwards));
    }
    RC_ASSERT(torch::equal(final_params[r], final_params[0]));
  }
}

// ---------------------------------------------------------------------------
// c. Managed mode, the standard loop: backward() + step() per micro batch.
// ---------------------------------------------------------------------------
RC_GTEST_PROP(ManagedInvariants, StandardLoopUpdatesEveryGasMicroSteps, ()) {
  count_run("ManagedInvariants.StandardLoopUpdatesEveryGasMicroSteps");
  const LoopDraw d = draw_loop("gradient_accumulation_steps");
  const int64_t micro_steps = draw_micro_steps();
  const int world = d.world, stage = d.stage;
  const int64_t gas = d.gas, mb = d.mb;
  RC_TAG("gas " + std::to_string(gas), "stage " + std::to_string(stage));
  RC_CLASSIFY(micro_steps % gas != 0, "ends mid-window");

  const Config cfg =
      engine_config(world, stage, /*managed=*/true, gas, mb, d.scaling);
  RC_ASSERT(cfg.train_batch_size == mb * gas * world);
  std::unique_ptr<Task> task = make_task("mlp");
  const Batch data = task->make_data(d.seed ^ 0xb0b, micro_steps * world * mb);
  auto models = make_models(*task, world, d.seed);
  SimWorld sim({world, d.seed});
  Violations v(world);
  std::vector<RankCounters> final_counters(world);
  std::vector<torch::Tensor> final_params(world);

  sim.run([&](int r) {
    Engine e(models[r], cfg, &sim.comm(r));
    for (int64_t k = 1; k <= micro_steps; ++k) {
      const std::string at = "micro-step " + std::to_string(k);
      const bool boundary = k % gas == 0;
      v.expect(r, e.micro_steps() == k - 1,
               at + ": micro_steps " + std::to_string(e.micro_steps()) +
                   " before backward");
      v.expect(r, e.is_gradient_accumulation_boundary() == boundary,
               at + ": is_gradient_accumulation_boundary() is " +
                   std::to_string(e.is_gradient_accumulation_boundary()));
      const torch::Tensor params = parameters_now(e);
      torch::Tensor loss =
          task->loss(*models[r], micro_batch_of(data, k - 1, world, r, mb));
      e.backward(loss);
      e.step();
      const int64_t steps = k / gas;
      v.expect(r, e.was_step_applied() == boundary,
               at + ": was_step_applied() is " +
                   std::to_string(e.was_step_applied()));
      // Off the boundary nothing moves; on it the update does (AdamW at lr
      // 1e-3 on nonzero float32 gradients).
      const bool moved = !torch::equal(parameters_now(e), params);
      v.expect(r, moved == boundary,
               at + (boundary ? ": parameters unchanged on the boundary"
                              : ": parameters changed off the boundary"));
      v.expect(r, e.global_steps() == steps,
               at + ": global_steps " + std::to_string(e.global_steps()) +
                   ", expected " + std::to_string(steps));
      v.expect(r, e.global_samples() == steps * cfg.train_batch_size,
               at + ": global_samples " + std::to_string(e.global_samples()) +
                   ", expected " +
                   std::to_string(steps * cfg.train_batch_size));
      v.expect(r, e.micro_steps() == k,
               at + ": micro_steps " + std::to_string(e.micro_steps()) +
                   " after step");
    }
    final_counters[r] = counters_of(e);
    final_params[r] = parameters_now(e);
  });

  for (int r = 0; r < world; ++r)
    RC_LOG() << "rank " << r << " final " << show(final_counters[r]) << "\n";
  RC_ASSERT(v.log_all() == 0u);
  for (int r = 0; r < world; ++r) {
    RC_ASSERT(final_counters[r].global_steps == micro_steps / gas);
    RC_ASSERT(final_counters[r].global_samples ==
              final_counters[r].global_steps * cfg.train_batch_size);
    RC_ASSERT(torch::equal(final_params[r], final_params[0]));
  }
}

// ---------------------------------------------------------------------------
// d. Note [Closed ranges] (propertytests/generators.h): each generator above
//    reaches every value its property claims, over kDraws draws.
// ---------------------------------------------------------------------------
constexpr int kDraws = 3000;

TEST(Generators, ParityScenarioReachesEveryClaimedValue) {
  const std::vector<Scenario> s =
      sample_draws(rc::gen::exec(draw_parity_scenario), kDraws);
  EXPECT_EQ(values_of(s, [](const Scenario& x) { return x.world_size; }),
            ints_in(1, 4));
  EXPECT_EQ(values_of(s, [](const Scenario& x) { return x.stage; }),
            ints_in(0, 3));
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return static_cast<int>(x.backwards.size());
                      }),
            ints_in(1, 4))
      << "windows";
  std::set<int> n;
  for (const Scenario& x : s) n.insert(x.backwards.begin(), x.backwards.end());
  EXPECT_EQ(n, ints_in(1, 6)) << "N per window";
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return std::string(to_string(x.scaling));
                      }),
            (std::set<std::string>{"configured", "per_step_count", "none"}));
  EXPECT_EQ(values_of(s, [](const Scenario& x) { return x.model; }),
            (std::set<std::string>{"mlp", "gpt"}));
  EXPECT_EQ(values_of(s, [](const Scenario& x) { return x.model_scale; }),
            ints_in(1, 2));
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return static_cast<int>(x.micro_batch);
                      }),
            ints_in(1, 3));
  EXPECT_EQ(
      values_of(s, [](const Scenario& x) { return x.gradient_clipping; }),
      (std::set<double>{0.0, 0.05, 1.0}));
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        const std::string& j = x.base_config_json;
                        for (const char* t :
                             {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"})
                          if (j.find(std::string("\"") + t + "\"") !=
                              std::string::npos)
                            return std::string(t);
                        return std::string("none");
                      }),
            (std::set<std::string>{"none", "WarmupLR", "WarmupDecayLR",
                                   "WarmupCosineLR"}));
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return std::string(to_string(x.dtype));
                      }),
            (std::set<std::string>{"fp32", "bf16", "fp16"}));
  // The overflow: both kinds, at every window, rank and backward slot.
  std::set<std::string> kinds;
  std::set<int> windows, ranks, backward_slots;
  for (const Scenario& x : s) {
    if (x.overflow_window < 0) continue;
    EXPECT_EQ(x.dtype, Precision::kFp16);
    EXPECT_LT(x.overflow_window, static_cast<int>(x.backwards.size()));
    EXPECT_LT(x.overflow_rank, x.world_size);
    EXPECT_LT(x.overflow_backward, x.backwards[x.overflow_window]);
    kinds.insert(to_string(x.overflow_kind));
    windows.insert(x.overflow_window);
    ranks.insert(x.overflow_rank);
    backward_slots.insert(x.overflow_backward);
  }
  EXPECT_EQ(kinds.size(), 2u);
  EXPECT_EQ(windows, ints_in(0, 3));
  EXPECT_EQ(ranks, ints_in(0, 3));
  EXPECT_EQ(backward_slots, ints_in(0, 5));
  // Offload at every stage that takes it, and only there.
  std::set<std::pair<int, std::string>> offload;
  for (const Scenario& x : s) offload.insert({x.stage, to_string(x.offload)});
  std::set<std::pair<int, std::string>> want_offload = {{0, "none"}};
  for (int stage = 1; stage <= 3; ++stage)
    for (const char* d : {"none", "cpu", "nvme"}) want_offload.insert({stage, d});
  EXPECT_EQ(offload, want_offload);
  EXPECT_EQ(values_of(s,
                      [](const Scenario& x) {
                        return x.offload == OffloadDevice::kNvme
                                   ? static_cast<int>(x.sub_group_size)
                                   : -1;
                      }),
            (std::set<int>{-1, 257, 1000, 100000}));
  // Each stage's own keys, both ways.
  std::set<std::string> keys;
  for (const Scenario& x : s) {
    if (x.stage == 3) {
      keys.insert("persistence " + std::to_string(x.persistence_threshold));
      keys.insert("gather_once " + std::to_string(x.gather_once_per_step));
    }
    if (x.stage >= 2)
      keys.insert("stage " + std::to_string(x.stage) + " reduce_once " +
                  std::to_string(x.reduce_once_per_step));
    if (x.stage == 2) {
      keys.insert("overlap " + std::to_string(x.overlap_comm));
      keys.insert("reduce_bucket " + std::to_string(x.reduce_bucket_size));
      keys.insert("allgather_bucket " +
                  std::to_string(x.allgather_bucket_size));
    }
  }
  EXPECT_EQ(keys,
            (std::set<std::string>{
                "persistence 0", "persistence 3000", "persistence 100000",
                "gather_once 0", "gather_once 1", "stage 2 reduce_once 0",
                "stage 2 reduce_once 1", "stage 3 reduce_once 0",
                "stage 3 reduce_once 1", "overlap 0", "overlap 1",
                "reduce_bucket 0", "reduce_bucket 256", "reduce_bucket 1024",
                "reduce_bucket 4096", "allgather_bucket 0",
                "allgather_bucket 128", "allgather_bucket 1024"}));
}

// What draw_loop() gives both invariant properties.
void expect_loop_coverage(const std::vector<LoopDraw>& d) {
  EXPECT_EQ(values_of(d, [](const LoopDraw& x) { return x.world; }),
            ints_in(1, 4));
  EXPECT_EQ(values_of(d, [](const LoopDraw& x) { return x.stage; }),
            ints_in(0, 3));
  EXPECT_EQ(values_of(d, [](const LoopDraw& x) { return x.scaling; }),
            (std::set<std::string>{"configured", "per_step_count", "none"}));
  EXPECT_EQ(values_of(d,
                      [](const LoopDraw& x) {
                        return static_cast<int>(x.gas);
                      }),
            ints_in(1, 4));
  EXPECT_EQ(values_of(d,
                      [](const LoopDraw& x) {
                        return static_cast<int>(x.mb);
                      }),
            ints_in(1, 3));
}

TEST(Generators, UnmanagedInvariantsReachEveryClaimedValue) {
  const auto draws = sample_draws(rc::gen::exec([] {
                                    const LoopDraw d = draw_loop("gas");
                                    return std::make_pair(d, draw_ops());
                                  }),
                                  kDraws);
  std::vector<LoopDraw> loops;
  std::set<int> lengths;
  std::set<std::string> shapes;
  for (const auto& [loop, ops] : draws) {
    loops.push_back(loop);
    lengths.insert(static_cast<int>(ops.size()));
    // An empty-window step (a step first, or two in a row), a step after
    // backwards, and an open window at the end.
    if (ops.front() == 'S' || ops.find("SS") != std::string::npos)
      shapes.insert("empty-window step");
    if (ops.find("BS") != std::string::npos) shapes.insert("step after B");
    if (ops.back() == 'B') shapes.insert("open window at the end");
  }
  expect_loop_coverage(loops);
  EXPECT_EQ(lengths, ints_in(1, 12));
  EXPECT_EQ(shapes, (std::set<std::string>{"empty-window step", "step after B",
                                           "open window at the end"}));
}

TEST(Generators, ManagedInvariantsReachEveryClaimedValue) {
  const auto draws = sample_draws(rc::gen::exec([] {
                                    const LoopDraw d = draw_loop("gas");
                                    return std::make_pair(d, draw_micro_steps());
                                  }),
                                  kDraws);
  std::vector<LoopDraw> loops;
  std::set<int> micro_steps;
  std::set<std::pair<int, bool>> gas_ends;  // (GAS, ends mid-window)
  for (const auto& [loop, k] : draws) {
    loops.push_back(loop);
    micro_steps.insert(static_cast<int>(k));
    if (k >= loop.gas)  // at least one boundary
      gas_ends.insert({static_cast<int>(loop.gas), k % loop.gas != 0});
  }
  expect_loop_coverage(loops);
  EXPECT_EQ(micro_steps, ints_in(1, 12));
  std::set<std::pair<int, bool>> want = {{1, false}};
  for (int gas = 2; gas <= 4; ++gas) {
    want.insert({gas, false});
    want.insert({gas, true});
  }
  EXPECT_EQ(gas_ends, want);
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  zerostep::prepare_property_run(zerostep::kCiMaxSuccess);
  ::testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  for (const auto& [property, runs] : zerostep::body_runs())
    std::cerr << "propertytests: " << property << ": body ran " << runs
              << " times (generated cases + shrink attempts)" << std::endl;
  return status;
}
