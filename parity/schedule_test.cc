#include "zero/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "parity/fault_run.h"
#include "parity/model_shape.h"
#include "scale/scale_sim.h"
#include "sim/sim_world.h"
#include "zero/phase.h"

namespace zerostep {
namespace {

// op, phase, bytes
using Key = std::tuple<CollectiveKind, std::string, uint64_t>;
using Multiset = std::map<Key, int>;

std::string show(const Multiset& m) {
  std::string s;
  for (const auto& [k, n] : m)
    s += std::string(to_string(std::get<0>(k))) + "/" + std::get<1>(k) + "/" +
         std::to_string(std::get<2>(k)) + " x" + std::to_string(n) + "\n";
  return s;
}

void add(Multiset* m, const std::vector<ScheduleEvent>& events) {
  for (const ScheduleEvent& e : events)
    if (e.type == ScheduleEvent::Type::kCollective)
      ++(*m)[{e.kind, e.phase, e.numel * dtype_size(e.dtype)}];
}

// Note [Shape-only schedule]: the planned collectives of every window are,
// as a multiset, what the real engine's ledger records, for every stage,
// mode, overlap setting, bucket size, world and built-in model.
TEST(ScheduleTest, PlannedCollectivesAreTheLedgerOfARealRun) {
  int compared = 0;
  for (const char* model : {"mlp", "gpt"}) {
    const ModelShape shape =
        model_shape(*make_task(model)->make_model(1), model);
    for (int stage : {0, 1, 2, 3}) {
      for (int w : {1, 2, 4}) {
        for (bool managed : {false, true}) {
          // Stages 0/2: overlap_comm off, on, on with small buckets.
          // Stage 3: stage3_max_reuse_distance at DeepSpeed's 1e9 (every
          // block kept for its backward), 0 (none) and 1 (the last); then
          // gather_once_per_step with 0 and with 1e9.
          const int variants = stage == 1 ? 1 : stage == 3 ? 5 : 3;
          for (int variant = 0; variant < variants; ++variant) {
            FaultScenario f;
            f.scenario.model = model;
            f.scenario.stage = stage;
            f.scenario.world_size = w;
            f.scenario.backwards = {3, 1, 2};
            f.scenario.persistence_threshold = model[0] == 'm' ? 0 : 40;
            const int64_t reuse =
                variant == 0 || variant == 4 ? 1000000000
                : variant == 3               ? 0
                                             : variant - 1;
            const bool gather_once = stage == 3 && variant >= 3;
            if (stage == 3 && variant > 0)
              f.scenario.base_config_json =
                  R"({"zero_optimization": {"stage3_max_reuse_distance": )" +
                  std::to_string(reuse) + R"(, "gather_once_per_step": )" +
                  (gather_once ? "true" : "false") + "}}";
            f.scenario.overlap_comm = stage != 3 && variant >= 1;
            if (stage != 3 && variant == 2) {
              f.scenario.reduce_bucket_size = 1000;
              f.scenario.allgather_bucket_size = 300;
            }
            f.managed = managed;
            Multiset real;
            for (const CollectiveTiming& c : baseline_schedule(f))
              ++real[{c.kind, c.label, c.bytes}];
            ScheduleOptions o;
            o.stage = stage;
            o.world_size = w;
            o.managed = managed;
            o.overlap_comm = f.scenario.overlap_comm;
            o.persistence_threshold = f.scenario.persistence_threshold;
            o.max_reuse_distance = reuse;
            o.gather_once_per_step = gather_once;
            if (stage != 3 && variant == 2) {
              o.reduce_bucket_size = 1000;
              o.allgather_bucket_size = 300;
            }
            Multiset plan;
            add(&plan, setup_schedule(shape, o));
            o.first_window = true;
            for (int n : f.scenario.backwards) {
              o.backwards = n;
              add(&plan, window_schedule(shape, o));
              o.first_window = false;
            }
            EXPECT_EQ(real, plan)
                << model << " stage " << stage << " world " << w << " managed "
                << managed << " variant " << variant << "\nreal:\n"
                << show(real) << "planned:\n"
                << show(plan);
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, 2 * 3 * 2 * (3 + 1 + 3 + 5));
}

// The scale mode's ledger for one window is the schedule's (the same
// RecordingCommunicator writes it), so its bytes are the real run's.
TEST(ScheduleTest, ScaleModeBytesEqualTheValuedRunsLedger) {
  for (int stage : {0, 1, 2, 3}) {
    for (int w : {2, 4}) {
      FaultScenario f;
      f.scenario.stage = stage;
      f.scenario.world_size = w;
      f.scenario.backwards = {2};
      f.scenario.persistence_threshold = 0;
      uint64_t real = 0;
      for (const CollectiveTiming& c : baseline_schedule(f))
        if (std::string_view(c.label) != phase::kSetup) real += c.bytes;
      ScaleOptions o;
      o.schedule.stage = stage;
      o.schedule.world_size = w;
      o.schedule.backwards = 2;
      o.schedule.persistence_threshold = 0;
      const ScaleReport r = simulate_scale(
          model_shape(*make_task("mlp")->make_model(1), "mlp"), o);
      EXPECT_EQ(r.bytes_per_rank, real) << "stage " << stage << " world " << w;
    }
  }
}

// Stage 3's planned memory at rest is what the Engine reports after a
// step, and the planned peak bounds the real one, with every block kept
// for its backward (stage3_max_reuse_distance 1e9: one pool slot per
// block), only the last (1) or none (0: one slot), and with
// gather_once_per_step (one slot per block whatever the reuse distance).
TEST(ScheduleTest, Stage3PlannedMemoryIsTheEnginesAtRest) {
  const std::vector<std::pair<int64_t, bool>> settings = {
      {1000000000, false}, {1, false},         {0, false},
      {0, true},           {1000000000, true}};
  for (const auto& [reuse, gather_once] : settings)
    for (int w : {1, 2, 4}) {
      auto task = make_task("mlp", 2);
      const ModelShape shape = model_shape(*task->make_model(1), "mlp");
      Config cfg = parse_config(
          "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": "
          "{\"stage\": 3, \"stage3_param_persistence_threshold\": 100, "
          "\"stage3_max_reuse_distance\": " +
              std::to_string(reuse) + ", \"gather_once_per_step\": " +
              (gather_once ? "true" : "false") + "}}",
          w);
      SimWorld world({w, 1});
      Batch data = task->make_data(3, 64);
      std::vector<std::shared_ptr<torch::nn::Module>> models;
      for (int r = 0; r < w; ++r) models.push_back(task->make_model(1));
      std::vector<MemoryStats> mem(w);
      world.run([&](int r) {
        Engine e(models[r], cfg, &world.comm(r));
        e.backward(task->loss(*models[r], slice(data, 2 * r, 2)));
        e.step();
        mem[r] = e.memory();
      });
      ScheduleOptions o;
      o.stage = 3;
      o.world_size = w;
      o.persistence_threshold = 100;
      o.max_reuse_distance = reuse;
      o.gather_once_per_step = gather_once;
      const MemoryStats plan = planned_memory(shape, o);
      SCOPED_TRACE("max_reuse_distance " + std::to_string(reuse) +
                   (gather_once ? " gather_once_per_step" : ""));
      EXPECT_EQ(plan.param_bytes, mem[0].param_bytes) << w;
      EXPECT_EQ(plan.grad_bytes, mem[0].grad_bytes) << w;
      EXPECT_EQ(plan.optimizer_state_bytes, mem[0].optimizer_state_bytes) << w;
      EXPECT_EQ(plan.rollback_bytes, mem[0].rollback_bytes) << w;
      EXPECT_GE(plan.peak_bytes, mem[0].peak_bytes) << w;
    }
}

// Note [Memory plan]: Engine::memory() after a window is the plan, field by
// field and in its peak, at every stage, world 1-8 and dtype, with one
// bucket and with several (stage 2), on both built-in models. The AdamW
// engines of run_scenario's configuration; a wrong term, a buffer the plan
// does not name, or a full gradient or master kept where the stage should
// not keep one shows here.
TEST(ScheduleTest, EngineMemoryIsThePlanAtEveryStageWorldAndDtype) {
  int compared = 0;
  for (const char* model : {"mlp", "gpt"}) {
    std::unique_ptr<Task> task = make_task(model);
    const ModelShape shape = model_shape(*task->make_model(1), model);
    const Batch data = task->make_data(3, 256);
    const std::vector<int> worlds =
        model[0] == 'm' ? std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}
                        : std::vector<int>{1, 3, 8};
    for (int stage : {0, 1, 2, 3})
      for (int w : worlds)
        for (Precision dtype :
             {Precision::kFp32, Precision::kBf16, Precision::kFp16})
          for (int variant = 0; variant < 3; ++variant) {
            // 0: defaults; 1: small buckets (stage 2); 2:
            // reduce_once_per_step (stages 2-3).
            if (variant == 1 && stage != 2) continue;
            if (variant == 2 && stage < 2) continue;
            const int64_t bucket = variant == 1 ? 1024 : 500000000;
            const bool once = variant == 2;
            const std::string dtype_json =
                dtype == Precision::kBf16   ? R"("bf16": {"enabled": true}, )"
                : dtype == Precision::kFp16 ? R"("fp16": {"enabled": true}, )"
                                            : "";
            const Config cfg = parse_config(
                R"({"train_micro_batch_size_per_gpu": 2, )"
                R"("managed_gradient_accumulation": false, )" + dtype_json +
                    R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},)"
                    R"( "zero_optimization": {"stage": )" +
                    std::to_string(stage) + R"(, "reduce_bucket_size": )" +
                    std::to_string(bucket) + R"(, "reduce_once_per_step": )" +
                    (once ? "true" : "false") + "}}",
                w);
            SimWorld world({w, 1});
            std::vector<std::shared_ptr<torch::nn::Module>> models;
            for (int r = 0; r < w; ++r) models.push_back(task->make_model(1));
            std::vector<MemoryStats> mem(w);
            world.run([&](int r) {
              Engine e(models[r], cfg, &world.comm(r));
              for (int b = 0; b < 2; ++b)
                e.backward(task->loss(*models[r],
                                      slice(data, (2 * r + b * w) * 2, 2)));
              e.step();
              mem[r] = e.memory();
            });
            ScheduleOptions o;
            o.stage = stage;
            o.world_size = w;
            o.dtype = dtype;
            o.reduce_bucket_size = bucket;
            o.reduce_once_per_step = once;
            const MemoryStats plan = planned_memory(shape, o);
            const std::string at = std::string(model) + " stage " +
                                   std::to_string(stage) + " world " +
                                   std::to_string(w) + " " + to_string(dtype) +
                                   " bucket " + std::to_string(bucket) +
                                   (once ? " reduce_once_per_step" : "");
            EXPECT_EQ(plan.param_bytes, mem[0].param_bytes) << at;
            EXPECT_EQ(plan.grad_bytes, mem[0].grad_bytes) << at;
            EXPECT_EQ(plan.optimizer_state_bytes, mem[0].optimizer_state_bytes)
                << at;
            EXPECT_EQ(plan.rollback_bytes, mem[0].rollback_bytes) << at;
            EXPECT_EQ(plan.peak_bytes, mem[0].peak_bytes) << at;
            ++compared;
          }
  }
  // Per model, world and dtype: stages 0, 1, 2 (x3), 3 (x2).
  EXPECT_EQ(compared, (8 + 3) * 3 * 7);
}

}  // namespace
}  // namespace zerostep
