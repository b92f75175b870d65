#include "parity/scenario.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string_view>

#include "comm/gloo_world.h"
#include "comm/ledger.h"
#include "common/errors.h"
#include "engine/engine.h"
#include "engine/torch_kernels.h"
#include "parity/model_shape.h"
#include "sim/sim_world.h"
#include "zero/phase.h"
#include "zero/schedule.h"
#include "zero/stage2.h"

namespace zerostep {
namespace {

using nlohmann::json;

// A window's samples, laid out [micro-batch i][rank r][mb samples].
int64_t window_samples(const Scenario& s, int k) {
  return static_cast<int64_t>(s.backwards[k]) * s.world_size * s.micro_batch;
}

std::vector<float> to_vector(const torch::Tensor& t) {
  torch::Tensor c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(),
                            c.data_ptr<float>() + c.numel());
}

// Note [Overflow in one element]: while alive, element 0 of `param`'s
// gradient is +inf in every backward that reaches the parameter.
class InfInFirstElement {
 public:
  explicit InfInFirstElement(const torch::Tensor& param) : param_(param) {
    hook_ = param_.register_hook([this](const torch::Tensor& grad) {
      ++fired_;
      torch::Tensor g = grad.clone(torch::MemoryFormat::Contiguous);
      g.view({-1})[0].fill_(std::numeric_limits<float>::infinity());
      return g;
    });
  }
  ~InfInFirstElement() { param_.remove_hook(hook_); }
  InfInFirstElement(const InfInFirstElement&) = delete;
  InfInFirstElement& operator=(const InfInFirstElement&) = delete;
  int fired() const { return fired_; }

 private:
  torch::Tensor param_;
  unsigned hook_ = 0;
  int fired_ = 0;
};

// One backward() of `engine`, with the element overflow of Note [Overflow
// in one element] when `inject`; the hook must have reached the parameter.
void backward_maybe_inf(Engine& engine, const torch::Tensor& loss, bool inject,
                        bool scale_wrt_gas = true) {
  if (!inject) {
    engine.backward(loss, scale_wrt_gas);
    return;
  }
  InfInFirstElement inf(engine.parameters().front());
  engine.backward(loss, scale_wrt_gas);
  ZS_CHECK(inf.fired() == 1);
}

size_t rest_bytes(const MemoryStats& m) {
  return m.param_bytes + m.grad_bytes + m.optimizer_state_bytes;
}

struct Run {
  Config config;
  int world_size = 1;
  bool drive_override = false;  // managed with varying N
  bool reference = false;       // one backward over the whole window
  std::string device = "cpu";   // where the models and data live
};

RunDigest train(const Scenario& s, const Task& task, const Batch& host_data,
                const Run& run) {
  const torch::Device device(run.device);
  const Batch data = {host_data.input.to(device), host_data.target.to(device)};
  std::unique_ptr<LocalWorld> world_ptr;
  if (s.backend == "gloo") {
    world_ptr = std::make_unique<GlooLocalWorld>(run.world_size);
  } else {
    world_ptr = std::make_unique<SimWorld>(SimOptions{run.world_size, s.seed});
  }
  LocalWorld& world = *world_ptr;
  std::vector<std::shared_ptr<torch::nn::Module>> models;
  for (int r = 0; r < run.world_size; ++r) {
    models.push_back(task.make_model(s.seed));
    models.back()->to(device);
  }
  std::vector<std::vector<float>> finals(run.world_size);
  std::vector<int64_t> samples(run.world_size), applied(run.world_size),
      skipped(run.world_size);
  std::vector<std::vector<double>> scales(run.world_size),
      norms(run.world_size), lrs(run.world_size);
  std::vector<std::vector<int>> skipped_windows(run.world_size);
  std::vector<double> lr_initial(run.world_size);
  std::vector<std::vector<size_t>> rest(run.world_size);
  std::vector<uint64_t> comm_bytes(run.world_size),
      backward_bytes(run.world_size), forward_bytes(run.world_size),
      step_bytes(run.world_size), backward_rs_bytes(run.world_size, 0);
  std::vector<MemoryStats> memory(run.world_size);
  const int steps = static_cast<int>(s.backwards.size());
  std::vector<std::vector<double>> losses(run.world_size,
                                          std::vector<double>(steps, 0.0));
  auto* sim = dynamic_cast<SimWorld*>(&world);
  double params_count = 0;
  for (const auto& p : models[0]->parameters()) params_count += p.numel();
  std::vector<std::vector<double>> window_s(run.world_size);
  // Modelled compute of one backward over `samples` samples (Note [Cost
  // model]: one token per sample for the built-in models).
  auto charge = [&](int r, int64_t samples) {
    if (sim == nullptr) return;
    const double tokens = static_cast<double>(samples);
    const CostModel& cost = sim->options().cost;
    sim->compute(r, cost.forward_seconds(params_count, tokens) +
                        cost.backward_seconds(params_count, tokens));
  };
  auto now = [&](int r) { return sim ? sim->clock(r).now_s : 0.0; };
  world.run([&](int r) {
    torch::nn::Module& model = *models[r];
    // Scenario::kernels: the device path on the CPU, one per rank.
    std::unique_ptr<Kernels> kernels;
    EngineOptions options;
    if (s.kernels == "torch") {
      kernels = std::make_unique<TorchKernels>(torch::kCPU);
      options.kernels = kernels.get();
    }
    // The ranks share the device's one autograd thread (device_problem).
    options.stage3_collectives_outside_backward =
        s.stage3_collectives_outside_backward ||
        (s.device == "cuda" && s.world_size > 1);
    Engine engine(models[r], run.config, &world.comm(r), options);
    lr_initial[r] = engine.get_lr();
    const bool element = s.overflow_kind == OverflowKind::kElement;
    int64_t base = 0;
    for (int k = 0; k < steps; ++k) {
      const int n = s.backwards[k];
      const double window_start = now(r);
      if (run.reference) {
        charge(r, window_samples(s, k));
        const int64_t count = window_samples(s, k);
        torch::Tensor loss = task.loss(model, slice(data, base, count));
        const bool inject = k == s.overflow_window;
        double factor = inject && !element ? kOverflowLossFactor : 1.0;
        if (s.scaling == GradAccumScaling::kConfigured)
          factor *=
              static_cast<double>(n) / static_cast<double>(s.backwards.front());
        if (s.scaling == GradAccumScaling::kNone) factor *= n;
        losses[r][k] = loss.item<double>();
        backward_maybe_inf(engine, loss * factor, inject && element,
                           /*scale_wrt_gas=*/false);
        engine.step();
        applied[r] += engine.was_step_applied();
        scales[r].push_back(engine.loss_scale());
        norms[r].push_back(engine.get_global_grad_norm());
      } else {
        double sum = 0.0;
        for (int i = 0; i < n; ++i) {
          const int64_t first =
              base +
              (static_cast<int64_t>(i) * s.world_size + r) * s.micro_batch;
          charge(r, s.micro_batch);
          torch::Tensor loss =
              task.loss(model, slice(data, first, s.micro_batch));
          sum += loss.item<double>();
          const bool inject = k == s.overflow_window && r == s.overflow_rank &&
                              i == s.overflow_backward;
          if (inject && !element) loss = loss * kOverflowLossFactor;
          if (run.drive_override)
            engine.set_gradient_accumulation_boundary(i == n - 1);
          backward_maybe_inf(engine, loss, inject && element);
          if (run.config.managed_gradient_accumulation) {
            engine.step();
            applied[r] += engine.was_step_applied();
          }
        }
        if (!run.config.managed_gradient_accumulation) {
          engine.step();
          applied[r] += engine.was_step_applied();
        }
        scales[r].push_back(engine.loss_scale());
        norms[r].push_back(engine.get_global_grad_norm());
        losses[r][k] = sum / n;
      }
      // The window's last step() is its boundary in every mode.
      if (!engine.was_step_applied()) skipped_windows[r].push_back(k);
      lrs[r].push_back(engine.get_lr());
      rest[r].push_back(rest_bytes(engine.memory()));
      window_s[r].push_back(now(r) - window_start);
      base += window_samples(s, k);
    }
    // Training's traffic, before the (stage 3: collective) read-back.
    comm_bytes[r] = world.ledger(r).total_bytes();
    backward_bytes[r] = world.ledger(r).bytes_in(phase::kBackward);
    forward_bytes[r] = world.ledger(r).bytes_in(phase::kForward);
    step_bytes[r] = world.ledger(r).bytes_in(phase::kStep);
    for (const LedgerEntry& e : world.ledger(r).entries())
      if (e.kind == CollectiveKind::kReduceScatter &&
          std::string_view(e.label) == phase::kBackward)
        backward_rs_bytes[r] += e.bytes;
    memory[r] = engine.memory();
    finals[r] = to_vector(engine.full_parameters());
    samples[r] = engine.global_samples();
    skipped[r] = engine.skipped_steps();
  });
  RunDigest d;
  d.params = finals[0];
  d.replicas_identical = true;
  for (int r = 1; r < run.world_size; ++r)
    d.replicas_identical =
        d.replicas_identical && finals[r].size() == finals[0].size() &&
        std::memcmp(finals[r].data(), finals[0].data(), finals[0].size() * 4) ==
            0;
  d.comm_bytes = comm_bytes[0];
  d.backward_comm_bytes = backward_bytes[0];
  d.forward_comm_bytes = forward_bytes[0];
  d.step_comm_bytes = step_bytes[0];
  d.backward_reduce_scatter_bytes = backward_rs_bytes[0];
  d.memory_rest_bytes = rest_bytes(memory[0]);
  for (int k = 0; k < steps; ++k) {
    d.memory_rest_by_window.emplace_back();
    for (int r = 0; r < run.world_size; ++r)
      d.memory_rest_by_window.back().push_back(rest[r][k]);
  }
  d.memory_peak_bytes = memory[0].peak_bytes;
  d.global_samples = samples[0];
  d.steps_applied = applied[0];
  d.skipped_steps = skipped[0];
  d.loss_scales = scales[0];
  d.skipped_windows = skipped_windows[0];
  d.lr_initial = lr_initial[0];
  d.lrs = lrs[0];
  d.grad_norms = norms[0];
  if (sim != nullptr) {
    d.virtual_step_s = window_s[0];
    d.exposed_comm_s = sim->clock(0).exposed_comm_s;
    for (const CollectiveTiming& c : sim->timeline(0))
      d.bytes_by_collective[to_string(c.kind)] += c.bytes;
  }
  for (int k = 0; k < steps; ++k) {
    double m = 0.0;
    for (int r = 0; r < run.world_size; ++r) m += losses[r][k];
    d.losses.push_back(m / run.world_size);
  }
  d.digest = fnv1a_hex(d.params.data(), d.params.size() * sizeof(float));
  return d;
}

}  // namespace

std::string harness_flags(const Scenario& s) {
  std::ostringstream os;
  os << " --stages=" << s.stage << " --world=" << s.world_size
     << " --backwards=";
  for (size_t i = 0; i < s.backwards.size(); ++i)
    os << (i ? "," : "") << s.backwards[i];
  if (s.backwards.size() == 1) os << " --steps=1";
  os << " --scaling=" << to_string(s.scaling) << " --model=" << s.model
     << " --model-scale=" << s.model_scale << " --micro-batch=" << s.micro_batch
     << " --seed=" << s.seed;
  if (s.backend != "sim") os << " --backend=" << s.backend;
  if (s.gradient_clipping >= 0) os << " --clip=" << s.gradient_clipping;
  if (s.dtype != Precision::kFp32) os << " --dtype=" << to_string(s.dtype);
  if (s.offload != OffloadDevice::kNone)
    os << " --offload=" << to_string(s.offload);
  if (s.offload_param != OffloadDevice::kNone) os << " --offload-param";
  if (s.sub_group_size > 0) os << " --sub-group-size=" << s.sub_group_size;
  if (s.overflow_window >= 0) {
    os << " --overflow=" << s.overflow_window << ":" << s.overflow_rank << ":"
       << s.overflow_backward;
    if (s.overflow_kind != OverflowKind::kLoss)
      os << ":" << to_string(s.overflow_kind);
  }
  if (!s.base_config_json.empty())
    os << " --config=<a file holding: " << elide(s.base_config_json, 2000)
       << ">";
  if (s.overlap_comm) os << " --overlap-comm";
  if (s.reduce_once_per_step) os << " --reduce-once-per-step";
  if (s.gather_once_per_step) os << " --gather-once-per-step";
  if (s.reduce_bucket_size > 0)
    os << " --reduce-bucket-size=" << s.reduce_bucket_size;
  if (s.allgather_bucket_size > 0)
    os << " --allgather-bucket-size=" << s.allgather_bucket_size;
  if (s.persistence_threshold >= 0)
    os << " --persistence-threshold=" << s.persistence_threshold;
  return os.str();
}

const char* to_string(OverflowKind k) {
  switch (k) {
    case OverflowKind::kLoss:
      return "loss";
    case OverflowKind::kElement:
      return "element";
  }
  return "?";
}

double reference_tolerance(Precision dtype) {
  switch (dtype) {
    case Precision::kBf16:
      return kReferenceToleranceBf16;
    case Precision::kFp16:
      return kReferenceToleranceFp16;
    case Precision::kFp32:
      break;
  }
  return kReferenceTolerance;
}

std::string fnv1a_hex(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(h));
  return buf;
}

Config scenario_config(const Scenario& s, bool managed) {
  json j = s.base_config_json.empty() ? json::object()
                                      : json::parse(s.base_config_json);
  int64_t micro = s.micro_batch;
  j.erase("train_batch_size");
  j["train_micro_batch_size_per_gpu"] = micro;
  j["gradient_accumulation_steps"] = s.backwards.front();
  j["managed_gradient_accumulation"] = managed;
  j["gradient_accumulation_scaling"] = to_string(s.scaling);
  if (!j.contains("zero_optimization") || !j["zero_optimization"].is_object())
    j["zero_optimization"] = json::object();
  json& zero = j["zero_optimization"];
  zero["stage"] = s.stage;
  if (s.overlap_comm) zero["overlap_comm"] = true;
  if (s.reduce_once_per_step) zero["reduce_once_per_step"] = true;
  if (s.gather_once_per_step) zero["gather_once_per_step"] = true;
  // Unmanaged mode refuses overlap_comm at stages 0-1 (nothing to overlap
  // there); it changes when buckets are sent, never what is summed, so the
  // file's setting is dropped rather than the scenario refused. Managed
  // mode keeps it at stage 0 (Note [Stage 0 buckets]), so the comparison
  // checks that overlapping the boundary backward's buckets changes no bit.
  if (s.stage == 1 || (s.stage == 0 && !managed)) zero.erase("overlap_comm");
  if (s.reduce_bucket_size > 0)
    zero["reduce_bucket_size"] = s.reduce_bucket_size;
  if (s.allgather_bucket_size > 0)
    zero["allgather_bucket_size"] = s.allgather_bucket_size;
  if (s.persistence_threshold >= 0)
    zero["stage3_param_persistence_threshold"] = s.persistence_threshold;
  if (s.gradient_clipping >= 0.0) j["gradient_clipping"] = s.gradient_clipping;
  // The scenario's offload and dtype replace the file's: a section the
  // scenario turns off is removed (so the stage-0 reference and the
  // in-memory twin of an offload file run), one it turns on keeps the
  // file's other keys (pin_memory, buffer_count, loss scaling, ...).
  for (const char* old_key :
       {"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory"})
    zero.erase(old_key);
  auto set_offload = [&](const char* key, OffloadDevice device) {
    if (device == OffloadDevice::kNone) {
      zero.erase(key);
      return;
    }
    if (!zero.contains(key) || !zero[key].is_object())
      zero[key] = json::object();
    zero[key]["device"] = to_string(device);
    if (device == OffloadDevice::kNvme)
      zero[key]["nvme_path"] = s.nvme_path;
    else
      zero[key].erase("nvme_path");
  };
  set_offload("offload_optimizer", s.offload);
  set_offload("offload_param", s.offload_param);
  if (s.sub_group_size > 0) zero["sub_group_size"] = s.sub_group_size;
  // bfloat16 is DeepSpeed's other name for bf16: one section, one name.
  if (j.contains("bfloat16")) {
    if (!j.contains("bf16")) j["bf16"] = j["bfloat16"];
    j.erase("bfloat16");
  }
  auto enable = [&](const char* key, bool on) {
    if (!on && !j.contains(key)) return;
    if (!j.contains(key) || !j[key].is_object()) j[key] = json::object();
    j[key]["enabled"] = on;
  };
  if (s.dtype == Precision::kFp16 &&
      (!j.contains("fp16") || !j["fp16"].is_object()))
    j["fp16"] = {{"loss_scale", 0},
                 {"initial_scale_power", 8},
                 {"loss_scale_window", 2},
                 {"hysteresis", 2}};
  enable("fp16", s.dtype == Precision::kFp16);
  enable("bf16", s.dtype == Precision::kBf16);
  if (!j.contains("optimizer"))
    j["optimizer"] = {
        {"type", "AdamW"},
        {"params",
         {{"lr", kScenarioLr}, {"weight_decay", kScenarioWeightDecay}}}};
  return parse_config(j.dump(), s.world_size, s.trainer);
}

std::vector<std::string> lr_failures(const ScenarioResult& r) {
  const Scenario& s = r.scenario;
  std::vector<std::string> failures;
  for (const auto& [name, d] : {std::pair{"unmanaged", &r.unmanaged},
                                {"managed", &r.managed},
                                {"reference", &r.reference}}) {
    // The injected window, and every window the run itself skipped.
    std::vector<int> windows = d->skipped_windows;
    if (s.overflow_window >= 0) windows.push_back(s.overflow_window);
    std::sort(windows.begin(), windows.end());
    windows.erase(std::unique(windows.begin(), windows.end()), windows.end());
    for (int w : windows) {
      if (w < 0 || w >= static_cast<int>(d->lrs.size())) continue;
      const double before = w == 0 ? d->lr_initial : d->lrs[w - 1];
      if (d->lrs[w] != before) {
        std::ostringstream os;
        os << name << ": the lr moved across the skipped window " << w << " ("
           << before << " before it, " << d->lrs[w] << " after)";
        failures.push_back(os.str());
      }
    }
  }
  // The schedule advances once per applied update, in every run alike.
  if (r.unmanaged.lrs != r.managed.lrs)
    failures.push_back("unmanaged and managed lr trajectories differ");
  if (r.reference_compared && r.unmanaged.lrs != r.reference.lrs)
    failures.push_back("the lr trajectory differs from the reference's");
  return failures;
}

std::vector<std::string> rest_memory_failures(const ScenarioResult& r) {
  std::vector<std::string> failures;
  for (const auto& [name, d] : {std::pair{"unmanaged", &r.unmanaged},
                                {"managed", &r.managed},
                                {"reference", &r.reference}}) {
    const auto& by_window = d->memory_rest_by_window;
    bool same = true;
    for (size_t k = 1; k < by_window.size() && same; ++k)
      for (size_t rank = 0; rank < by_window[k].size() && same; ++rank) {
        if (by_window[k][rank] == by_window[0][rank]) continue;
        same = false;
        failures.push_back(
            std::string(name) + ": rank " + std::to_string(rank) + " holds " +
            std::to_string(by_window[k][rank]) +
            " bytes at rest after window " + std::to_string(k) + ", " +
            std::to_string(by_window[0][rank]) + " after window 0");
      }
  }
  return failures;
}

std::string device_problem(const Scenario& s) {
  if (s.kernels != "host" && s.kernels != "torch")
    return "kernels '" + s.kernels + "' is not one of host, torch";
  // Stages 1-2 offload through LibTorch copies, not kernels (Note
  // [ZeRO-Offload] in engine/flat_binding.h); stage 3 keeps its gathered
  // groups in the kernels' memory then (Note [Stage 3 offload from a
  // device] in zero/stage3.h).
  if (s.kernels == "torch" &&
      ((s.stage <= 2 && s.offload != OffloadDevice::kNone) ||
       s.device != "cpu"))
    return std::string("--kernels=torch with offload ") +
           to_string(s.offload) + " at stage " + std::to_string(s.stage) +
           " on " + s.device +
           ": it runs the engine's device path on the CPU, where stages 1-2 "
           "offload without kernels. Fix: --offload=none at stages 1-2, "
           "--device=cpu";
  if (s.device == "cpu") return "";
  if (s.device != "cuda")
    return "device '" + s.device + "' is not one of cpu, cuda";
  // LibTorch runs every backward on a device through one autograd thread
  // per device, shared by the whole process: a rank that waits in a
  // collective inside its backward (stage 2 with overlap_comm) stops the
  // other ranks' backward passes, which that collective waits for. Stage 3
  // runs its collectives outside backward there (run_scenario: Note [Stage
  // 3 collectives outside backward] in zero/stage3.h).
  if (s.world_size > 1 && s.stage == 2 && s.overlap_comm)
    return "overlap_comm at world " + std::to_string(s.world_size) +
           " on cuda: the ranks of one process share LibTorch's one "
           "autograd thread for the device, so a rank that waits in a "
           "collective inside its backward would stop the others' "
           "backward and hang. Fix: drop --overlap-comm, or run one "
           "process per rank (NCCL: gpu_check.sh's step benchmark)";
  return "";
}

// Note [Memory plan]: the plan of the scenario's engines, or nullopt where
// it plans nothing (offload; a backend that overlaps, whose stage 3 pools
// grow by what is in flight).
// Note [Stage 2 buckets] (zero/stage2.h): the bucket pool starts with
// min(buckets, 2) slots, which cover a model whose parameters complete in
// reverse registration order; a model that completes them in another order
// grows it by a slot whenever every slot holds an open bucket. The plan
// knows only the shapes, so the harness finds the order the way the
// engine's hooks see it (one backward of the scenario's model, a hook on
// each trainable parameter), replays the pool's rule over it, and names
// the growth in the plan. The tiny GPT grows by one slot at buckets of 240
// elements at three ranks: its token embedding completes before its
// position embedding, which straddles two buckets, both kept open.
size_t stage2_pool_growth(const Scenario& s, const Task& task,
                          const FlatLayout& layout, int64_t bucket_size) {
  const std::vector<Span> buckets =
      internal::make_buckets(layout, bucket_size);
  if (buckets.size() <= 2) return 0;  // a slot per bucket already
  // Each parameter's elements per bucket, and what each bucket awaits.
  std::vector<size_t> awaited(buckets.size(), 0);
  std::vector<std::vector<std::pair<size_t, size_t>>> parts(
      layout.numels.size());  // (bucket, elements), last bucket first
  for (size_t p = 0; p < layout.numels.size(); ++p) {
    const size_t begin = layout.offsets[p], end = begin + layout.numels[p];
    for (size_t k = buckets.size(); k-- > 0;) {
      const size_t lo = std::max(begin, buckets[k].offset);
      const size_t hi = std::min(end, buckets[k].offset + buckets[k].numel);
      if (lo >= hi) continue;
      parts[p].push_back({k, hi - lo});
      awaited[k] += hi - lo;
    }
  }
  // The order autograd completes the parameters' gradients in.
  std::shared_ptr<torch::nn::Module> model = task.make_model(s.seed);
  std::vector<torch::Tensor> params = trainable_parameters(*model);
  ZS_CHECK(params.size() == layout.numels.size());
  std::vector<size_t> order;
  std::vector<unsigned> hooks;
  for (size_t p = 0; p < params.size(); ++p)
    hooks.push_back(params[p].register_hook([&order, p](torch::Tensor g) {
      order.push_back(p);
      return g;
    }));
  task.loss(*model, task.make_data(s.seed ^ 0x5eed, s.micro_batch))
      .backward();
  for (size_t p = 0; p < params.size(); ++p)
    params[p].remove_hook(hooks[p]);
  // The pool's rule (Stage2::take_grad, take_slot, end_backward).
  const size_t first = std::min<size_t>(buckets.size(), 2);
  size_t slots = first, open = 0;
  std::vector<bool> has_slot(buckets.size(), false);
  auto take = [&](size_t k) {
    if (open == slots) ++slots;
    has_slot[k] = true;
    ++open;
  };
  for (size_t p : order)
    for (const auto& [k, n] : parts[p]) {
      if (!has_slot[k]) take(k);
      awaited[k] -= n;
      if (awaited[k] == 0) {
        has_slot[k] = false;
        --open;
      }
    }
  for (size_t k = 0; k < buckets.size(); ++k) {  // no gradient: zeros
    if (awaited[k] == 0) continue;
    if (!has_slot[k]) take(k);
    has_slot[k] = false;
    --open;
  }
  return slots - first;
}

std::optional<MemoryPlan> scenario_memory_plan(const Scenario& s,
                                               const Config& c,
                                               const Task& task) {
  if (s.backend != "sim" || s.device != "cpu") return std::nullopt;
  if (c.zero.offload_optimizer.device != OffloadDevice::kNone ||
      c.zero.offload_param.device != OffloadDevice::kNone)
    return std::nullopt;
  // Stage 3 with its collectives outside backward keeps every group
  // gathered and its full gradient storage (Note [Stage 3 collectives
  // outside backward]): a layout the plan does not model.
  const bool outside = s.stage3_collectives_outside_backward;
  if (outside && c.zero.stage == 3) return std::nullopt;
  ScheduleOptions o;
  o.stage = c.zero.stage;
  o.world_size = s.world_size;
  o.dtype = c.precision.dtype;
  o.reduce_bucket_size = c.zero.reduce_bucket_size;
  o.allgather_bucket_size = c.zero.allgather_bucket_size;
  o.persistence_threshold = c.zero.stage3_param_persistence_threshold;
  o.max_reuse_distance = c.zero.stage3_max_reuse_distance;
  o.gather_once_per_step = c.zero.gather_once_per_step;
  // Stage 2 with its collectives outside backward keeps the full gradient,
  // as with reduce_once_per_step (partitions_gradients() in zero/stage.h).
  o.reduce_once_per_step = c.zero.reduce_once_per_step || outside;
  o.optimizer_bytes_per_element =
      c.optimizer.type == OptimizerType::kSGD
          ? (c.optimizer.momentum > 0 ? sizeof(float) : 0)
          : 2 * sizeof(float);
  const ModelShape shape = model_shape(*task.make_model(s.seed), s.model);
  MemoryPlan plan = memory_plan(shape, o);
  if (o.stage == 2 && !o.reduce_once_per_step) {
    const FlatLayout layout = FlatLayout::make(shape.numels, s.world_size);
    const size_t grown =
        stage2_pool_growth(s, task, layout, o.reduce_bucket_size);
    if (grown > 0) {
      size_t largest = 0;
      for (const Span& b : internal::make_buckets(layout, o.reduce_bucket_size))
        largest = std::max(largest, b.numel);
      plan.terms.push_back(
          {"bucket pool growth (parameters completed out of order)",
           grown * (largest + largest / s.world_size) * sizeof(float),
           MemoryTerm::Field::kGrads, false});
    }
  }
  return plan;
}

namespace {

// A failure of the scenario unless `cond`.
void require(ScenarioResult& res, bool cond, const std::string& why) {
  if (!cond) res.failures.push_back(why);
}

// The scenario's settings that no run could take: UsageError naming the
// flag and the fix.
void check_scenario(const Scenario& s) {
  if (const std::string why = device_problem(s); !why.empty())
    throw UsageError(why);
  if ((s.offload == OffloadDevice::kNvme ||
       s.offload_param == OffloadDevice::kNvme) &&
      s.nvme_path.empty())
    throw UsageError("an nvme offload scenario needs nvme_path (--nvme-path)");
  if (s.backend != "sim" && s.backend != "gloo")
    throw UsageError("backend '" + s.backend +
                     "' is not one of sim, gloo (nccl: --config=cuda on a "
                     "GPU node)");
  if (s.backwards.empty())
    throw UsageError("a scenario needs at least one window (--backwards)");
  for (int n : s.backwards)
    if (n < 1)
      throw UsageError("--backwards: every N must be at least 1, got " +
                       std::to_string(n));
  if (s.overflow_window >= 0) {
    if (s.dtype != Precision::kFp16)
      throw UsageError(
          "an injected overflow needs --dtype=fp16 (only fp16 "
          "detects and skips overflowing windows)");
    if (s.overflow_window >= static_cast<int>(s.backwards.size()) ||
        s.overflow_rank < 0 || s.overflow_rank >= s.world_size ||
        s.overflow_backward < 0 ||
        s.overflow_backward >= s.backwards[s.overflow_window])
      throw UsageError("--overflow=" + std::to_string(s.overflow_window) + ":" +
                       std::to_string(s.overflow_rank) + ":" +
                       std::to_string(s.overflow_backward) +
                       " is outside the run (window < steps, rank < world, "
                       "backward < that window's N)");
  }
}

// The single-rank reference of `s`: one managed backward over each whole
// window, on the CPU always (without offload a CUDA model needs the engine
// on the device).
Run reference_run(const Scenario& s) {
  Scenario ref_s = s;
  ref_s.world_size = 1;
  ref_s.stage = 0;
  ref_s.overlap_comm = false;
  ref_s.offload = ref_s.offload_param = OffloadDevice::kNone;
  ref_s.scaling = GradAccumScaling::kNone;  // the factor is in the loss
  ref_s.backwards = {1};
  return Run{scenario_config(ref_s, true), 1, false, true, "cpu"};
}

// The twins that isolate one setting: the same run without offload, and
// without gather_once_per_step, where the scenario has them.
void train_twins(const Scenario& s, const Task& task, const Batch& data,
                 ScenarioResult& res) {
  const bool offloaded = s.offload != OffloadDevice::kNone ||
                         s.offload_param != OffloadDevice::kNone;
  if (offloaded && s.device == "cpu") {
    Scenario plain = s;
    plain.offload = plain.offload_param = OffloadDevice::kNone;
    // The offload run's arithmetic is the host's (stage 3 with kernels
    // "torch": the partitions and Adam on the host, only the gathered
    // groups in the device's memory), so its twin is the host's run.
    plain.kernels = "host";
    res.in_memory =
        train(plain, task, data,
              Run{scenario_config(plain, false), s.world_size, false, false});
    res.offload_bitwise_equal = res.in_memory.digest == res.unmanaged.digest;
    res.offload_compared = true;
  }
  if (s.gather_once_per_step) {
    Scenario every = s;
    every.gather_once_per_step = false;
    res.gathered_every_use = train(every, task, data,
                                   Run{scenario_config(every, false),
                                       s.world_size, false, false, s.device});
    res.gather_once_bitwise_equal =
        res.gathered_every_use.digest == res.unmanaged.digest;
    res.gather_once_compared = true;
  }
}

// Unmanaged against managed (bitwise) and against the reference (relative
// differences).
void compare_parameters(ScenarioResult& res) {
  const auto& u = res.unmanaged.params;
  const auto& m = res.managed.params;
  const auto& ref = res.reference.params;
  res.bitwise_equal = u.size() == m.size() &&
                      std::memcmp(u.data(), m.data(), u.size() * 4) == 0;
  double max_ref = 0.0, max_ref_diff = 0.0, ref_sq = 0.0, diff_sq = 0.0;
  for (size_t i = 0; i < u.size(); ++i) {
    res.max_abs_diff =
        std::max(res.max_abs_diff, static_cast<double>(std::fabs(u[i] - m[i])));
    max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref[i])));
    const double d = static_cast<double>(u[i]) - ref[i];
    max_ref_diff = std::max(max_ref_diff, std::fabs(d));
    ref_sq += static_cast<double>(ref[i]) * ref[i];
    diff_sq += d * d;
  }
  res.ref_max_rel_diff = max_ref > 0 ? max_ref_diff / max_ref : max_ref_diff;
  res.ref_rel_l2_diff =
      ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
}

// Note [Overflows nobody injected]: which windows the runs skipped against
// the injected one; sets reference_compared and expected_global_samples.
// Returns the number of windows the runs skipped.
int64_t check_skipped_windows(const Scenario& s, ScenarioResult& res) {
  std::vector<int> injected;
  if (s.overflow_window >= 0) injected.push_back(s.overflow_window);
  const bool only_injected = res.unmanaged.skipped_windows == injected &&
                             res.managed.skipped_windows == injected &&
                             res.reference.skipped_windows == injected;
  res.reference_compared = only_injected || !s.natural_overflow_ok;
  if (!only_injected && !s.natural_overflow_ok) {
    auto list = [](const std::vector<int>& v) {
      std::string out;
      for (int w : v) out += (out.empty() ? "" : ",") + std::to_string(w);
      return "[" + out + "]";
    };
    res.failures.push_back(
        "skipped windows " + list(res.unmanaged.skipped_windows) +
        " (managed " + list(res.managed.skipped_windows) + ", reference " +
        list(res.reference.skipped_windows) +
        "), but the overflows injected were " + list(injected));
  }
  // Every window's samples count but those of the windows the run should
  // have skipped: the injected one, or (allowed) the ones it skipped itself.
  const std::vector<int>& expected_skips =
      res.reference_compared ? injected : res.unmanaged.skipped_windows;
  for (size_t k = 0; k < s.backwards.size(); ++k)
    if (std::find(expected_skips.begin(), expected_skips.end(),
                  static_cast<int>(k)) == expected_skips.end())
      res.expected_global_samples += window_samples(s, static_cast<int>(k));
  if (!res.reference_compared) {
    require(res, res.unmanaged.skipped_windows == res.managed.skipped_windows,
            "unmanaged and managed skipped different windows");
    if (s.overflow_window >= 0)
      for (const RunDigest* d : {&res.unmanaged, &res.managed, &res.reference})
        require(res,
                std::find(d->skipped_windows.begin(), d->skipped_windows.end(),
                          s.overflow_window) != d->skipped_windows.end(),
                "a run did not skip the injected window " +
                    std::to_string(s.overflow_window));
  }
  return static_cast<int64_t>(res.unmanaged.skipped_windows.size());
}

// The twins' verdicts: the offload run and the gather_once_per_step run
// against the same run without them.
void check_twins(const Scenario& s, ScenarioResult& res) {
  require(res, res.offload_bitwise_equal,
          "the offload run differs from the same run without offload");
  if (res.gather_once_compared) {
    require(res, res.gather_once_bitwise_equal,
            "the gather_once_per_step run differs from the same run without "
            "it");
    // Note [Stage 3 gather once per step]: a window of N > 1 backward calls
    // gathers each block once instead of at least N times (when there are
    // blocks to gather: not when the persistence threshold keeps them
    // whole).
    const bool several =
        *std::max_element(s.backwards.begin(), s.backwards.end()) > 1;
    if (several && res.gathered_every_use.forward_comm_bytes > 0)
      require(res,
              res.unmanaged.forward_comm_bytes <
                  res.gathered_every_use.forward_comm_bytes,
              "gather_once_per_step all-gathered " +
                  std::to_string(res.unmanaged.forward_comm_bytes) +
                  " bytes in forward, no fewer than the " +
                  std::to_string(res.gathered_every_use.forward_comm_bytes) +
                  " of the same run without it");
  }
}

// What the unmanaged run communicated: as many bytes as the managed run,
// nothing during backward at stages 0-1, and at stages 2-3 a reduce-scatter
// in every backward unless reduce_once_per_step.
void check_communication(const Scenario& s, ScenarioResult& res) {
  require(res, res.unmanaged.comm_bytes == res.managed.comm_bytes,
          "unmanaged moved " + std::to_string(res.unmanaged.comm_bytes) +
              " bytes, managed " + std::to_string(res.managed.comm_bytes));
  if (s.stage <= 1)
    require(res, res.unmanaged.backward_comm_bytes == 0,
            "stage " + std::to_string(s.stage) +
                " unmanaged communicated during backward");
  // Note [Reduce once per step]: the backwards only agree and (stage 3)
  // gather; by default stages 2/3 reduce in every backward.
  if (s.stage >= 2)
    require(res,
            (res.unmanaged.backward_reduce_scatter_bytes == 0) ==
                s.reduce_once_per_step,
            std::string("stage ") + std::to_string(s.stage) +
                " unmanaged reduce-scattered " +
                std::to_string(res.unmanaged.backward_reduce_scatter_bytes) +
                " bytes during backward with reduce_once_per_step " +
                (s.reduce_once_per_step ? "on" : "off"));
}

// The runs' training state: replicas, applied and skipped steps, samples,
// loss-scale and gradient-norm trajectories, each against the others and
// (where compared) the reference's within reference_tolerance().
void check_training(const Scenario& s, int64_t skipped, ScenarioResult& res) {
  const int64_t steps = static_cast<int64_t>(s.backwards.size()) - skipped;
  require(res, res.unmanaged.replicas_identical, "unmanaged replicas diverged");
  require(res, res.managed.replicas_identical, "managed replicas diverged");
  require(res, res.unmanaged.steps_applied == steps,
          "unmanaged applied " + std::to_string(res.unmanaged.steps_applied) +
              " of " + std::to_string(steps) + " updates");
  require(res, res.managed.steps_applied == steps,
          "managed applied " + std::to_string(res.managed.steps_applied) +
              " of " + std::to_string(steps) + " updates");
  require(res, res.unmanaged.global_samples == res.expected_global_samples,
          "unmanaged global_samples " +
              std::to_string(res.unmanaged.global_samples) +
              " != " + std::to_string(res.expected_global_samples));
  for (const RunDigest* d : {&res.unmanaged, &res.managed, &res.reference})
    if (res.reference_compared || d != &res.reference)
      require(res, d->skipped_steps == skipped,
              std::string(d == &res.unmanaged ? "unmanaged"
                          : d == &res.managed ? "managed"
                                              : "reference") +
                  " skipped " + std::to_string(d->skipped_steps) +
                  " steps, expected " + std::to_string(skipped));
  // One entry per window in every run: the managed run's per-window scale
  // is its value after the window's last step().
  require(res, res.unmanaged.loss_scales == res.managed.loss_scales,
          "unmanaged and managed loss-scale trajectories differ");
  if (res.reference_compared)
    require(res, res.unmanaged.loss_scales == res.reference.loss_scales,
            "the loss-scale trajectory differs from the reference's");
  const double tol = reference_tolerance(s.dtype);
  require(res, res.unmanaged.grad_norms == res.managed.grad_norms,
          "unmanaged and managed global gradient norms differ");
  for (size_t k = 0; k < res.reference.grad_norms.size(); ++k) {
    const double want = res.reference.grad_norms[k];
    const double got = res.unmanaged.grad_norms[k];
    // -1: no update applied yet (every run skipped the same windows).
    const double rel = want > 0      ? std::fabs(got - want) / want
                       : got == want ? 0.0
                                     : 1.0;
    res.ref_grad_norm_rel_diff = std::max(res.ref_grad_norm_rel_diff, rel);
  }
  if (res.reference_compared) {
    require(res, res.ref_grad_norm_rel_diff <= tol,
            "the global gradient norm differs from the reference's by " +
                std::to_string(res.ref_grad_norm_rel_diff) +
                " (relative; tolerance " + std::to_string(tol) + ")");
    require(res, res.ref_rel_l2_diff <= tol,
            "differs from the single-rank reference by " +
                std::to_string(res.ref_rel_l2_diff) +
                " (relative L2; tolerance " + std::to_string(tol) + ")");
  }
}

// Note [Memory plan]: no run holds more than its plan, at rest or at its
// peak (a gathered block or a full gradient kept alive shows here).
void check_memory_plan(const Scenario& s, const Config& config,
                       const Task& task, ScenarioResult& res) {
  const std::optional<MemoryPlan> plan = scenario_memory_plan(s, config, task);
  if (!plan) return;
  res.memory_planned = true;
  res.memory_plan_bytes = plan->total_bytes();
  for (const auto& [name, d] :
       {std::pair{"unmanaged", &res.unmanaged}, {"managed", &res.managed}}) {
    require(res, d->memory_rest_bytes <= res.memory_plan_bytes,
            std::string(name) + " holds " +
                std::to_string(d->memory_rest_bytes) +
                " bytes at rest, more than the " +
                std::to_string(res.memory_plan_bytes) +
                " its memory plan gives (Note [Memory plan])");
    require(res, d->memory_peak_bytes <= res.memory_plan_bytes,
            std::string(name) + " peaked at " +
                std::to_string(d->memory_peak_bytes) +
                " bytes, more than the " +
                std::to_string(res.memory_plan_bytes) +
                " its memory plan gives (Note [Memory plan])");
  }
}

}  // namespace

ScenarioResult run_scenario(const Scenario& s) {
  check_scenario(s);
  std::unique_ptr<Task> task = make_task(s.model, s.model_scale);
  int64_t total = 0;
  for (size_t k = 0; k < s.backwards.size(); ++k)
    total += window_samples(s, static_cast<int>(k));
  const Batch data = task->make_data(s.seed ^ 0x5eed, total);

  const bool varying =
      std::adjacent_find(s.backwards.begin(), s.backwards.end(),
                         std::not_equal_to<int>()) != s.backwards.end();
  ScenarioResult res;
  res.scenario = s;

  Run unmanaged{scenario_config(s, false), s.world_size, false, false,
                s.device};
  Run managed{scenario_config(s, true), s.world_size, varying, false, s.device};
  res.ignored_keys = unmanaged.config.ignored_keys;
  res.unmanaged = train(s, *task, data, unmanaged);
  res.managed = train(s, *task, data, managed);
  res.reference = train(s, *task, data, reference_run(s));
  train_twins(s, *task, data, res);

  compare_parameters(res);
  const int64_t skipped = check_skipped_windows(s, res);
  require(res, res.bitwise_equal,
          "unmanaged and managed parameters differ "
          "(max_abs_diff " +
              std::to_string(res.max_abs_diff) + ")");
  check_twins(s, res);
  check_communication(s, res);
  check_training(s, skipped, res);
  for (const std::string& f : lr_failures(res)) require(res, false, f);
  // Rest memory: stage 3 must release every full storage it gathered for
  // forward and backward by the end of step(). Stages 0-2 allocate all of
  // it up front (FlatStage::memory) and the optimizer state is allocated at
  // construction (zero/optimizer.h), so they hold it too: every stage is
  // checked.
  for (const std::string& f : rest_memory_failures(res)) require(res, false, f);
  check_memory_plan(s, unmanaged.config, *task, res);
  res.ok = res.failures.empty();
  return res;
}

std::string to_json_line(const ScenarioResult& r) {
  const Scenario& s = r.scenario;
  json j;
  j["stage"] = s.stage;
  j["offload"] = to_string(s.offload);
  j["offload_param"] = to_string(s.offload_param);
  j["offload_bitwise_equal"] = r.offload_bitwise_equal;
  j["offload_compared"] = r.offload_compared;
  j["device"] = s.device;
  j["kernels"] = s.kernels;
  j["backend"] = s.backend;
  j["overlap_comm"] = s.overlap_comm;
  j["reduce_once_per_step"] = s.reduce_once_per_step;
  j["gather_once_per_step"] = s.gather_once_per_step;
  if (r.gather_once_compared)
    j["gather_once_bitwise_equal"] = r.gather_once_bitwise_equal;
  j["backward_reduce_scatter_bytes_unmanaged"] =
      r.unmanaged.backward_reduce_scatter_bytes;
  j["persistence_threshold"] = s.persistence_threshold;
  j["world"] = s.world_size;
  j["dtype"] = to_string(s.dtype);
  if (s.overflow_window >= 0)
    j["overflow"] = {{"window", s.overflow_window},
                     {"rank", s.overflow_rank},
                     {"backward", s.overflow_backward},
                     {"kind", to_string(s.overflow_kind)}};
  j["skipped_steps"] = r.unmanaged.skipped_steps;
  j["skipped_windows_unmanaged"] = r.unmanaged.skipped_windows;
  j["skipped_windows_reference"] = r.reference.skipped_windows;
  j["reference_compared"] = r.reference_compared;
  j["loss_scales_unmanaged"] = r.unmanaged.loss_scales;
  j["lr_initial"] = r.unmanaged.lr_initial;
  j["lrs_unmanaged"] = r.unmanaged.lrs;
  j["lrs_managed"] = r.managed.lrs;
  j["lrs_reference"] = r.reference.lrs;
  j["model"] = s.model;
  j["backwards"] = s.backwards;
  j["scaling"] = to_string(s.scaling);
  j["seed"] = s.seed;
  j["bitwise_equal"] = r.bitwise_equal;
  j["max_abs_diff"] = r.max_abs_diff;
  j["ref_max_rel_diff"] = r.ref_max_rel_diff;
  j["ref_rel_l2_diff"] = r.ref_rel_l2_diff;
  j["ref_tolerance"] = reference_tolerance(s.dtype);
  j["ref_grad_norm_rel_diff"] = r.ref_grad_norm_rel_diff;
  j["grad_norms_unmanaged"] = r.unmanaged.grad_norms;
  if (!r.unmanaged.virtual_step_s.empty()) {
    j["virtual_step_s_unmanaged"] = r.unmanaged.virtual_step_s;
    j["virtual_step_s_managed"] = r.managed.virtual_step_s;
    j["exposed_comm_s_unmanaged"] = r.unmanaged.exposed_comm_s;
    j["bytes_by_collective_unmanaged"] = r.unmanaged.bytes_by_collective;
  }
  j["comm_bytes_managed"] = r.managed.comm_bytes;
  j["comm_bytes_unmanaged"] = r.unmanaged.comm_bytes;
  j["backward_comm_bytes_managed"] = r.managed.backward_comm_bytes;
  j["backward_comm_bytes_unmanaged"] = r.unmanaged.backward_comm_bytes;
  j["forward_comm_bytes_unmanaged"] = r.unmanaged.forward_comm_bytes;
  j["step_comm_bytes_unmanaged"] = r.unmanaged.step_comm_bytes;
  j["memory_rest_bytes"] = r.unmanaged.memory_rest_bytes;
  j["memory_peak_bytes"] = r.unmanaged.memory_peak_bytes;
  if (r.memory_planned) j["memory_plan_bytes"] = r.memory_plan_bytes;
  j["memory_rest_by_window_unmanaged"] = r.unmanaged.memory_rest_by_window;
  j["memory_rest_by_window_managed"] = r.managed.memory_rest_by_window;
  j["global_samples"] = r.unmanaged.global_samples;
  j["expected_global_samples"] = r.expected_global_samples;
  j["steps_applied"] = r.unmanaged.steps_applied;
  j["param_digest_unmanaged"] = r.unmanaged.digest;
  j["param_digest_managed"] = r.managed.digest;
  j["param_digest_reference"] = r.reference.digest;
  j["losses_unmanaged"] = r.unmanaged.losses;
  j["losses_managed"] = r.managed.losses;
  j["ignored_keys"] = r.ignored_keys;
  j["ok"] = r.ok;
  j["failures"] = r.failures;
  return j.dump();
}

}  // namespace zerostep
