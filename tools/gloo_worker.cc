// gloo_worker: one rank of a multi-process parity check over real Gloo,
// started by tools/launch (or torchrun).
//
//   ./bazelw run //tools:launch -- --nproc=2 -- bazel-bin/tools/gloo_worker
//       --stage=2 --backwards=2,5,3
//
// Each process trains the built-in MLP unmanaged (N_k backward calls, one
// step) and then a managed twin, on its own rank's micro-batches, and
// checks that (a) unmanaged and managed final parameters are bitwise equal
// and (b) every rank holds the same parameters. Prints "rank R ok
// digest=..." and exits 0, or names what differed and exits 1. A
// collective failure (a peer died) prints the CommError and exits 4; when
// it ends an unmanaged step(), the rank first prints whether its state
// (parameters, moments, counters: parity/engine_snapshot.h) is as before the
// step: "rank R: step K failed; state unchanged: yes (digest D)".
// --die-at-step=K makes rank --die-rank (default 1) exit with status 3 in
// the middle of window K (after its backward calls, before step()): a fault
// test for the launcher.
// --stall-before-step=K --stall-ranks=R,... makes those ranks print "rank R
// stalling before step K" and wait for a signal there, while the others
// print "rank R entering step K" and go on into the step: a peer to kill or
// stop while the others are inside step()'s collectives.
// --checkpoint-dir=D saves a checkpoint after every unmanaged window;
// --stop-after-window=K ends the unmanaged run after window K (and its
// checkpoint) and exits 0 printing "rank R stopped after window K";
// --resume-from=D loads D's latest checkpoint, prints "rank R resumed at
// global_steps=G", trains the windows of --backwards after G unmanaged and
// prints "rank R ok resumed stage=S world=W digest=..." (the uninterrupted
// run's digest, bit for bit, at the same world size).
// --timeout-s=T bounds how long a collective waits for a peer (default 20).
// --offload=cpu|nvme (with --nvme-path=DIR, each rank its own file there;
// --offload-param: at stage 3 the parameter partitions too)
// and --dtype=fp32|bf16|fp16 select optimizer offload and the training
// dtype.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "comm/gloo_world.h"
#include "comm/ledger.h"
#include "common/cli.h"
#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"
#include "models/task.h"
#include "parity/engine_snapshot.h"
#include "parity/scenario.h"
#include "zero/phase.h"

namespace zerostep {
namespace {

std::vector<int> int_list(const std::string& flag, const std::string& v) {
  std::vector<int> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ','))
    out.push_back(static_cast<int>(parse_int(flag, item, 0, INT_MAX)));
  return out;
}

int main_impl(int argc, char** argv) {
  int stage = 0, die_at_step = -1, die_rank = 1;
  int stall_before_step = -1, stop_after_window = -1;
  std::vector<int> stall_ranks;
  std::string checkpoint_dir, resume_from;
  int timeout_s = 20;
  OffloadDevice offload = OffloadDevice::kNone;
  bool offload_param = false;
  std::string nvme_path;
  Precision dtype = Precision::kFp32;
  std::vector<int> backwards = {2, 5, 3};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--stage=", 0) == 0)
      stage = static_cast<int>(parse_int("--stage", a.substr(8), 0, 3));
    else if (a.rfind("--backwards=", 0) == 0)
      backwards = int_list("--backwards", a.substr(12));
    else if (a.rfind("--die-at-step=", 0) == 0)
      die_at_step = static_cast<int>(
          parse_int("--die-at-step", a.substr(14), -1, INT_MAX));
    else if (a.rfind("--die-rank=", 0) == 0)
      die_rank =
          static_cast<int>(parse_int("--die-rank", a.substr(11), 0, INT_MAX));
    else if (a.rfind("--stall-before-step=", 0) == 0)
      stall_before_step = static_cast<int>(
          parse_int("--stall-before-step", a.substr(20), 0, INT_MAX));
    else if (a.rfind("--stall-ranks=", 0) == 0)
      stall_ranks = int_list("--stall-ranks", a.substr(14));
    else if (a.rfind("--stop-after-window=", 0) == 0)
      stop_after_window = static_cast<int>(
          parse_int("--stop-after-window", a.substr(20), 0, INT_MAX));
    else if (a.rfind("--checkpoint-dir=", 0) == 0) checkpoint_dir = a.substr(17);
    else if (a.rfind("--resume-from=", 0) == 0) resume_from = a.substr(14);
    else if (a.rfind("--timeout-s=", 0) == 0)
      timeout_s =
          static_cast<int>(parse_int("--timeout-s", a.substr(12), 1, INT_MAX));
    else if (a == "--offload=cpu") offload = OffloadDevice::kCpu;
    else if (a == "--offload=nvme") offload = OffloadDevice::kNvme;
    else if (a == "--offload-param") offload_param = true;
    else if (a.rfind("--nvme-path=", 0) == 0) nvme_path = a.substr(12);
    else if (a.rfind("--dtype=", 0) == 0) {
      auto p = precision_from_string(a.substr(8));
      if (!p) throw UsageError("gloo_worker: --dtype must be fp32, bf16 or fp16");
      dtype = *p;
    }
    else throw UsageError("gloo_worker: unknown argument '" + a + "'");
  }
  GlooOptions go;
  go.timeout = std::chrono::seconds(timeout_s);
  std::unique_ptr<GlooCommunicator> raw = GlooCommunicator::from_environment(go);
  Ledger ledger;
  RecordingCommunicator comm(raw.get(), &ledger);
  const int r = comm.rank(), w = comm.world_size();

  Scenario s;
  s.stage = stage;
  s.world_size = w;
  s.backwards = backwards;
  s.persistence_threshold = 0;
  s.offload = offload;
  if (offload_param && stage == 3) s.offload_param = offload;
  s.nvme_path = nvme_path;
  s.sub_group_size = 1000;  // several swap sub-groups per partition
  s.dtype = dtype;
  std::unique_ptr<Task> task = make_task("mlp");
  int64_t total = 0;
  for (int n : backwards) total += static_cast<int64_t>(n) * w * s.micro_batch;
  const Batch data = task->make_data(s.seed ^ 0x5eed, total);
  const bool varying =
      std::adjacent_find(backwards.begin(), backwards.end(),
                         std::not_equal_to<int>()) != backwards.end();

  // Window k's micro-batch i of rank r (every rank's share of a window
  // follows the previous windows').
  auto window_base = [&](size_t k) {
    int64_t base = 0;
    for (size_t j = 0; j < k; ++j)
      base += static_cast<int64_t>(backwards[j]) * w * s.micro_batch;
    return base;
  };
  // One unmanaged window: N backward calls, then step(); a CommError in
  // step() first says whether this rank's state moved.
  auto unmanaged_window = [&](Engine& engine, torch::nn::Module& model, size_t k) {
    const int n = backwards[k];
    const int64_t base = window_base(k);
    for (int i = 0; i < n; ++i) {
      const int64_t first =
          base + (static_cast<int64_t>(i) * w + r) * s.micro_batch;
      engine.backward(task->loss(model, slice(data, first, s.micro_batch)));
    }
    if (r == die_rank && static_cast<int>(k) == die_at_step) {
      std::fprintf(stderr, "rank %d: dying in window %zu as asked\n", r, k);
      std::fflush(stderr);
      _exit(3);
    }
    if (static_cast<int>(k) == stall_before_step) {
      const bool stall = std::find(stall_ranks.begin(), stall_ranks.end(),
                                   r) != stall_ranks.end();
      std::printf("rank %d %s step %zu\n", r,
                  stall ? "stalling before" : "entering", k);
      std::fflush(stdout);
      if (stall)
        for (;;) pause();
    }
    const EngineSnapshot before = capture_engine_snapshot(engine);
    try {
      engine.step();
    } catch (const CommError&) {
      const EngineSnapshot after = capture_engine_snapshot(engine);
      if (after == before)
        std::printf("rank %d: step %zu failed; state unchanged: yes (digest "
                    "%s)\n",
                    r, k, before.digest().c_str());
      else
        std::printf("rank %d: step %zu failed; state unchanged: NO (before "
                    "%s, after %s)\n",
                    r, k, before.digest().c_str(), after.digest().c_str());
      std::fflush(stdout);
      throw;
    }
    // The unmanaged run checkpoints after every window (tag wK).
    if (!checkpoint_dir.empty())
      engine.save_checkpoint(checkpoint_dir, "w" + std::to_string(k));
  };
  auto digest_of = [](torch::Tensor t) {
    return fnv1a_hex(t.data_ptr<float>(), t.numel() * sizeof(float));
  };

  if (!resume_from.empty()) {
    // Load the latest checkpoint of an earlier (maybe failed) run, report
    // where it stands, and train the windows after it.
    auto model = task->make_model(s.seed + 1);
    Engine engine(model, scenario_config(s, false), &comm);
    engine.load_checkpoint(resume_from);
    const int64_t done = engine.global_steps();
    std::printf("rank %d resumed at global_steps=%lld\n", r,
                static_cast<long long>(done));
    std::fflush(stdout);
    for (size_t k = static_cast<size_t>(done); k < backwards.size(); ++k)
      unmanaged_window(engine, *model, k);
    std::printf("rank %d ok resumed stage=%d world=%d digest=%s\n", r, stage,
                w, digest_of(engine.full_parameters()).c_str());
    return 0;
  }
  std::vector<torch::Tensor> finals;
  for (bool managed : {false, true}) {
    auto model = task->make_model(s.seed);
    Engine engine(model, scenario_config(s, managed), &comm);
    for (size_t k = 0; k < backwards.size(); ++k) {
      if (!managed) {
        unmanaged_window(engine, *model, k);
        if (static_cast<int>(k) == stop_after_window) {
          std::printf("rank %d stopped after window %zu\n", r, k);
          return 0;
        }
        continue;
      }
      const int n = backwards[k];
      const int64_t base = window_base(k);
      for (int i = 0; i < n; ++i) {
        const int64_t first =
            base + (static_cast<int64_t>(i) * w + r) * s.micro_batch;
        if (varying) engine.set_gradient_accumulation_boundary(i == n - 1);
        engine.backward(task->loss(*model, slice(data, first, s.micro_batch)));
        engine.step();
      }
    }
    finals.push_back(engine.full_parameters());
  }
  const bool bitwise = torch::equal(finals[0], finals[1]);
  const std::string digest = digest_of(finals[0]);
  // Every rank must hold the same parameters: compare digests.
  int64_t mine = static_cast<int64_t>(std::stoull(digest, nullptr, 16) >> 1);
  std::vector<int64_t> all(w);
  comm.all_gather(Buffer::of(&mine, 1), Buffer::of(all.data(), all.size()),
                  {phase::kSetup});
  bool same = true;
  for (int64_t d : all) same = same && d == all[0];
  if (!bitwise || !same) {
    std::printf("rank %d FAILED: unmanaged==managed %s, ranks agree %s\n", r,
                bitwise ? "yes" : "NO", same ? "yes" : "NO");
    return 1;
  }
  std::printf("rank %d ok stage=%d world=%d digest=%s\n", r, stage, w,
              digest.c_str());
  return 0;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::main_impl(argc, argv);
  } catch (const zerostep::CommError& e) {
    std::fprintf(stderr, "gloo_worker: %s\n", e.what());
    return 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_worker: %s\n", e.what());
    return 2;
  }
}
