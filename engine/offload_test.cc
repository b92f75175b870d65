// Optimizer offload in the engine: the model's buffers apart from the host
// master (engine/flat_binding.h Note [ZeRO-Offload]), NVMe state on
// simulated devices, and a device fault in one rank's step()
// (zero/optimizer.h Note [NVMe optimizer state], zero/stage.h Note
// [Transactional update]).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <stdlib.h>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "models/task.h"
#include "offload/faulty_block_device.h"
#include "offload/memory_block_device.h"
#include "sim/sim_world.h"

namespace zerostep {
namespace {

std::string config_json(int stage, const std::string& offload) {
  return "{\"train_micro_batch_size_per_gpu\": 2, "
         "\"managed_gradient_accumulation\": false, "
         "\"zero_optimization\": {\"stage\": " +
         std::to_string(stage) +
         ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": "
         "900, \"offload_optimizer\": " +
         offload + "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
                   "{\"lr\": 0.01, \"weight_decay\": 0.1}}}";
}

struct Rank {
  std::unique_ptr<MemoryBlockDevice> medium;
  std::unique_ptr<FaultyBlockDevice> device;
};

// Trains 3 windows with NVMe state on simulated devices and compares with
// the in-memory run; then a device fault in rank 1's fourth step: rank 1
// reports IoError naming its device, rank 0 CommError (rank 1 left the
// all-gather), and on both the parameters, the moments and the counters
// are as before that step.
TEST(OffloadTest, NvmeStateMatchesMemoryAndADeviceFaultChangesNothing) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    MlpWorldOptions sim1;
    sim1.sim_seed = 1;
    std::vector<torch::Tensor> want(2);
    {
      MlpWorld fx(2, parse_config(config_json(stage, "null"), 2), sim1);
      fx.world->run([&](int r) {
        Engine e(fx.models[r], fx.config, &fx.world->comm(r));
        for (int k = 0; k < 3; ++k) {
          e.backward(fx.loss_on(r, 8 * k + 2 * r));
          e.step();
        }
        want[r] = e.full_parameters();
      });
    }
    std::vector<Rank> ranks(2);
    for (int r = 0; r < 2; ++r) {
      ranks[r].medium = std::make_unique<MemoryBlockDevice>(
          "/nvme/zerostep_rank" + std::to_string(r) + "_optimizer.swap");
      ranks[r].device = std::make_unique<FaultyBlockDevice>(ranks[r].medium.get());
    }
    std::vector<std::string> errors(2), types(2);
    MlpWorld fx(2,
                parse_config(config_json(stage,
                                         "{\"device\": \"nvme\", "
                                         "\"nvme_path\": \"/nvme\"}"),
                             2),
                sim1);
    fx.world->run_collect([&](int r) {
      EngineOptions eo;
      eo.optimizer_device = ranks[r].device.get();
      Engine e(fx.models[r], fx.config, &fx.world->comm(r), eo);
      EXPECT_TRUE(e.optimizer().swapped());
      for (int k = 0; k < 3; ++k) {
        e.backward(fx.loss_on(r, 8 * k + 2 * r));
        e.step();
      }
      EXPECT_TRUE(same_bits(e.full_parameters(), want[r])) << "stage " << stage;
      const std::vector<float> params = e.owned_parameters();
      const std::vector<float> m = e.optimizer().exp_avg();
      const std::vector<float> v = e.optimizer().exp_avg_sq();
      const int64_t steps = e.global_steps();
      if (r == 1) {
        FaultyBlockDevice& dev = *ranks[r].device;
        dev.schedule(OpKind::kWrite, dev.count(OpKind::kWrite) + 1,
                     IoFaultKind::kIoError);
      }
      e.backward(fx.loss_on(r, 40 + 2 * r));
      try {
        e.step();
        ADD_FAILURE() << "rank " << r << ": step() should have failed";
      } catch (const IoError& err) {
        types[r] = "IoError";
        errors[r] = err.what();
      } catch (const CommError& err) {
        types[r] = "CommError";
        errors[r] = err.what();
      }
      EXPECT_EQ(e.owned_parameters(), params);
      EXPECT_EQ(e.optimizer().exp_avg(), m);
      EXPECT_EQ(e.optimizer().exp_avg_sq(), v);
      EXPECT_EQ(e.global_steps(), steps);
      EXPECT_THROW(e.step(), UsageError);
    });
    EXPECT_EQ(types[1], "IoError") << errors[1];
    EXPECT_NE(errors[1].find("/nvme/zerostep_rank1_optimizer.swap"),
              std::string::npos)
        << errors[1];
    EXPECT_EQ(types[0], "CommError") << errors[0];
  }
}

// A missing nvme_path is a clear IoError at construction naming the path.
TEST(OffloadTest, MissingNvmePathNamesIt) {
  MlpWorldOptions sim1;
  sim1.sim_seed = 1;
  MlpWorld fx(1,
              parse_config(config_json(1,
                                       "{\"device\": \"nvme\", "
                                       "\"nvme_path\": "
                                       "\"/nonexistent/zerostep\"}"),
                           1),
              sim1);
  std::string msg;
  fx.world->run_collect([&](int r) {
    try {
      Engine e(fx.models[r], fx.config, &fx.world->comm(r));
    } catch (const IoError& err) {
      msg = err.what();
    }
  });
  EXPECT_NE(msg.find("/nonexistent/zerostep"), std::string::npos) << msg;
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

// Two heads on one trunk; head B is used only in odd windows.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    trunk = register_module("trunk", torch::nn::Linear(8, 16));
    a = register_module("a", torch::nn::Linear(16, 4));
    b = register_module("b", torch::nn::Linear(16, 4));
  }
  torch::Tensor loss(const torch::Tensor& x, bool use_b) {
    torch::Tensor h = torch::tanh(trunk->forward(x));
    torch::Tensor out = a->forward(h).pow(2).mean();
    if (use_b) out = out + b->forward(h).pow(2).mean();
    return out;
  }
  torch::nn::Linear trunk{nullptr}, a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoHeads);

// Parameters that get no gradient in a window (head B in even windows) are
// updated from a zero gradient like every flat-buffer element (DeepSpeed's
// behaviour), at every stage, with and without offload: unmanaged equals
// managed and offload equals no offload, bit for bit, and nothing hangs.
TEST(OffloadTest, ParametersWithoutGradientInAWindow) {
  const std::string nvme = make_temp_dir("zerostep_heads_");
  for (int stage : {1, 2, 3}) {
    std::map<std::string, torch::Tensor> result;
    for (const std::string offload : {"none", "cpu", "nvme"})
      for (bool managed : {false, true}) {
        const std::string json =
            "{\"train_micro_batch_size_per_gpu\": 2, "
            "\"gradient_accumulation_steps\": 3, "
            "\"managed_gradient_accumulation\": " +
            std::string(managed ? "true" : "false") +
            ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) +
            ", \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": "
            "64, \"offload_optimizer\": {\"device\": \"" + offload +
            "\", \"nvme_path\": \"" + nvme +
            "\"}}, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
            "{\"lr\": 0.01, \"weight_decay\": 0.1}}}";
        const Config config = parse_config(json, 2);
        std::vector<TwoHeads> models;
        for (int r = 0; r < 2; ++r) {
          torch::manual_seed(3);
          models.emplace_back();
        }
        torch::Tensor final_params;
        SimWorld world({2, 1});
        world.run([&](int r) {
          Engine e(models[r].ptr(), config, &world.comm(r));
          for (int k = 0; k < 4; ++k) {
            for (int i = 0; i < 3; ++i) {
              torch::Tensor x = torch::ones({2, 8}) * (0.1 * (k + i + r + 1));
              e.backward(models[r]->loss(x, k % 2 == 1));
              if (managed) e.step();
            }
            if (!managed) e.step();
          }
          torch::Tensor p = e.full_parameters();
          if (r == 0) final_params = p;
        });
        result[offload + (managed ? "/managed" : "/unmanaged")] = final_params;
      }
    const torch::Tensor& want = result["none/unmanaged"];
    for (const auto& [name, got] : result)
      EXPECT_TRUE(same_bits(got, want)) << "stage " << stage << " " << name;
  }
  std::filesystem::remove_all(nvme);
}

// Note [ZeRO-Offload]: at stages 1-2 with offload the model computes with
// buffers of its own; each backward's gradient is folded into the host
// accumulation and cleared, and each update is copied back.
TEST(OffloadTest, CpuOffloadKeepsTheModelsBuffersApartFromTheMaster) {
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Config config =
        parse_config(config_json(stage, "{\"device\": \"cpu\"}"), 1);
    torch::manual_seed(3);
    torch::nn::Linear model(4, 3);
    SimWorld world({1, 1});
    world.run([&](int r) {
      Engine e(model.ptr(), config, &world.comm(r));
      const torch::Tensor w = model->weight;
      const torch::Tensor master = e.flat_parameters();
      const char* lo = static_cast<const char*>(master.data_ptr());
      const char* at = static_cast<const char*>(w.data_ptr());
      EXPECT_TRUE(at < lo || at >= lo + master.nbytes())
          << "the model's weight is a view of the master";
      e.backward(model->forward(torch::ones({2, 4})).sum());
      // Stage 1: folded into the host accumulation, cleared where autograd
      // writes. Stage 2 has reduced it into its partition already and
      // dropped autograd's tensor (Note [Stage 2 buckets]).
      if (stage == 1) {
        EXPECT_EQ(w.grad().abs().sum().item<float>(), 0.0f);
        EXPECT_GT(e.flat_gradients().abs().sum().item<float>(), 0.0f);
      } else {
        EXPECT_FALSE(w.grad().defined());
      }
      e.step();
      const torch::Tensor updated = e.flat_parameters();
      EXPECT_FALSE(same_bits(updated, master.clone().zero_()));
      EXPECT_TRUE(same_bits(w.reshape(-1).contiguous(),
                            updated.narrow(0, 0, w.numel()).contiguous()))
          << "the update was not copied back to the model";
    });
  }
}

// Note [Offload copies] (engine/flat_binding.h): each gradient copied to
// the host staging buffer once per backward (by its hook as it completes,
// or at the end for the ones no hook saw), folded after one wait, and the
// weights copied back: the same bits as the run without offload, at stages
// 1-2, fp32 and bf16, with and without overlap_comm, managed or not, with
// a parameter that gets no gradient in some backward calls.
TEST(OffloadTest, StagedCopiesGiveTheBitsOfTheRunWithoutOffload) {
  for (int stage : {1, 2})
    for (const std::string dtype : {"fp32", "bf16"})
      for (bool overlap : {false, true})
        for (bool managed : {false, true}) {
          if (overlap && stage != 2) continue;
          const std::string what = "stage " + std::to_string(stage) + " " +
                                   dtype + (overlap ? " overlap" : "") +
                                   (managed ? " managed" : " unmanaged");
          std::vector<torch::Tensor> finals;
          for (int run = 0; run < 3; ++run) {  // none, offload, staged
            const std::string json =
                "{\"train_micro_batch_size_per_gpu\": 2, "
                "\"gradient_accumulation_steps\": 3, "
                "\"managed_gradient_accumulation\": " +
                std::string(managed ? "true" : "false") + ", " +
                (dtype == "bf16" ? "\"bf16\": {\"enabled\": true}, " : "") +
                "\"zero_optimization\": {\"stage\": " +
                std::to_string(stage) + ", \"reduce_bucket_size\": 300, " +
                "\"overlap_comm\": " + (overlap ? "true" : "false") +
                (run > 0 ? ", \"offload_optimizer\": {\"device\": \"cpu\"}"
                         : "") +
                "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
                "{\"lr\": 0.01, \"weight_decay\": 0.1}}}";
            MlpWorld fx(2, parse_config(json, 2));
            fx.make_engines([&](int) {
              EngineOptions o;
              o.offload_staging_on_cpu = run == 2;
              return o;
            });
            std::vector<torch::Tensor> params(2);
            fx.world->run([&](int r) {
              Engine& e = *fx.engines[r];
              for (int k = 0; k < 2; ++k) {
                for (int b = 0; b < 3; ++b) {
                  // The middle backward reaches one parameter only: the
                  // others get no gradient (no hook fires for them).
                  const torch::Tensor loss =
                      b == 1 ? (fx.models[r]->parameters().back().sum() *
                                (0.01 * (r + 1)))
                                   .to(torch::kFloat)
                             : fx.loss(r, 3 * k + b);
                  e.backward(loss);
                  if (managed) e.step();
                }
                if (!managed) e.step();
              }
            });
            finals.push_back(fx.full_parameters()[0]);
          }
          EXPECT_TRUE(same_bits(finals[0], finals[1])) << what;
          EXPECT_TRUE(same_bits(finals[0], finals[2])) << what;
        }
}

// A model off the host trains at every stage, with or without offload
// (engine/device_engine_test.cc); parameters on two devices, or not float32,
// are a UsageError naming them and the fix. The meta device stands in for a
// GPU.
TEST(OffloadTest, MixedDevicesAndDtypesAreRefused) {
  const Config config = parse_config(config_json(2, "null"), 1);
  SimWorld world({1, 1});
  auto mixed = std::make_shared<torch::nn::Module>();
  mixed->register_parameter("on_cpu", torch::zeros({3}));
  mixed->register_parameter("on_meta", torch::zeros({3}, torch::kMeta));
  torch::nn::Linear doubles(4, 3);
  doubles->to(torch::kFloat64);
  world.run([&](int r) {
    try {
      Engine e(mixed, config, &world.comm(r));
      ADD_FAILURE() << "no error for parameters on two devices";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("one device"), std::string::npos)
          << e.what();
    }
    try {
      Engine e(doubles.ptr(), config, &world.comm(r));
      ADD_FAILURE() << "no error for float64";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("Double"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace zerostep
