// Stage 3 with offload_param.device = "nvme" (zero/stage3.h Note [NVMe
// parameter partitions]): the partitions live on a BlockDevice, training
// gives the in-memory run's bits, a device fault in step() changes nothing,
// and checkpoints round-trip.
//
// Comparisons are bitwise: offload moves bytes and must not change one (the
// same kernel runs on the same values in the same order).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "sim/sim_world.h"
#include "models/task.h"
#include "offload/swap_store.h"
#include "offload/faulty_block_device.h"
#include "offload/memory_block_device.h"

namespace zerostep {
namespace {

// Threshold 100: the mlp's biases form the persistent group, its weights
// one group per block, so both kinds of group are exercised.
Config config_for(int world, bool offload_param, bool offload_optimizer,
                  int sub_group_size) {
  std::string zero =
      "{\"stage\": 3, \"stage3_param_persistence_threshold\": 100, "
      "\"sub_group_size\": " +
      std::to_string(sub_group_size);
  if (offload_param)
    zero +=
        ", \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": "
        "\"/unused\", \"buffer_count\": 3}";
  if (offload_optimizer)
    zero +=
        ", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": "
        "\"/unused\"}";
  zero += "}";
  return parse_config(
      "{\"train_micro_batch_size_per_gpu\": 2, "
      "\"managed_gradient_accumulation\": false, "
      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
      "\"weight_decay\": 0.01}}, \"zero_optimization\": " +
          zero + "}",
      world);
}

MlpWorldOptions scaled(int scale) {
  MlpWorldOptions o;
  o.model_scale = scale;
  return o;
}

// A world whose engines keep their parameter partitions (and optimizer
// state) on per-rank simulated devices.
struct OffloadRun : MlpWorld {
  OffloadRun(int w, bool offload_param, bool offload_optimizer = false,
             int scale = 1, int sub_group_size = 500)
      : MlpWorld(
            w, config_for(w, offload_param, offload_optimizer, sub_group_size),
            scaled(scale)) {
    for (int r = 0; r < w; ++r) {
      param_mem.push_back(std::make_unique<MemoryBlockDevice>(
          "mem://rank" + std::to_string(r) + "_params"));
      param_dev.push_back(
          std::make_unique<FaultyBlockDevice>(param_mem.back().get()));
      opt_mem.push_back(std::make_unique<MemoryBlockDevice>(
          "mem://rank" + std::to_string(r) + "_optimizer"));
    }
    make_engines([&](int r) {
      EngineOptions o;
      o.param_device = param_dev[r].get();
      o.optimizer_device = opt_mem[r].get();
      return o;
    });
  }
  ~OffloadRun() { engines.clear(); }  // before the devices they use
  // Micro-batch i of rank r: consecutive pairs of samples dealt to the
  // ranks in turn.
  torch::Tensor dealt_loss(int r, int i) {
    const int w = static_cast<int>(engines.size());
    return loss_on(r, (2 * (i * w + r)) % 60);
  }
  // `windows` windows of 2 backwards and a step each, from window `first`.
  void train(int first, int windows) {
    world->run([&](int r) {
      for (int k = first; k < first + windows; ++k) {
        engines[r]->backward(dealt_loss(r, 2 * k));
        engines[r]->backward(dealt_loss(r, 2 * k + 1));
        engines[r]->step();
      }
    });
  }
  std::vector<std::unique_ptr<MemoryBlockDevice>> param_mem, opt_mem;
  std::vector<std::unique_ptr<FaultyBlockDevice>> param_dev;
};

size_t total_bytes(const MemoryStats& m) {
  return m.param_bytes + m.grad_bytes + m.optimizer_state_bytes +
         m.rollback_bytes;
}

// The persistent group's parameters as the model holds them (always
// materialized): the biases.
std::vector<float> persistent_values(torch::nn::Module& m) {
  std::vector<float> out;
  for (const torch::Tensor& p : m.parameters())
    if (p.numel() < 100) {
      const torch::Tensor c = p.detach().contiguous();
      out.insert(out.end(), c.data_ptr<float>(),
                 c.data_ptr<float>() + c.numel());
    }
  return out;
}

TEST(ParamOffloadTest, SameBitsAsInMemoryAtWorlds1To4) {
  for (int w : {1, 2, 3, 4})
    for (bool offload_optimizer : {false, true}) {
      OffloadRun mem(w, false), nvme(w, true, offload_optimizer);
      mem.train(0, 3);
      nvme.train(0, 3);
      const auto a = mem.full_parameters(), b = nvme.full_parameters();
      for (int r = 0; r < w; ++r) {
        EXPECT_TRUE(same_bits(a[r], b[r])) << "world " << w << " rank " << r;
        EXPECT_TRUE(same_bits(mem.engines[r]->owned_parameters(),
                              nvme.engines[r]->owned_parameters()));
        EXPECT_TRUE(same_bits(mem.engines[r]->optimizer().exp_avg_sq(),
                              nvme.engines[r]->optimizer().exp_avg_sq()));
        EXPECT_TRUE(same_bits(persistent_values(*mem.models[r]),
                              persistent_values(*nvme.models[r])));
      }
      // Guards the comparison: training moved the parameters.
      OffloadRun fresh(w, false);
      EXPECT_FALSE(same_bits(fresh.full_parameters()[0], a[0]));
    }
}

// At rest the partitions are not resident: what the parameters cost is the
// read scratch (the largest group's partition) and the store's buffers,
// and the rollback spare of the persistent partitions is gone (the store's
// committed generation is the undo). The mlp at scale 4 (hidden 256): its
// middle block is most of the model, so the saving here is small; it
// grows with the number of blocks.
TEST(ParamOffloadTest, PartitionsAreNotResident) {
  const int w = 2;
  // Sub-groups of 1008 elements: 4032 bytes of data and the 64-byte
  // trailer fill one 4 KiB slot.
  OffloadRun mem(w, false, false, 4, 1008), nvme(w, true, false, 4, 1008);
  mem.train(0, 1);
  nvme.train(0, 1);
  const MemoryStats m = mem.engines[0]->memory();
  const MemoryStats n = nvme.engines[0]->memory();
  const size_t owned = mem.engines[0]->owned_parameters().size();
  // Groups: 32x256 + 256, 256x256 + 256, 256x8 (padded to multiples of
  // 16·W = 32); the persistent group is the last bias, 8 padded to 32.
  EXPECT_EQ(owned, (8448 + 65792 + 2048 + 32) / w);
  const size_t largest = 65792 / w;
  const size_t persistent = 32 * sizeof(float);
  // Note [Stage 3 buffer pool]: slots of the largest block's full
  // parameters, in memory and offloaded alike; one per block, as every
  // block stays gathered from its forward to its backward (Note [Stage 3
  // reuse distance], DeepSpeed's default stage3_max_reuse_distance).
  const size_t pool = 3 * 65792 * sizeof(float);
  EXPECT_EQ(m.param_bytes, owned * sizeof(float) + persistent + pool);
  // Scratch + 3 store buffers (buffer_count) + the persistent group.
  EXPECT_EQ(n.param_bytes,
            largest * sizeof(float) + 3 * 4096 + persistent + pool);
  EXPECT_LT(n.param_bytes, m.param_bytes);
  // In memory the update's spare holds the persistent group's partition
  // (Note [Transactional update]); offloaded, the store keeps the old
  // partitions. Both keep the moments' commit scratch.
  EXPECT_EQ(m.rollback_bytes, n.rollback_bytes + persistent / w);
  EXPECT_EQ(m.grad_bytes, n.grad_bytes);
  // The step reads the partitions into a transient buffer: the peak holds
  // them once more.
  EXPECT_GE(n.peak_bytes, total_bytes(n) + owned * sizeof(float));
}

// A fault on the parameter device at any operation of step() is an
// IoError naming the device, and parameters (partitions on the device, the
// persistent group in the model) and optimizer state are as before. Every
// rank's device gets the same fault at the same operation, so all ranks
// fail at the same point (a fault on one rank alone is not agreed on:
// docs/design/devices_and_offload.md).
TEST(ParamOffloadTest, AFaultAnywhereInStepChangesNothing) {
  const int w = 2;
  int failures = 0;
  for (OpKind op : {OpKind::kRead, OpKind::kWrite, OpKind::kFlush})
    for (IoFaultKind fault : {IoFaultKind::kIoError, IoFaultKind::kShortWrite}) {
      if (!fault_applies(fault, op)) continue;
      for (uint64_t k = 0; k < 9; ++k) {
        OffloadRun run(w, true);
        run.train(0, 1);
        const auto before = run.full_parameters();
        std::vector<std::vector<float>> owned(w), m(w), bias(w);
        std::vector<int64_t> steps(w);
        std::vector<std::string> errors(w);
        run.world->run([&](int r) {
          Engine& e = *run.engines[r];
          owned[r] = e.owned_parameters();
          m[r] = e.optimizer().exp_avg();
          steps[r] = e.optimizer().step_count();
          bias[r] = persistent_values(*run.models[r]);
          e.backward(run.dealt_loss(r, 2));
          FaultyBlockDevice& dev = *run.param_dev[r];
          dev.schedule(op, dev.count(op) + k, fault);
          try {
            e.step();
          } catch (const IoError& err) {
            errors[r] = err.what();
          }
        });
        if (errors[0].empty()) {
          // The step had fewer such operations: no fault, no failure.
          EXPECT_TRUE(errors[1].empty());
          continue;
        }
        ++failures;
        for (int r = 0; r < w; ++r) {
          ASSERT_FALSE(errors[r].empty());
          EXPECT_NE(
              errors[r].find("mem://rank" + std::to_string(r) + "_params"),
              std::string::npos)
              << errors[r];
          Engine& e = *run.engines[r];
          EXPECT_TRUE(same_bits(e.owned_parameters(), owned[r]))
              << run.param_dev[r]->describe();
          EXPECT_TRUE(same_bits(e.optimizer().exp_avg(), m[r]));
          EXPECT_EQ(e.optimizer().step_count(), steps[r]);
          EXPECT_EQ(e.global_steps(), 1);
          EXPECT_TRUE(same_bits(persistent_values(*run.models[r]), bias[r]));
        }
        const auto after = run.full_parameters();
        for (int r = 0; r < w; ++r)
          EXPECT_TRUE(same_bits(after[r], before[r]))
              << run.param_dev[r]->describe();
      }
    }
  // Reads (step's read pass), writes and flushes (the commit) all failed.
  EXPECT_GE(failures, 12);
}

// A failed read while a block gathers its partition (forward) is an
// IoError naming the device that leaves nothing gathered; the next forward
// works.
TEST(ParamOffloadTest, AFailedReadInForwardIsAClearErrorAndRecoverable) {
  OffloadRun run(1, true);
  run.train(0, 1);
  FaultyBlockDevice& dev = *run.param_dev[0];
  dev.schedule(OpKind::kRead, dev.count(OpKind::kRead), IoFaultKind::kIoError);
  run.world->run([&](int r) {
    try {
      run.engines[r]->backward(run.dealt_loss(r, 2));
      ADD_FAILURE() << "no error";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("mem://rank0_params"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("read_range"), std::string::npos)
          << e.what();
    }
  });
  OffloadRun mem(1, false);
  mem.train(0, 1);
  run.world->run([&](int r) {
    run.engines[r]->backward(run.dealt_loss(r, 2));
    run.engines[r]->step();
  });
  mem.world->run([&](int r) {
    mem.engines[r]->backward(mem.dealt_loss(r, 2));
    mem.engines[r]->step();
  });
  EXPECT_TRUE(same_bits(run.full_parameters()[0], mem.full_parameters()[0]));
}

// save at step 2, train on; a new offloaded world loaded from the
// checkpoint continues with the same bits, and an in-memory world loaded
// from it agrees too (the checkpoint format does not know about offload).
TEST(ParamOffloadTest, CheckpointRoundTrip) {
  const int w = 2;
  const std::string dir = make_temp_dir("zerostep_param_ckpt_");
  OffloadRun a(w, true);
  a.train(0, 2);
  a.world->run([&](int r) { a.engines[r]->save_checkpoint(dir, "s2"); });
  a.train(2, 2);
  const auto want = a.full_parameters();
  for (bool offload : {true, false}) {
    OffloadRun b(w, offload);
    b.world->run([&](int r) { b.engines[r]->load_checkpoint(dir, "s2"); });
    b.train(2, 2);
    const auto got = b.full_parameters();
    for (int r = 0; r < w; ++r)
      EXPECT_TRUE(same_bits(got[r], want[r])) << "offload " << offload;
    EXPECT_TRUE(same_bits(a.engines[0]->optimizer().exp_avg(),
                          b.engines[0]->optimizer().exp_avg()));
  }
}

}  // namespace
}  // namespace zerostep
