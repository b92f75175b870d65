// The engine's device path on the CPU (Note [Device kernels] in
// zero/kernels.h, Note [Stage 3 on a device] in zero/stage3.h): every stage
// with its buffers in the memory of kernels that are not the host's, every
// collective staged through host copies (zero/staging_comm.h).
//   FarKernels   the host's own kernels posing as a device's: the run must
//                give the host run's bits, so every buffer, fold, rounding
//                and collective of the device path is checked to the bit.
//   TorchKernels LibTorch's ops on CPU tensors, the code a CUDA model runs
//                (other kernels: within a tolerance of the host run), where
//                managed and unmanaged must still be bitwise equal.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"
#include "engine/torch_kernels.h"
#include "zero/far_kernels.h"

namespace zerostep {
namespace {

// Stage 3 variants: the MLP's layers are blocks of their own (threshold 0:
// every group gathered into pool slots), or its biases persistent
// (threshold 100); reduce_once_per_step.
struct Stage3Options {
  int64_t persistence_threshold = 0;
  bool reduce_once = false;
  // "", "offload_optimizer" or "offload_param": that section with device
  // "cpu" (Note [Stage 3 offload from a device] in zero/stage3.h).
  std::string offload = "";
};

std::string config_json(int stage, bool managed, const std::string& dtype,
                        const Stage3Options& s3 = {}) {
  return "{\"train_micro_batch_size_per_gpu\": 2, "
         "\"gradient_accumulation_steps\": 3, "
         "\"managed_gradient_accumulation\": " +
         std::string(managed ? "true" : "false") +
         ", \"gradient_clipping\": 0.05, "
         "\"zero_optimization\": {\"stage\": " +
         std::to_string(stage) +
         ", \"reduce_bucket_size\": 200, "
         "\"stage3_param_persistence_threshold\": " +
         std::to_string(s3.persistence_threshold) +
         ", \"reduce_once_per_step\": " + (s3.reduce_once ? "true" : "false") +
         (s3.offload.empty() ? std::string()
                             : ", \"" + s3.offload + "\": {\"device\": \"cpu\"}") +
         "}, " + (dtype == "bf16" ? "\"bf16\": {\"enabled\": true}, " : "") +
         (dtype == "fp16" ? "\"fp16\": {\"enabled\": true}, " : "") +
         "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
         "\"weight_decay\": 0.1}}}";
}

// Which kernels a run's engines get: none (the host's), FarKernels, or a
// CPU TorchKernels posing as a device's.
enum class Kind { kHost, kFar, kTorch };

struct Trained {
  std::vector<torch::Tensor> params;  // per rank, after training
  int64_t norms = 0;                  // FarKernels: norms taken
  // FarKernels: downloads while training, i.e. collectives staged (only
  // buffers marked as device memory are).
  int64_t downloads = 0;
};

// Two windows of 3 backward() calls per rank, managed or not; `save_dir`:
// then a checkpoint "t" there.
// `wrap(r, comm)`: the communicator rank r's engine gets instead of its
// sim communicator (kept alive by the caller).
using WrapComm = std::function<Communicator*(int rank, Communicator* comm)>;

Trained train_windows(int stage, int world, bool managed,
                      const std::string& dtype, Kind kind,
                      const std::string& save_dir = "",
                      const Stage3Options& s3 = {},
                      const WrapComm& wrap = nullptr) {
  MlpWorld w(world,
             parse_config(config_json(stage, managed, dtype, s3), world));
  std::vector<std::unique_ptr<Kernels>> kernels(world);
  for (int r = 0; r < world; ++r) {
    if (kind == Kind::kFar) kernels[r] = std::make_unique<FarKernels>();
    if (kind == Kind::kTorch)
      kernels[r] = std::make_unique<TorchKernels>(torch::kCPU);
  }
  if (wrap) {  // make_engines' work, on the wrapped communicators
    w.engines.resize(world);
    w.world->run([&](int r) {
      EngineOptions o;
      o.kernels = kernels[r].get();
      w.engines[r] = std::make_unique<Engine>(w.models[r], w.config,
                                              wrap(r, &w.world->comm(r)), o);
    });
  } else {
    w.make_engines([&](int r) {
      EngineOptions o;
      o.kernels = kernels[r].get();
      return o;
    });
  }
  auto norms = [&] {
    int64_t n = 0;
    if (kind == Kind::kFar)
      for (auto& k : kernels) n += static_cast<FarKernels&>(*k).norms;
    return n;
  };
  auto downloads = [&] {
    int64_t n = 0;
    if (kind == Kind::kFar)
      for (auto& k : kernels) n += static_cast<FarKernels&>(*k).downloads;
    return n;
  };
  const int64_t before = norms(), downloads_before = downloads();
  w.world->run([&](int r) {
    Engine& e = *w.engines[r];
    for (int k = 0; k < 2; ++k) {
      for (int b = 0; b < 3; ++b) {
        e.backward(w.loss(r, 3 * k + b));
        if (managed) e.step();
      }
      if (!managed) e.step();
      EXPECT_TRUE(e.was_step_applied());
    }
  });
  Trained out;
  out.norms = norms() - before;
  out.downloads = downloads() - downloads_before;
  out.params = w.full_parameters();
  if (!save_dir.empty())
    w.world->run([&](int r) { w.engines[r]->save_checkpoint(save_dir, "t"); });
  return out;
}

std::string what(int stage, int world, const std::string& dtype) {
  return "stage " + std::to_string(stage) + " world " + std::to_string(world) +
         " " + dtype;
}

TEST(DeviceEngineTest, FarKernelsGiveTheHostRunsBitsWithOneNormPerStep) {
  for (int stage : {0, 1, 2, 3})
    for (int world : {1, 2})
      for (const std::string dtype : {"fp32", "bf16", "fp16"}) {
        const Trained host =
            train_windows(stage, world, false, dtype, Kind::kHost);
        const Trained far =
            train_windows(stage, world, false, dtype, Kind::kFar);
        for (int r = 0; r < world; ++r)
          EXPECT_TRUE(same_bits(host.params[r], far.params[r]))
              << what(stage, world, dtype);
        // Two steps on every rank: one norm each, nothing per backward.
        EXPECT_EQ(far.norms, 2 * world) << what(stage, world, dtype);
        EXPECT_GT(far.downloads, 0) << what(stage, world, dtype);
      }
}

// Stage 3 at world 2 with `s3`: FarKernels give the host run's bits,
// managed equals unmanaged, `norms` norms on the device's kernels, every
// collective staged. Returns the host run.
Trained expect_far_stage3_is_the_host_run(const Stage3Options& s3,
                                          const std::string& dtype,
                                          int64_t norms,
                                          const std::string& name) {
  const Trained host = train_windows(3, 2, false, dtype, Kind::kHost, "", s3);
  const Trained far = train_windows(3, 2, false, dtype, Kind::kFar, "", s3);
  const Trained managed = train_windows(3, 2, true, dtype, Kind::kFar, "", s3);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(same_bits(host.params[r], far.params[r])) << name;
    EXPECT_TRUE(same_bits(far.params[r], managed.params[r])) << name;
  }
  EXPECT_EQ(far.norms, norms) << name;
  EXPECT_GT(far.downloads, 0) << name;
  return host;
}

// Stage 3's other paths on the device: persistent groups (refreshed by the
// step's all-gather) and reduce_once_per_step (full gradients kept in the
// groups' own storages over the window).
TEST(DeviceEngineTest, FarKernelsGiveTheHostRunsBitsAtStage3sVariants) {
  for (const Stage3Options& s3 :
       {Stage3Options{100, false}, Stage3Options{0, true},
        Stage3Options{100, true}})
    for (const std::string dtype : {"fp32", "bf16"})
      expect_far_stage3_is_the_host_run(
          s3, dtype, /*norms=*/4,
          what(3, 2, dtype) + " threshold " +
              std::to_string(s3.persistence_threshold) +
              (s3.reduce_once ? " reduce_once" : ""));
}

// Stage 3 with offload from a device (Note [Stage 3 offload from a device]
// in zero/stage3.h): the partitions and the optimizer on the host, the
// gathered groups in the device's memory, every collective moving between
// the two: the host run's bits (which are the run without offload's), the
// norm taken on the host (none on the device's kernels), managed equal to
// unmanaged.
TEST(DeviceEngineTest, Stage3OffloadFromADeviceGivesTheHostRunsBits) {
  for (const std::string offload : {"offload_optimizer", "offload_param"})
    for (const std::string dtype : {"fp32", "bf16"})
      for (int64_t threshold : {0, 100}) {
        const std::string name = what(3, 2, dtype) + " " + offload +
                                 " threshold " + std::to_string(threshold);
        const Trained plain = train_windows(3, 2, false, dtype, Kind::kHost,
                                            "", {threshold, false, ""});
        const Trained host = expect_far_stage3_is_the_host_run(
            {threshold, false, offload}, dtype, /*norms=*/0, name);
        for (int r = 0; r < 2; ++r)
          EXPECT_TRUE(same_bits(plain.params[r], host.params[r])) << name;
      }
}

// A communicator shaped like NCCL's (comm/nccl_communicator.h) for engines
// on FarKernels: it reads device memory, so the engine gives it device
// buffers as they are (no StagingCommunicator), and overlaps its async
// collectives, so stage 3 prefetches. FarKernels' memory is host memory:
// the buffers go on to sim with the flag cleared. It counts the
// collectives whose two buffers are in different memories (Note [NCCL
// buffers in host memory]) and the async all-gathers (prefetches).
class NcclShaped final : public Communicator {
 public:
  explicit NcclShaped(Communicator* inner) : inner_(inner) {}
  int mixed = 0;
  int device_buffers = 0;
  int gathers_ahead = 0;
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return "nccl-shaped"; }
  bool overlaps_async() const override { return true; }
  bool reads_device_memory() const override { return true; }
  void all_reduce(Buffer b, const AllReduceOptions& o) override {
    inner_->all_reduce(host(b, b), o);
  }
  void reduce_scatter(Buffer i, Buffer out,
                      const ReduceScatterOptions& o) override {
    inner_->reduce_scatter(host(i, out), host(out, i), o);
  }
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer i, Buffer out, const ReduceScatterOptions& o) override {
    return inner_->reduce_scatter_async(host(i, out), host(out, i), o);
  }
  std::shared_ptr<Work> all_reduce_async(Buffer b,
                                         const AllReduceOptions& o) override {
    return inner_->all_reduce_async(host(b, b), o);
  }
  void all_gather(Buffer i, Buffer out, const AllGatherOptions& o) override {
    inner_->all_gather(host(i, out), host(out, i), o);
  }
  std::shared_ptr<Work> all_gather_async(Buffer i, Buffer out,
                                         const AllGatherOptions& o) override {
    ++gathers_ahead;
    return inner_->all_gather_async(host(i, out), host(out, i), o);
  }
  void broadcast(Buffer b, const BroadcastOptions& o) override {
    inner_->broadcast(host(b, b), o);
  }
  void barrier() override { inner_->barrier(); }

 private:
  // `b` as sim takes it, counting what its collective mixed.
  Buffer host(Buffer b, Buffer other) {
    if (b.device) ++device_buffers;
    if (b.device && !other.device) ++mixed;
    b.device = false;
    return b;
  }
  Communicator* inner_;
};

// The engine on a device over a backend that reads device memory (NCCL's
// shape, without NCCL): no collective staged, stage 3 prefetching, and
// with offload the host partitions gathered straight into device storage
// and device gradients reduced into host chunks. Every stage, fp32 and
// bf16, with and without stage 3's offloads: the host run's bits.
TEST(DeviceEngineTest, ABackendThatReadsDeviceMemoryGivesTheHostRunsBits) {
  struct Case {
    int stage;
    std::string offload;
  };
  for (const Case& c : {Case{0, ""}, Case{1, ""}, Case{2, ""}, Case{3, ""},
                        Case{3, "offload_optimizer"}, Case{3, "offload_param"}})
    for (const std::string dtype : {"fp32", "bf16"}) {
      const std::string name =
          what(c.stage, 2, dtype) + (c.offload.empty() ? "" : " " + c.offload);
      const Stage3Options s3{0, false, c.offload};
      const Trained host =
          train_windows(c.stage, 2, false, dtype, Kind::kHost, "", s3);
      std::vector<std::unique_ptr<NcclShaped>> comms(2);
      const Trained direct =
          train_windows(c.stage, 2, false, dtype, Kind::kFar, "", s3,
                        [&](int r, Communicator* inner) {
                          comms[r] = std::make_unique<NcclShaped>(inner);
                          return comms[r].get();
                        });
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(same_bits(host.params[r], direct.params[r])) << name;
        EXPECT_GT(comms[r]->device_buffers, 0) << name;
        // Offload from a device: the stage 3 collectives move between host
        // partitions and device storage; otherwise everything is on the
        // device but the agreements and the norm (one buffer each).
        if (c.offload.empty()) {
          EXPECT_EQ(comms[r]->mixed, 0) << name;
        } else {
          EXPECT_GT(comms[r]->mixed, 0) << name;
        }
        if (c.stage == 3) {  // Note [Stage 3 prefetch]
          EXPECT_GT(comms[r]->gathers_ahead, 0) << name;
        }
      }
      EXPECT_EQ(direct.downloads, 0) << name << ": a collective was staged";
    }
}

TEST(DeviceEngineTest, TorchKernelsManagedEqualsUnmanagedBitwise) {
  for (int stage : {0, 1, 2, 3})
    for (int world : {1, 2})
      for (const std::string dtype : {"fp32", "bf16"}) {
        const Trained u =
            train_windows(stage, world, false, dtype, Kind::kTorch);
        const Trained m =
            train_windows(stage, world, true, dtype, Kind::kTorch);
        const Trained host =
            train_windows(stage, world, false, dtype, Kind::kHost);
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(same_bits(u.params[r], m.params[r]))
              << what(stage, world, dtype);
          // Other kernels (LibTorch's Adam, division): close, not bitwise.
          // bf16 weights can round a last-bit difference to one bf16 ulp
          // in the forward pass, hence the looser bound there.
          const double tol = dtype == "bf16" ? 1e-2 : 1e-5;
          EXPECT_LT((u.params[r] - host.params[r]).abs().max().item<double>(),
                    tol)
              << what(stage, world, dtype);
        }
      }
}

// A checkpoint written from the device's buffers loads on the host and
// back, to the bit.
TEST(DeviceEngineTest, CheckpointsMoveBetweenDeviceAndHost) {
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Stage3Options s3{100, false};  // persistent groups are loaded too
    const std::string dir = make_temp_dir("zs_device_ckpt_");
    const Trained far =
        train_windows(stage, 2, false, "fp32", Kind::kFar, dir + "/far", s3);
    const Trained host =
        train_windows(stage, 2, false, "fp32", Kind::kHost, dir + "/host", s3);
    for (const char* from : {"far", "host"})
      for (Kind into : {Kind::kHost, Kind::kFar}) {
        MlpWorld w(2, parse_config(config_json(stage, false, "fp32", s3), 2));
        std::vector<std::unique_ptr<FarKernels>> k(2);
        w.make_engines([&](int r) {
          EngineOptions o;
          if (into == Kind::kFar) {
            k[r] = std::make_unique<FarKernels>();
            o.kernels = k[r].get();
          }
          return o;
        });
        std::vector<std::vector<float>> m(2);
        w.world->run([&](int r) {
          w.engines[r]->load_checkpoint(dir + "/" + from, "t");
          m[r] = w.engines[r]->optimizer().exp_avg();
        });
        const auto params = w.full_parameters();
        for (int r = 0; r < 2; ++r)
          EXPECT_TRUE(same_bits(params[r], host.params[r])) << from;
        // And training goes on from there on both sides alike.
        EXPECT_FALSE(m[0].empty());
      }
    (void)far;
    std::filesystem::remove_all(dir);
  }
}

// The engine's AdamW may split its pass over LibTorch's intra-op threads
// (set_compute_threads sets them): the kernels are told that count, at one
// thread and at two.
TEST(DeviceEngineTest, AdamIsToldTheComputeThreads) {
  const int before = torch::get_num_threads();
  for (int threads : {1, 2}) {
    torch::set_num_threads(threads);
    MlpWorld w(1, parse_config("{\"train_micro_batch_size_per_gpu\": 2}", 1));
    FarKernels far;
    w.make_engines([&](int) {
      EngineOptions o;
      o.kernels = &far;
      return o;
    });
    w.world->run([&](int r) {
      w.engines[r]->backward(w.loss(r, 0));
      w.engines[r]->step();
    });
    EXPECT_EQ(far.adam_threads, threads);
  }
  torch::set_num_threads(before);
}

TEST(DeviceEngineTest, KernelsAreRefusedWhereTheStateStaysOnTheHost) {
  for (const std::string extra :
       {"\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": "
        "{\"device\": \"cpu\"}}",
        "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
        "{\"device\": \"cpu\"}}"}) {
    const std::string json =
        "{\"train_micro_batch_size_per_gpu\": 2, " + extra + "}";
    MlpWorld w(1, parse_config(json, 1));
    FarKernels far;
    try {
      w.make_engines([&](int) {
        EngineOptions o;
        o.kernels = &far;
        return o;
      });
      ADD_FAILURE() << "no error for " << extra;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("EngineOptions::kernels"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace zerostep
