// zerostep_step: the zerostep side of the peer benchmark (benchmarks/peers/,
// docs/benchmarks.md). One rank of a Gloo job started by tools/launch:
//
//   bazel-bin/tools/launch --nproc=2 -- bazel-bin/benchmarks/peers/zerostep_step
//       --modes=stage0,stage2,stage2_once --vocab=4096 --d-model=256 --n-layer=6 --n-head=4
//       --block-size=64 --micro-batch=4 --backwards=4 --threads=1
//   (one command line)
//
// Each rank builds the tiny GPT (models/tiny_gpt.h) at the given shape and
// times, on its own micro-batches:
//   1. plain forward+backward, no engine: N loss.backward() calls per
//      window into the model's own .grad (zeroed between windows), no
//      communication and no optimizer: what LibTorch's compute costs;
//   2. for each mode of --modes, in order, a fresh model and Engine and its
//      unmanaged windows: N engine.backward() calls, then one engine.step()
//      (AdamW). Modes: stage0 ... stage3 (DeepSpeed's semantics), and
//      stage2_once, stage3_once (zero_optimization.reduce_once_per_step),
//      stage2_overlap (overlap_comm, buckets of DDP's 25 MiB), and
//      stage0_overlap: managed mode (gradient_accumulation_steps = N, N
//      backward(); step() pairs), overlap_comm, 25 MiB buckets: the window's
//      all-reduce runs inside the last backward, as DDP's does when the
//      caller leaves no_sync() (Note [Stage 0 buckets] in zero/stage0.h).
// Each part runs --warmup windows, then --windows timed ones. Rank 0 prints
// one JSON line per mode on stdout (benchmarks/peers/torch_step.py prints
// the same fields; the forward+backward times are the same in every line):
//   {"framework": "zerostep", "mode": "stage2", "params": ...,
//    "window_s": [...], "window_s_median": ..., "fwdbwd_s": [...],
//    "fwdbwd_s_median": ..., "forward_s_median": ...,
//    "backward_s_median": ..., "step_s_median": ..., ...}
// forward, backward and step split a window: the N loss computations
// (the forward passes; stage 3 gathers there), the N engine.backward()
// calls, and step(), each summed over the window.
// Window times are rank 0's wall time from the first forward to the end of
// step() (the collectives make both ranks wait for each other).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "comm/gloo_world.h"
#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "runtime/runtime_info.h"

namespace zerostep {
namespace {

struct Options {
  TinyGptOptions model;
  std::vector<std::string> modes = {"stage0"};
  int64_t micro_batch = 4;
  int backwards = 4;
  int threads = 1;
  int warmup = 1;
  int windows = 3;
  uint64_t seed = 1;
};

Options parse(int argc, char** argv) {
  Options o;
  std::map<std::string, int64_t*> ints = {
      {"--vocab", &o.model.vocab_size},  {"--d-model", &o.model.d_model},
      {"--n-layer", &o.model.n_layer},   {"--n-head", &o.model.n_head},
      {"--block-size", &o.model.block_size},
      {"--micro-batch", &o.micro_batch}};
  std::map<std::string, int*> small = {
      {"--backwards", &o.backwards},
      {"--threads", &o.threads}, {"--warmup", &o.warmup},
      {"--windows", &o.windows}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--modes=", 0) == 0) {
      o.modes.clear();
      std::stringstream list(a.substr(8));
      for (std::string m; std::getline(list, m, ',');) {
        static const char* const kModes[] = {
            "stage0",      "stage1",      "stage2",         "stage3",
            "stage2_once", "stage3_once", "stage0_overlap", "stage2_overlap"};
        if (std::find(std::begin(kModes), std::end(kModes), m) ==
            std::end(kModes))
          throw UsageError("zerostep_step: unknown mode '" + m +
                           "' (stage0 ... stage3, stage2_once, stage3_once, "
                           "stage0_overlap, stage2_overlap)");
        o.modes.push_back(m);
      }
      continue;
    }
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    if (eq == std::string::npos || (!ints.count(key) && !small.count(key)))
      throw UsageError("zerostep_step: unknown argument '" + a + "'");
    const long long v = std::atoll(a.c_str() + eq + 1);
    if (ints.count(key)) *ints[key] = v;
    else *small[key] = static_cast<int>(v);
  }
  if (o.backwards < 1 || o.windows < 1 || o.warmup < 0 || o.threads < 1 ||
      o.micro_batch < 1)
    throw UsageError(
        "zerostep_step: --backwards, --windows, --threads and --micro-batch "
        "must be >= 1, --warmup >= 0");
  return o;
}

bool is_overlap(const std::string& mode) {
  return mode.size() > 6 && mode.substr(6) == "_overlap";
}
// stage0_overlap runs managed windows: only there can stage 0 overlap.
bool is_managed(const std::string& mode) { return mode == "stage0_overlap"; }

Config engine_config(const Options& o, const std::string& mode,
                     int world_size) {
  const int stage = mode[5] - '0';
  nlohmann::json zero = {{"stage", stage},
                         // FSDP2 shards every parameter of a block: so does
                         // stage 3 here (DeepSpeed's default keeps the small
                         // ones whole).
                         {"stage3_param_persistence_threshold", 0}};
  if (stage >= 2) zero["reduce_once_per_step"] = mode.size() > 6 && mode.substr(6) == "_once";
  if (is_overlap(mode)) {
    zero["overlap_comm"] = true;
    zero["reduce_bucket_size"] = 25 << 20 >> 2;  // DDP's bucket_cap_mb = 25
  }
  const nlohmann::json c = {
      {"train_micro_batch_size_per_gpu", o.micro_batch},
      {"gradient_accumulation_steps", o.backwards},
      {"managed_gradient_accumulation", is_managed(mode)},
      {"zero_optimization", zero},
      {"optimizer",
       {{"type", "AdamW"}, {"params", {{"lr", 1e-4}, {"weight_decay", 0.01}}}}}};
  return parse_config(c.dump(), world_size);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

int main_impl(int argc, char** argv) {
  const Options o = parse(argc, argv);
  set_compute_threads(o.threads);
  std::unique_ptr<GlooCommunicator> comm = GlooCommunicator::from_environment();
  const int rank = comm->rank(), world = comm->world_size();
  const std::unique_ptr<Task> task = make_gpt_task(o.model);
  // Rank r's micro-batch i is sample block i * world + r of one data set.
  const Batch data = task->make_data(
      o.seed ^ 0x5eed, static_cast<int64_t>(o.backwards) * world * o.micro_batch);
  auto micro = [&](int i) {
    return slice(data, (static_cast<int64_t>(i) * world + rank) * o.micro_batch,
                 o.micro_batch);
  };

  // 1. Plain forward+backward.
  std::shared_ptr<torch::nn::Module> plain = task->make_model(o.seed);
  std::vector<double> fwdbwd;
  for (int k = 0; k < o.warmup + o.windows; ++k) {
    for (auto& p : plain->parameters()) p.mutable_grad() = torch::Tensor();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.backwards; ++i)
      (task->loss(*plain, micro(i)) / o.backwards).backward();
    if (k >= o.warmup) fwdbwd.push_back(seconds_since(t0));
  }
  int64_t params = 0;
  for (const auto& p : plain->parameters()) params += p.numel();
  plain.reset();

  // 2. Engine windows, one fresh model and Engine per mode.
  for (const std::string& mode : o.modes) {
    std::shared_ptr<torch::nn::Module> model = task->make_model(o.seed);
    Engine engine(model, engine_config(o, mode, world), comm.get());
    const bool managed = is_managed(mode);
    std::vector<double> windows, forward, backward, step;
    for (int k = 0; k < o.warmup + o.windows; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      double f = 0, b = 0;
      for (int i = 0; i < o.backwards; ++i) {
        const auto tf = std::chrono::steady_clock::now();
        const torch::Tensor loss = task->loss(*model, micro(i));
        const auto tb = std::chrono::steady_clock::now();
        engine.backward(loss);
        f += std::chrono::duration<double>(tb - tf).count();
        b += seconds_since(tb);
        // Managed: step() after every backward; only the N-th applies (its
        // reduce ran in the backward), so the last one is timed below.
        if (managed && i + 1 < o.backwards) engine.step();
      }
      const auto ts = std::chrono::steady_clock::now();
      engine.step();
      if (k >= o.warmup) {
        windows.push_back(seconds_since(t0));
        step.push_back(seconds_since(ts));
        forward.push_back(f);
        backward.push_back(b);
      }
      if (!engine.was_step_applied() || engine.global_steps() != k + 1)
        throw std::logic_error("zerostep_step: a window did not apply one update");
    }
    if (rank != 0) continue;
    const nlohmann::json out = {
        {"framework", "zerostep"},
        {"mode", mode},
        {"params", params},
        {"world", world},
        {"threads", o.threads},
        {"micro_batch", o.micro_batch},
        {"seq", o.model.block_size},
        {"backwards", o.backwards},
        {"window_s", windows},
        {"window_s_median", median(windows)},
        {"forward_s_median", median(forward)},
        {"backward_s_median", median(backward)},
        {"step_s_median", median(step)},
        {"fwdbwd_s", fwdbwd},
        {"fwdbwd_s_median", median(fwdbwd)},
        {"runtime", runtime_info()}};
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::main_impl(argc, argv);
  } catch (const std::exception& e) {  // UsageError names the program
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
