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
// collective failure (a peer died) prints the CommError and exits 4.
// --die-at-step=K makes rank 1 exit with status 3 in the middle of window K
// (after its backward calls, before step()): a fault test for the launcher.
// --checkpoint-dir=D saves a checkpoint after every unmanaged window;
// --resume-from=D only loads D's latest checkpoint and prints its step.
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
  int stage = 0, die_at_step = -1;
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

  if (!resume_from.empty()) {
    // Load the latest checkpoint of an earlier (maybe failed) run and
    // report where it stands.
    auto model = task->make_model(s.seed + 1);
    Engine engine(model, scenario_config(s, false), &comm);
    engine.load_checkpoint(resume_from);
    std::printf("rank %d resumed at global_steps=%lld\n", r,
                static_cast<long long>(engine.global_steps()));
    return 0;
  }
  std::vector<torch::Tensor> finals;
  for (bool managed : {false, true}) {
    auto model = task->make_model(s.seed);
    Engine engine(model, scenario_config(s, managed), &comm);
    int64_t base = 0;
    for (size_t k = 0; k < backwards.size(); ++k) {
      const int n = backwards[k];
      for (int i = 0; i < n; ++i) {
        const int64_t first =
            base + (static_cast<int64_t>(i) * w + r) * s.micro_batch;
        if (managed && varying)
          engine.set_gradient_accumulation_boundary(i == n - 1);
        engine.backward(task->loss(*model, slice(data, first, s.micro_batch)));
        if (managed) engine.step();
      }
      if (!managed && r == 1 && static_cast<int>(k) == die_at_step) {
        std::fprintf(stderr, "rank 1: dying in window %zu as asked\n", k);
        std::fflush(stderr);
        _exit(3);
      }
      if (!managed) {
        engine.step();
        // The unmanaged run checkpoints after every window (tag wK).
        if (!checkpoint_dir.empty())
          engine.save_checkpoint(checkpoint_dir, "w" + std::to_string(k));
      }
      base += static_cast<int64_t>(n) * w * s.micro_batch;
    }
    finals.push_back(engine.full_parameters());
  }
  const bool bitwise = torch::equal(finals[0], finals[1]);
  const std::string digest = fnv1a_hex(finals[0].data_ptr<float>(),
                                       finals[0].numel() * sizeof(float));
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
