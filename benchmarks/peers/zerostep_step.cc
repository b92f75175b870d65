// zerostep_step: the zerostep side of the peer benchmark (benchmarks/peers/,
// docs/benchmarks.md). One rank of a job started with torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: tools/launch,
// torchrun, or benchmarks/peers/gpu_run.py):
//
//   bazel-bin/tools/launch --nproc=2 --
//   bazel-bin/benchmarks/peers/zerostep_step
//       --modes=stage0,stage2,stage2_once --vocab=4096 --d-model=256
//       --n-layer=6 --n-head=4
//       --block-size=64 --micro-batch=4 --backwards=4 --threads=1
//   (one command line)
//
// --device=cpu (default) or cuda: where the model and data live (cuda:
// cuda:LOCAL_RANK, the engine's ZeRO state on the device without offload,
// Note [Device kernels] in zero/kernels.h).
// --bucket-elements=N: every bucket size of the ds_config (reduce,
// allgather, stage 3 prefetch) in elements; DeepSpeed's defaults without.
// --backend=gloo (default on cpu) or nccl (default on cuda; only in a
// --config=cuda build, which defines ZEROSTEP_STEP_CUDA: elsewhere it is a
// UsageError naming the fix). NCCL's rendezvous is a file,
// --nccl-id-path (default $TMPDIR/zerostep_step_nccl.<MASTER_PORT>.id).
//
// Each rank builds the tiny GPT (models/tiny_gpt.h) at the given shape, or
// with --hf=DIR the Hugging Face folder's decoder (models/hf_decoder.h, the
// harness's task hf:DIR: --block-size tokens per sequence; the shape flags
// are unused), and times, on its own micro-batches. With --hf,
// --load=meta builds each mode's decoder on the meta device and the Engine
// reads each rank's elements from the folder (EngineOptions::
// parameter_source over engine/hf_checkpoint.h: at stage 3 no rank holds
// the whole model at any time); --load=whole (default) loads the whole
// folder into each rank's model first:
//   1. plain forward+backward, no engine: N loss.backward() calls per
//      window into the model's own .grad (zeroed between windows), no
//      communication and no optimizer: what LibTorch's compute costs;
//   2. for each mode of --modes, in order, a fresh model and Engine and its
//      windows. A mode is stage0 ... stage3 (DeepSpeed's semantics, an
//      unmanaged window: N engine.backward() calls, then one engine.step(),
//      AdamW), with any of the suffixes
//        _once     zero_optimization.reduce_once_per_step (stages 2-3)
//        _offload  offload_optimizer.device "cpu" (ZeRO-Offload)
//        _managed  managed_gradient_accumulation with
//                  gradient_accumulation_steps = N: N (backward, step())
//                  pairs, of which the last applies the update
//        _overlap  overlap_comm with DDP's 25 MiB buckets; at stages 0-1
//                  and with _once it implies _managed (unmanaged mode
//                  reduces those only in step(): nothing to overlap):
//                  stage0_overlap all-reduces the window's buckets inside
//                  the last backward, as DDP does when the caller leaves
//                  no_sync() (Note [Stage 0 buckets] in zero/stage0.h),
//                  stage2_once_overlap reduce-scatters them there (Note
//                  [Bucket-interleaved partition] in zero/stage2.h);
//                  at stage 3 (unmanaged) each block's reduce-scatter
//                  stays in flight while autograd goes on, at most that
//                  many elements at once (Note [Stage 3 reduce-scatter
//                  in flight] in zero/stage3.h)
//        _release  stage3_max_reuse_distance 0 (stage 3): every block
//                  released after its forward and gathered again for its
//                  backward, where the default (DeepSpeed's 1e9) keeps
//                  the blocks of these models gathered in between (Note
//                  [Stage 3 reuse distance] in zero/stage3.h)
//        _gather   zero_optimization.gather_once_per_step (stage 3):
//                  each block all-gathered once per window, by the step
//                  before it (the first window's by its first forward),
//                  instead of once per forward (Note [Stage 3 gather once
//                  per step] in zero/stage3.h)
//      e.g. stage2_offload, stage2_managed, stage0_overlap,
//      stage2_once_overlap, stage3_release, stage3_once_gather.
// Each part runs --warmup windows, then --windows timed ones. Rank 0 prints
// one JSON line per mode on stdout (benchmarks/peers/torch_step.py prints
// the same fields; the forward+backward times are the same in every line):
//   {"framework": "zerostep", "mode": "stage2", "params": ...,
//    "window_s": [...], "window_s_median": ..., "fwdbwd_s": [...],
//    "fwdbwd_s_median": ..., "forward_s_median": ...,
//    "backward_s_median": ..., "step_s_median": ..., "memory": {...}, ...}
// A mode whose Engine refuses the configuration on this device prints
//   {"framework": "zerostep", "mode": "stage3", "unsupported": "<the
//    engine's UsageError>"}
// instead, and the next mode runs: nothing is timed for it.
// On the CPU, forward, backward and step split a window: the N loss
// computations (the forward passes; stage 3 gathers there), the N
// engine.backward() calls, and step(), each summed over the window. On
// cuda the host runs ahead of the device, so only whole windows are timed,
// with torch::cuda::synchronize() before the first forward and after
// step() (the only synchronisations the benchmark adds), and the split is
// left out.
// Window times are rank 0's wall time from the first forward to the end of
// step() (the collectives make the ranks wait for each other).
// "memory": the engine's own accounting (Engine::memory(), bytes) and, on
// cuda, LibTorch's CUDA caching allocator for the mode: peak allocated and
// peak reserved bytes since the mode's model was made (the cache emptied and
// the peaks reset first), what was allocated at that reset (the baseline:
// the data), and the device memory in use at the end
// (cudaMemGetInfo: total - free, which also counts the CUDA context and
// NCCL's buffers); plain forward+backward's peak is "fwdbwd_memory".
// --rss (CPU) adds each rank's resident memory per mode, "rss_kib" (Note
// [Resident memory per mode]; benchmarks/peers/memory_rss.py); timing runs
// leave it off, since it makes every large allocation a fresh mapping.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "comm/gloo_world.h"
#include "common/cli.h"
#include "common/errors.h"
#include "config/config.h"
#include "engine/engine.h"
#include "engine/hf_checkpoint.h"
#include "models/hf_config.h"
#include "models/hf_decoder.h"
#include "models/task.h"
#include "runtime/runtime_info.h"

#ifdef ZEROSTEP_STEP_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include "comm/nccl_communicator.h"
#endif

namespace zerostep {
namespace {

struct Options {
  TinyGptOptions model;
  std::string hf;  // --hf=DIR: a Hugging Face folder instead of the GPT
  std::string load = "whole";  // --load=whole|meta (with --hf)
  bool rss = false;  // --rss: Note [Resident memory per mode]
  std::vector<std::string> modes = {"stage0"};
  std::string device = "cpu";
  std::string backend;  // "" = gloo on cpu, nccl on cuda
  std::string nccl_id_path;
  int64_t micro_batch = 4;
  // --bucket-elements: reduce_bucket_size, allgather_bucket_size and
  // stage3_prefetch_bucket_size of every mode (0: DeepSpeed's defaults;
  // _overlap still takes DDP's 25 MiB reduce buckets).
  int64_t bucket_elements = 0;
  int backwards = 4;
  int threads = 1;
  int warmup = 1;
  int windows = 3;
  uint64_t seed = 1;
};

// A --modes entry: stage<k> and its suffixes.
struct Mode {
  int stage = 0;
  bool once = false;
  bool offload = false;
  bool managed = false;
  bool overlap = false;
  bool release = false;
  bool gather = false;
};

Mode parse_mode(const std::string& m) {
  const std::string what =
      "zerostep_step: unknown mode '" + m +
      "' (stage0 ... stage3, each with any of the suffixes _once (stages "
      "2-3), _offload (stages 1-3), _managed, _overlap, _release and _gather "
      "(stage 3); e.g. stage2_offload)";
  if (m.size() < 6 || m.rfind("stage", 0) != 0 || m[5] < '0' || m[5] > '3')
    throw UsageError(what);
  Mode mode;
  mode.stage = m[5] - '0';
  std::stringstream rest(m.substr(6));
  std::string part;
  std::getline(rest, part, '_');  // "" before the first '_'
  if (!part.empty()) throw UsageError(what);
  while (std::getline(rest, part, '_')) {
    bool* flag = part == "once"      ? &mode.once
                 : part == "offload" ? &mode.offload
                 : part == "managed" ? &mode.managed
                 : part == "overlap" ? &mode.overlap
                 : part == "release" ? &mode.release
                 : part == "gather"  ? &mode.gather
                                     : nullptr;
    if (flag == nullptr || *flag) throw UsageError(what);
    *flag = true;
  }
  if ((mode.once && mode.stage < 2) || (mode.offload && mode.stage < 1) ||
      ((mode.release || mode.gather) && mode.stage != 3))
    throw UsageError(what);
  if (mode.overlap && (mode.stage < 2 || mode.once)) mode.managed = true;
  return mode;
}

Options parse(int argc, char** argv) {
  Options o;
  std::map<std::string, int64_t*> ints = {
      {"--vocab", &o.model.vocab_size},      {"--d-model", &o.model.d_model},
      {"--n-layer", &o.model.n_layer},       {"--n-head", &o.model.n_head},
      {"--block-size", &o.model.block_size}, {"--micro-batch", &o.micro_batch},
      {"--bucket-elements", &o.bucket_elements}};
  std::map<std::string, int*> small = {{"--backwards", &o.backwards},
                                       {"--threads", &o.threads},
                                       {"--warmup", &o.warmup},
                                       {"--windows", &o.windows}};
  std::map<std::string, std::string*> strings = {
      {"--device", &o.device},
      {"--backend", &o.backend},
      {"--nccl-id-path", &o.nccl_id_path},
      {"--hf", &o.hf},
      {"--load", &o.load}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rss") {
      o.rss = true;
      continue;
    }
    if (a.rfind("--modes=", 0) == 0) {
      o.modes.clear();
      std::stringstream list(a.substr(8));
      for (std::string m; std::getline(list, m, ',');) {
        parse_mode(m);
        o.modes.push_back(m);
      }
      continue;
    }
    const size_t eq = a.find('=');
    const std::string key = a.substr(0, eq);
    if (eq == std::string::npos ||
        (!ints.count(key) && !small.count(key) && !strings.count(key)))
      throw UsageError("zerostep_step: unknown argument '" + a + "'");
    const std::string value = a.substr(eq + 1);
    if (strings.count(key)) {
      *strings[key] = value;
      continue;
    }
    if (ints.count(key))
      *ints[key] = parse_int(key, value, 1, INT64_MAX);
    else
      *small[key] = static_cast<int>(
          parse_int(key, value, key == "--warmup" ? 0 : 1, INT_MAX));
  }
  if (o.backwards < 1 || o.windows < 1 || o.warmup < 0 || o.threads < 1 ||
      o.micro_batch < 1)
    throw UsageError(
        "zerostep_step: --backwards, --windows, --threads and --micro-batch "
        "must be >= 1, --warmup >= 0");
  if (o.device != "cpu" && o.device != "cuda")
    throw UsageError("zerostep_step: --device=" + o.device +
                     " is not one of cpu, cuda");
  if (o.load != "whole" && o.load != "meta")
    throw UsageError("zerostep_step: --load=" + o.load +
                     " is not one of whole, meta");
  if (o.load == "meta" && o.hf.empty())
    throw UsageError(
        "zerostep_step: --load=meta reads a Hugging Face folder: give "
        "--hf=DIR (the built-in GPT has no folder to read from)");
  if (o.backend.empty()) o.backend = o.device == "cuda" ? "nccl" : "gloo";
  if (o.backend != "gloo" && o.backend != "nccl")
    throw UsageError("zerostep_step: --backend=" + o.backend +
                     " is not one of gloo, nccl");
  if (o.backend == "nccl" && o.device != "cuda")
    throw UsageError(
        "zerostep_step: --backend=nccl needs --device=cuda (NCCL reduces "
        "device buffers)");
  return o;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0'
             ? fallback
             : static_cast<int>(parse_int(name, v, 0, INT_MAX));
}

// What LibTorch's CUDA caching allocator saw on one device (bytes).
struct DeviceMemory {
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  int64_t in_use = 0;  // cudaMemGetInfo: total - free
};

const char kNoCudaBuild[] =
    " needs a --config=cuda build of zerostep_step (this one was built "
    "against a LibTorch without CUDA, so it has neither NCCL nor the CUDA "
    "allocator). Fix: ./bazelw build --config=cuda "
    "//benchmarks/peers:zerostep_step";

#ifdef ZEROSTEP_STEP_CUDA
void use_device(int index) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
}

// The bytes LibTorch has allocated on the device now.
int64_t allocated_now(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
      static_cast<c10::DeviceIndex>(index));
  return stats
      .allocated_bytes[static_cast<size_t>(
          c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

// Empties LibTorch's cache (what an earlier mode left there) and restarts
// its peaks from what is allocated now, which it returns (the baseline).
int64_t reset_device_peaks(int index) {
  c10::cuda::CUDACachingAllocator::emptyCache();
  c10::cuda::CUDACachingAllocator::resetPeakStats(
      static_cast<c10::DeviceIndex>(index));
  return allocated_now(index);
}

DeviceMemory device_memory(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
      static_cast<c10::DeviceIndex>(index));
  const size_t all =
      static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  DeviceMemory m;
  m.peak_allocated = stats.allocated_bytes[all].peak;
  m.peak_reserved = stats.reserved_bytes[all].peak;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess)
    m.in_use = static_cast<int64_t>(total - free);
  return m;
}

std::unique_ptr<Communicator> make_nccl(int rank, int world, int device,
                                        const std::string& id_path) {
  NcclOptions n;
  n.device = device;
  n.id_path = id_path;
  return std::make_unique<NcclCommunicator>(rank, world, n);
}
#else
void use_device(int) {
  throw UsageError(std::string("zerostep_step: --device=cuda") + kNoCudaBuild);
}
int64_t reset_device_peaks(int) { return 0; }
DeviceMemory device_memory(int) { return {}; }
std::unique_ptr<Communicator> make_nccl(int, int, int, const std::string&) {
  throw UsageError(std::string("zerostep_step: --backend=nccl") + kNoCudaBuild);
}
#endif

Config engine_config(const Options& o, const Mode& mode, int world_size) {
  nlohmann::json zero = {{"stage", mode.stage},
                         // FSDP2 shards every parameter of a block: so does
                         // stage 3 here (DeepSpeed's default keeps the small
                         // ones whole).
                         {"stage3_param_persistence_threshold", 0}};
  if (mode.stage >= 2) zero["reduce_once_per_step"] = mode.once;
  if (mode.release) zero["stage3_max_reuse_distance"] = 0;
  if (mode.gather) zero["gather_once_per_step"] = true;
  // Page-locked host buffers on cuda, as FSDP2's CPUOffloadPolicy there.
  if (mode.offload)
    zero["offload_optimizer"] = {{"device", "cpu"},
                                 {"pin_memory", o.device == "cuda"}};
  if (o.bucket_elements > 0) {
    zero["reduce_bucket_size"] = o.bucket_elements;
    zero["allgather_bucket_size"] = o.bucket_elements;
    zero["stage3_prefetch_bucket_size"] = o.bucket_elements;
  }
  if (mode.overlap) {
    zero["overlap_comm"] = true;
    zero["reduce_bucket_size"] = 25 << 20 >> 2;  // DDP's bucket_cap_mb = 25
  }
  const nlohmann::json c = {
      {"train_micro_batch_size_per_gpu", o.micro_batch},
      {"gradient_accumulation_steps", o.backwards},
      {"managed_gradient_accumulation", mode.managed},
      {"zero_optimization", zero},
      {"optimizer",
       {{"type", "AdamW"},
        {"params", {{"lr", 1e-4}, {"weight_decay", 0.01}}}}}};
  return parse_config(c.dump(), world_size);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

using bench::median;

// Note [Resident memory per mode]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// On the CPU each mode also reports the process's resident memory (Linux
// /proc/self/status, KiB) on every rank: "rss_kib" has, per rank, the
// resident set before the mode's model is made ("baseline": LibTorch,
// Gloo, the data, what earlier modes left), the peak while the model and
// Engine are made ("construction_peak"), the resident set once they are
// made ("at_rest") and the peak over the mode's windows
// ("training_peak"). The peaks are reset between the parts by writing 5
// to /proc/self/clear_refs. For the figures to be this mode's alone, the
// allocator must give freed memory back: with --rss, main() fixes glibc's
// mmap threshold (allocations of 256 KiB and more are mapped and unmapped
// on free; its default threshold grows after each free, and freed tensors
// would then stay in the heap). That makes every large tensor fresh pages,
// faulted in and zeroed by the kernel: on the 20M-parameter Llama (1
// thread, AMD EPYC, three launches each way) it cost 8% of a stage 0
// window and 17% of plain forward+backward, which is why only --rss sets
// it and timing runs keep glibc's default, as the Python peers do. The
// model states are Engine::memory()'s "engine_bytes"; the rest of
// training_peak - baseline is the activations, autograd's gradients before
// they are bucketed, and Gloo's buffers.
struct Rss {
  int64_t now_kib = -1, peak_kib = -1;
};

Rss read_rss() {
  Rss r;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    int64_t* into = line.rfind("VmRSS:", 0) == 0   ? &r.now_kib
                    : line.rfind("VmHWM:", 0) == 0 ? &r.peak_kib
                                                   : nullptr;
    if (into != nullptr) *into = std::atoll(line.c_str() + 6);
  }
  return r;
}

void reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}

// Every rank's four figures (KiB, exact in float below 16 GiB), gathered.
nlohmann::json gather_rss(Communicator& comm, const std::vector<int64_t>& kib) {
  std::vector<float> mine(kib.begin(), kib.end());
  std::vector<float> all(mine.size() * comm.world_size());
  comm.all_gather(Buffer::of(mine.data(), mine.size()),
                  Buffer::of(all.data(), all.size()), {"rss"});
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < comm.world_size(); ++r) {
    const float* f = all.data() + r * mine.size();
    ranks.push_back({{"baseline", static_cast<int64_t>(f[0])},
                     {"construction_peak", static_cast<int64_t>(f[1])},
                     {"at_rest", static_cast<int64_t>(f[2])},
                     {"training_peak", static_cast<int64_t>(f[3])}});
  }
  return ranks;
}

nlohmann::json memory_json(const Options& o, int device_index, int64_t baseline,
                           const MemoryStats* engine) {
  nlohmann::json m = nlohmann::json::object();
  if (engine != nullptr)
    m["engine_bytes"] = {{"param", engine->param_bytes},
                         {"grad", engine->grad_bytes},
                         {"optimizer_state", engine->optimizer_state_bytes},
                         {"rollback", engine->rollback_bytes},
                         {"peak", engine->peak_bytes}};
  if (o.device == "cuda") {
    const DeviceMemory d = device_memory(device_index);
    m["device_peak_allocated_bytes"] = d.peak_allocated;
    m["device_peak_reserved_bytes"] = d.peak_reserved;
    m["device_baseline_allocated_bytes"] = baseline;
    m["device_in_use_bytes"] = d.in_use;
  }
  return m;
}

int main_impl(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.rss) {  // Note [Resident memory per mode]
    mallopt(M_MMAP_THRESHOLD, 256 << 10);
    mallopt(M_TRIM_THRESHOLD, 1 << 20);
  }
  std::vector<std::pair<std::string, Mode>> modes;
  for (const std::string& m : o.modes) modes.emplace_back(m, parse_mode(m));
  set_compute_threads(o.threads);
  const bool cuda = o.device == "cuda";
  const int local_rank = env_int("LOCAL_RANK", 0);
  if (cuda) {
    check_engine_device("cuda");
    use_device(local_rank);
  }
  const torch::Device device =
      cuda ? torch::Device(torch::kCUDA,
                           static_cast<c10::DeviceIndex>(local_rank))
           : torch::Device(torch::kCPU);
  auto sync = [&] {
    if (cuda) torch::cuda::synchronize(local_rank);
  };

  std::unique_ptr<Communicator> comm;
  if (o.backend == "nccl") {
    const int rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", -1);
    if (rank < 0 || world < 1 || rank >= world)
      throw UsageError(
          "zerostep_step: --backend=nccl needs RANK and WORLD_SIZE in the "
          "environment (torchrun's variables; tools/launch sets them)");
    std::string id_path = o.nccl_id_path;
    if (id_path.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      const char* port = std::getenv("MASTER_PORT");
      id_path = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") +
                "/zerostep_step_nccl." + (port != nullptr ? port : "0") + ".id";
    }
    comm = make_nccl(rank, world, local_rank, id_path);
  } else {
    comm = GlooCommunicator::from_environment();
  }
  const int rank = comm->rank(), world = comm->world_size();
  const std::unique_ptr<Task> task =
      o.hf.empty() ? make_gpt_task(o.model)
                   : make_hf_task(o.hf, o.model.block_size);
  // Rank r's micro-batch i is sample block i * world + r of one data set.
  const Batch host_data =
      task->make_data(o.seed ^ 0x5eed, static_cast<int64_t>(o.backwards) *
                                           world * o.micro_batch);
  const Batch data = {host_data.input.to(device), host_data.target.to(device)};
  auto micro = [&](int i) {
    return slice(data, (static_cast<int64_t>(i) * world + rank) * o.micro_batch,
                 o.micro_batch);
  };

  // 1. Plain forward+backward.
  int64_t baseline = cuda ? reset_device_peaks(local_rank) : 0;
  std::shared_ptr<torch::nn::Module> plain = task->make_model(o.seed);
  plain->to(device);
  std::vector<double> fwdbwd;
  for (int k = 0; k < o.warmup + o.windows; ++k) {
    for (auto& p : plain->parameters()) p.mutable_grad() = torch::Tensor();
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.backwards; ++i)
      (task->loss(*plain, micro(i)) / o.backwards).backward();
    sync();
    if (k >= o.warmup) fwdbwd.push_back(seconds_since(t0));
  }
  int64_t params = 0;
  for (const auto& p : plain->parameters()) params += p.numel();
  const nlohmann::json fwdbwd_memory =
      memory_json(o, local_rank, baseline, nullptr);
  plain.reset();

  // 2. Engine windows, one fresh model and Engine per mode.
  for (const auto& [name, mode] : modes) {
    baseline = cuda ? reset_device_peaks(local_rank) : 0;
    const Rss before = read_rss();
    reset_peak_rss();
    std::shared_ptr<torch::nn::Module> model;
    EngineOptions engine_options;
    std::unique_ptr<HfCheckpointSource> source;
    if (o.load == "meta") {
      HfDecoderOptions meta;
      meta.device = torch::kMeta;
      model = make_hf_decoder(read_hf_config(o.hf), meta).ptr();
      source = std::make_unique<HfCheckpointSource>(o.hf);
      engine_options.parameter_source = source.get();
    } else {
      model = task->make_model(o.seed);
      model->to(device);
    }
    std::unique_ptr<Engine> engine;
    try {
      engine = std::make_unique<Engine>(model, engine_config(o, mode, world),
                                        comm.get(), engine_options);
    } catch (const UsageError& e) {
      // The engine's own refusal of this mode here: said, not timed. Every
      // rank refuses alike, before any collective.
      if (rank == 0) {
        const nlohmann::json out = {{"framework", "zerostep"},
                                    {"mode", name},
                                    {"params", params},
                                    {"device", o.device},
                                    {"unsupported", e.what()}};
        std::printf("%s\n", out.dump().c_str());
        std::fflush(stdout);
      }
      continue;
    }
    const Rss made = read_rss();
    reset_peak_rss();
    std::vector<double> windows, forward, backward, step;
    for (int k = 0; k < o.warmup + o.windows; ++k) {
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      double f = 0, b = 0, s = 0;
      for (int i = 0; i < o.backwards; ++i) {
        const auto tf = std::chrono::steady_clock::now();
        const torch::Tensor loss = task->loss(*model, micro(i));
        const auto tb = std::chrono::steady_clock::now();
        engine->backward(loss);
        f += std::chrono::duration<double>(tb - tf).count();
        b += seconds_since(tb);
        // Managed: every backward has its step(), which applies the update
        // on the N-th; unmanaged: one step() after the N backward calls.
        if (mode.managed || i == o.backwards - 1) {
          const auto ts = std::chrono::steady_clock::now();
          engine->step();
          s += seconds_since(ts);
        }
      }
      sync();
      if (k >= o.warmup) {
        windows.push_back(seconds_since(t0));
        step.push_back(s);
        forward.push_back(f);
        backward.push_back(b);
      }
      if (!engine->was_step_applied() || engine->global_steps() != k + 1)
        throw std::logic_error(
            "zerostep_step: a window did not apply one update");
    }
    const Rss trained = read_rss();
    const nlohmann::json rss =
        cuda || !o.rss ? nlohmann::json()
             : gather_rss(*comm, {before.now_kib, made.peak_kib, made.now_kib,
                                  trained.peak_kib});
    if (rank != 0) continue;
    const MemoryStats engine_memory = engine->memory();
    nlohmann::json out = {
        {"framework", "zerostep"},
        {"mode", name},
        {"params", params},
        {"world", world},
        {"device", o.device},
        {"backend", comm->backend_name()},
        {"threads", o.threads},
        {"micro_batch", o.micro_batch},
        {"seq", o.model.block_size},
        {"backwards", o.backwards},
        {"window_s", windows},
        {"window_s_median", median(windows)},
        {"fwdbwd_s", fwdbwd},
        {"fwdbwd_s_median", median(fwdbwd)},
        {"memory", memory_json(o, local_rank, baseline, &engine_memory)},
        {"fwdbwd_memory", fwdbwd_memory},
        {"rss_kib", rss},
        {"runtime", runtime_info()}};
    if (!cuda) {
      out["forward_s_median"] = median(forward);
      out["backward_s_median"] = median(backward);
      out["step_s_median"] = median(step);
    }
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
