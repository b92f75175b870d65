// Parity scenarios: the question zerostep exists to answer, as a function.
//
// run_scenario() trains the same model from the same initial state on the
// same data three ways on the simulator and compares them:
//   unmanaged  managed_gradient_accumulation = false: N_k backward() calls,
//              then one step(), for each window k;
//   managed    the twin with the same config but managed = true: step()
//              after every backward(). For a constant N the configured
//              gradient_accumulation_steps (= N) drives the boundary; for a
//              varying N, set_gradient_accumulation_boundary(true) on the
//              last backward of each window;
//   reference  one rank, one backward() per window over all W·N_k·mb
//              samples of the window, with the loss multiplied so that it
//              equals what the scaling mode asks of the distributed runs
//              (configured: N_k/GAS, per_step_count: 1, none: N_k).
//
// Note [Parity claims under mixed precision]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// unmanaged vs managed stays BITWISE in bf16 and fp16: both modes round the
// same gradients at the same points. Against the reference the distance is
// bounded by the format instead: bf16's 8-bit mantissa (relative rounding
// 2^-9) enters every weight and activation of the forward pass, fp16's
// 11-bit mantissa (2^-12) every stored gradient; over a few Adam steps
// these gave relative L2 distances up to 1.6e-3 (bf16) and 5.4e-4 (fp16)
// on the built-in models (harness seeds 1-8, worlds 1-4, stages 0-3; fp16
// is largest where scaled gradients fall into fp16's subnormal range and
// Adam normalises them), checked against kReferenceToleranceBf16 = 1e-2 and
// kReferenceToleranceFp16 = 2e-3; a lost micro-batch or a wrong scale
// moves them by orders of magnitude more. The loss-scale trajectory and the set
// of skipped steps must agree exactly across all three runs.
//
// Note [Overflows nobody injected]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A user's fp16 section may start the dynamic loss scale high (DeepSpeed's
// default is 2^16; files use up to 2^32), so the first windows overflow
// and are skipped until the scale backs off: DeepSpeed's behaviour, not a
// fault. Whether a window overflows depends on the size of the gradients
// in fp16, and those differ between the distributed runs (one backward per
// micro-batch of mb samples: a mean over few samples) and the reference
// (one backward over the whole window), so the reference may skip other
// windows, or none. When any run skips a window that was not injected,
// unmanaged and managed must still agree exactly (the same skipped
// windows, loss scales, lr, norms and bits; the injected window among the
// skipped ones), and each run's lr must not move across any window it
// skipped; the comparisons with the reference are not made, and the
// result says so (reference_compared = false). Only where the scenario
// allows it (natural_overflow_ok: a user's file): with the built-in fp16
// section (scale 2^8) every skip must be an injected one, or a bug that
// skipped windows could pass as an overflow.
//
// Note [Parity claims]
// ~~~~~~~~~~~~~~~~~~~~
// unmanaged vs managed: BITWISE. Both modes accumulate the same backward
// results into the same buffer in the same order, issue the same
// collectives (sim reduces in a fixed rank order, Note [Reduction order]),
// and scale at the same points (the configured loss division in backward,
// the per_step_count division in step), so no floating-point operation
// differs. This holds for every scaling mode, every N sequence and every
// stage (stage 2 reduces in every backward in both modes), with or without
// overlap_comm (which changes when a bucket is sent, not what is summed),
// and with reduce_once_per_step on in both (each backward accumulates the
// full gradient locally in the same order, and the one reduction per
// window runs on the same sums; on against off is not bitwise: the sums
// over backwards and over ranks are taken in the other order, so that
// pair agrees only within the reference TOLERANCE, which the reference
// check covers). With the option on, the unmanaged run must also send no
// reduce-scatter during backward.
// across stages: stage 1 equals stage 0 BITWISE (each element is reduced
// the same way); stage 2 sums over ranks per backward before summing over
// backwards, so it agrees with stages 0/1 within the TOLERANCE below.
// distributed vs reference: TOLERANCE. The reference sums the samples in
// one batched reduction inside autograd instead of W·N partial means, so
// the float results differ in rounding. Adam normalises each element's
// update by its own gradient history, so for an element whose gradient is
// near zero (|g| ~ eps) rounding noise can move it by up to ~lr per step:
// about 1% of random scenarios have one such element, off by ~1e-4 of
// max|p| while the rest agree to ~1e-7 (seen with
// --stages=0 --world=2 --backwards=2,6,5 --scaling=none --micro-batch=1
// --seed=63872; relative L2 1.2e-5 there, against ~1e-7 typically). A
// per-element bound would flag those runs, so the check is
// on the relative L2 distance, ||p_dist − p_ref||₂ / ||p_ref||₂ <=
// kReferenceTolerance, which a real error (a wrong scale, a lost micro-batch,
// a stale partition) exceeds by orders of magnitude. The per-element
// max|p_dist − p_ref| / max|p_ref| is reported too (ref_max_rel_diff).
// Adam is nearly invariant to the scale of the gradient, so a wrong scaling
// factor barely shows against the reference under Adam; scenario_test
// therefore also runs the reference check with SGD, where it would.
//
// Thread safety: run_scenario is reentrant; it uses torch's global seed
// while building models (from the calling thread only).
#ifndef ZEROSTEP_PARITY_SCENARIO_H_
#define ZEROSTEP_PARITY_SCENARIO_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "models/task.h"

namespace zerostep {

inline constexpr double kReferenceTolerance = 1e-4;
// Mixed precision rounds every stored gradient (and, in bf16, the weights
// the forward pass uses and every activation), in different places for the
// distributed runs (per micro-batch) and the reference (per window), so
// the reference agrees only to the formats' precision: Note [Parity claims
// under mixed precision].
inline constexpr double kReferenceToleranceBf16 = 1e-2;
inline constexpr double kReferenceToleranceFp16 = 2e-3;
// The reference tolerance for a training dtype.
double reference_tolerance(Precision dtype);
// The loss of the micro-batch an overflow is injected into is multiplied by
// this: its gradient exceeds fp16's range at any loss scale >= 1.
inline constexpr double kOverflowLossFactor = 1e30;

// Note [Overflow in one element]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A whole-loss overflow (kLoss) makes every gradient element of every rank
// inf after the reduction, so a rank that decided "overflow" from its own
// gradient partition alone would still agree with the others. kElement
// sets one gradient element to +inf instead: element 0 of the first
// trainable parameter (Engine::parameters().front(), canonical index 0), on
// the injecting rank only, by a tensor hook on that parameter registered
// just before the chosen backward and removed after it. Tensor hooks run
// inside AccumulateGrad, before the gradient is accumulated and before the
// engine's post-hooks (engine/param_binding.cc), so the inf reaches the
// stage's buffers at every stage. Why that element: at stages 1-3 rank 0
// alone owns it (stage 1: partition 0 starts at flat offset 0; stage 2:
// rank 0's chunk of bucket 0; stage 3: the parameter is the first of its
// group, whose partition 0 is rank 0's), so with world >= 2 every other
// rank's own partition stays finite: only the global agreement (the norm
// over all partitions, Engine::step) makes them skip. With an injecting
// rank other than 0, the rank that sees the inf before the reduction is
// not the one that owns it, so a decision from each rank's unreduced
// gradient would split the ranks too. The reference run sets the same
// element of its one backward in that window to +inf, so it skips too.
enum class OverflowKind {
  kLoss,     // the micro-batch's loss times kOverflowLossFactor
  kElement,  // one gradient element on one rank: Note [Overflow in one element]
};
// "loss" or "element" (the harness's --overflow=W:R:B[:KIND] spelling).
const char* to_string(OverflowKind k);

// The optimizer a scenario trains with when its base config has none:
// AdamW with this lr and weight decay (DeepSpeed's betas and eps).
inline constexpr double kScenarioLr = 1e-3;
inline constexpr double kScenarioWeightDecay = 0.01;

struct Scenario {
  int stage = 0;
  int world_size = 1;
  std::vector<int> backwards = {4};  // N per window; one entry per step
  GradAccumScaling scaling = GradAccumScaling::kConfigured;
  std::string model = "mlp";
  // "sim" (the deterministic simulator) or "gloo" (real Gloo collectives
  // over loopback TCP, one thread per rank).
  std::string backend = "sim";
  int model_scale = 1;
  uint64_t seed = 1;
  int64_t micro_batch = 2;
  // gradient_clipping: >= 0 is written into the config (0 = off); < 0
  // keeps the base config's (off when it has none).
  double gradient_clipping = -1.0;
  // zero_optimization keys (0 = the config's value or DeepSpeed's default).
  // Stage 2; stage 3 (Note [Stage 3 reduce-scatter in flight]); stage 0
  // in managed mode.
  bool overlap_comm = false;
  // zero_optimization.reduce_once_per_step (stages 2/3; Note [Reduce once
  // per step] in zero/stage.h). Both the unmanaged and the managed run use
  // it, so the bitwise claim compares the option on against on: against
  // off the sums are formed in another order (Note [Parity claims]).
  bool reduce_once_per_step = false;
  // zero_optimization.gather_once_per_step (stage 3; Note [Stage 3 gather
  // once per step] in zero/stage3.h), in both runs. The unmanaged run is
  // trained again without it: the same bits, fewer all-gathered bytes when
  // a window has several backward calls (ScenarioResult).
  bool gather_once_per_step = false;
  int64_t reduce_bucket_size = 0;
  int64_t allgather_bucket_size = 0;
  // Stage 3: stage3_param_persistence_threshold; < 0 keeps the config's (or
  // DeepSpeed's default 1e5, which leaves the small built-in models whole:
  // use 0 to partition every block).
  int64_t persistence_threshold = -1;
  // Training dtype. bf16 / fp16 enable that section of the config (the
  // built-in fp16 section: dynamic scaling from 2^8, loss_scale_window 2,
  // hysteresis 2, so short runs see the scale move).
  Precision dtype = Precision::kFp32;
  // fp16 only: inject an overflow into backward `overflow_backward`
  // (0-based) of rank `overflow_rank` in window `overflow_window` (-1 =
  // none). kLoss (the default) multiplies that micro-batch's loss by
  // kOverflowLossFactor, and the reference multiplies that whole window;
  // kElement makes one gradient element +inf on that rank and in the
  // reference's window (Note [Overflow in one element]). Every run must
  // skip exactly that window's update.
  int overflow_window = -1;
  int overflow_rank = 0;
  int overflow_backward = 0;
  OverflowKind overflow_kind = OverflowKind::kLoss;
  // Accept fp16 windows skipped without an injected overflow (Note
  // [Overflows nobody injected]): the harness sets it for a --config
  // file's own dynamic loss scale. False: such a skip is a failure.
  bool natural_overflow_ok = false;
  // zero_optimization.offload_optimizer.device (stages 1-3) and, at stage
  // 3, offload_param.device. "nvme" needs nvme_path (an existing
  // directory; each run uses its own files in it). sub_group_size > 0 sets
  // zero_optimization.sub_group_size (elements per swap sub-group).
  OffloadDevice offload = OffloadDevice::kNone;
  OffloadDevice offload_param = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t sub_group_size = 0;
  // A user's ds_config JSON to start from ("" = built-in defaults). The
  // scenario overrides the batch keys, the stage, the accumulation mode,
  // the scaling, the dtype (fp16 / bf16 / bfloat16 sections enabled or
  // disabled, their other keys kept) and the offload devices (sections the
  // scenario turns off are removed, nvme_path replaced), and at stages 0-1
  // it drops overlap_comm (which unmanaged mode refuses there); everything
  // else (optimizer, clipping, scheduler, ...) is kept.
  std::string base_config_json;
  // The trainer's values that fill the base config's "auto" (Note [Trainer
  // values] in config/trainer_values.h); the harness gives its flags'
  // (tools/harness.cc), with must_match false (the scenario replaces the
  // batch keys, the stage, the dtype, ...). Default: none.
  TrainerValues trainer;
  // Where the ranks' models and data live: "cpu" or "cuda" (device 0, every
  // rank). On cuda the engine keeps the ZeRO state on the device (Note
  // [Device kernels] in zero/kernels.h, Note [Stage 3 on a device] in
  // zero/stage3.h), or on the host with ZeRO-Offload at stages 1-2 (Note
  // [ZeRO-Offload] in engine/flat_binding.h; stage 3: Note [Stage 3
  // offload from a device] in zero/stage3.h); device_problem refuses what
  // cannot run (overlap_comm at stage 2 with several ranks). Several ranks
  // at stage 3 run its collectives outside backward (Note [Stage 3
  // collectives outside backward] in zero/stage3.h). The reference run is
  // on the CPU (a cross-device check, within the tolerance), and an
  // offload run's no-offload twin is not run
  // (ScenarioResult::offload_compared).
  std::string device = "cpu";
  // On the CPU: "host" (host_kernels()) or "torch" (a CPU TorchKernels
  // posing as a device's: the engine's device path, Note [Device kernels]
  // in zero/kernels.h, with its collectives staged). device_problem
  // refuses "torch" with offload at stages 1-2.
  std::string kernels = "host";
  // Stage 3: EngineOptions::stage3_collectives_outside_backward (Note
  // [Stage 3 collectives outside backward] in zero/stage3.h). run_scenario
  // turns it on for several ranks on cuda; true runs it anywhere (tests).
  bool stage3_collectives_outside_backward = false;
};

struct RunDigest {
  std::vector<float> params;  // rank 0's final flat parameters
  bool replicas_identical = false;
  uint64_t comm_bytes = 0;           // rank 0, all phases
  uint64_t backward_comm_bytes = 0;  // rank 0, during backward()
  uint64_t forward_comm_bytes = 0;   // rank 0, stage 3's forward gathers
  uint64_t step_comm_bytes = 0;      // rank 0, during step()
  // rank 0's reduce-scatter payload bytes labelled backward.
  uint64_t backward_reduce_scatter_bytes = 0;
  int64_t global_samples = 0;
  int64_t steps_applied = 0;
  int64_t skipped_steps = 0;
  std::vector<double> loss_scales;  // rank 0's, after each window's step
  // The windows (0-based) whose update rank 0 skipped (fp16 overflow).
  std::vector<int> skipped_windows;
  // rank 0's Engine::get_lr() before the first window and after each
  // window's step: the rate of the next applied update, which a skipped
  // window must not move (Note [DeepSpeed's step index] in
  // engine/lr_schedule.h).
  double lr_initial = 0.0;
  std::vector<double> lrs;
  // rank 0's get_global_grad_norm() after each window's step (a skipped
  // window repeats the previous value).
  std::vector<double> grad_norms;
  // sim backend: rank 0's virtual time per window (compute modelled from
  // FLOPs, collectives from the cost model: sim/cost_model.h), the
  // communication time compute waited for, and bytes per collective kind.
  std::vector<double> virtual_step_s;
  double exposed_comm_s = 0.0;
  std::map<std::string, uint64_t> bytes_by_collective;
  std::vector<double> losses;  // mean over ranks of each window's mean loss
  std::string digest;          // FNV-1a 64 of params' bytes, hex
  // Rank 0's params + grads + optimizer bytes after the last step, and the
  // peak during the run (Engine::memory()).
  size_t memory_rest_bytes = 0;
  size_t memory_peak_bytes = 0;
  // The same rest bytes after each window's step, on every rank
  // ([window][rank]); they must not change from window to window
  // (rest_memory_failures()).
  std::vector<std::vector<size_t>> memory_rest_by_window;
};

struct ScenarioResult {
  Scenario scenario;
  RunDigest unmanaged;
  RunDigest managed;
  RunDigest reference;
  bool bitwise_equal = false;
  // With offload: the unmanaged run trained again without offload; the
  // offload runs must give its bits (the same kernel on the same values,
  // only the state's home differs).
  RunDigest in_memory;
  bool offload_bitwise_equal = true;
  // Whether that twin ran: not on cuda, where a run without offload needs
  // the engine on the device (offload_bitwise_equal is then unchecked).
  bool offload_compared = false;
  // With gather_once_per_step: the unmanaged run trained again without it,
  // which must give its bits and all-gather more bytes (windows of several
  // backward calls).
  RunDigest gathered_every_use;
  bool gather_once_bitwise_equal = true;
  bool gather_once_compared = false;
  double max_abs_diff = 0.0;
  double ref_max_rel_diff = 0.0;  // max|d| / max|p_ref|, informative
  double ref_rel_l2_diff = 0.0;   // ||d||₂ / ||p_ref||₂, the checked one
  // max over windows of |norm − norm_ref| / norm_ref: the global gradient
  // norm (before clipping) against the reference's, checked against the
  // same tolerance.
  double ref_grad_norm_rel_diff = 0.0;
  int64_t expected_global_samples = 0;
  // The scenario config's ds_config keys accepted without effect
  // (Config::ignored_keys).
  std::vector<std::string> ignored_keys;
  // False when an fp16 run skipped a window nobody injected an overflow
  // into (a user's loss scale starting high): Note [Overflows nobody
  // injected]. The reference checks are then not made.
  bool reference_compared = true;
  // Note [Memory plan] (zero/schedule.h): what memory_plan() plans for the
  // scenario's rank (rest = peak), when it plans it (on sim, without
  // offload): run_scenario fails a run whose memory at rest or peak
  // exceeds it.
  bool memory_planned = false;
  size_t memory_plan_bytes = 0;
  bool ok = false;
  std::vector<std::string> failures;  // why not ok, one line each
};

// Why the scenario cannot run on its device ("" when it can): an unknown
// device or kernels, kernels "torch" with offload at stages 1-2, or cuda
// with overlap_comm at stage 2 and several ranks: a rank would wait in a
// collective inside its backward, and the ranks share one autograd thread
// for the device, so they would hang.
std::string device_problem(const Scenario& s);

// Throws ConfigError if the scenario's config is invalid, UsageError for a
// bad scenario (e.g. an empty N list, device_problem()).
ScenarioResult run_scenario(const Scenario& scenario);

// Two of run_scenario()'s checks, over a result's digests: one failure line
// per broken rule, none when they hold (exposed so that tests can show that
// each fails on digests that break it).
//
// lr_failures: in each run, the lr after the skipped window equals the lr
// before it (the previous window's, or lr_initial for window 0): a skipped
// update does not advance the schedule; and the three runs' lr
// trajectories are equal (one advance per applied update in each).
std::vector<std::string> lr_failures(const ScenarioResult& r);
// rest_memory_failures: in each run, every rank holds the same params +
// grads + optimizer bytes after every window's step as after the first
// (memory_rest_by_window).
std::vector<std::string> rest_memory_failures(const ScenarioResult& r);

// The config a scenario runs with (exposed for tests and tools).
Config scenario_config(const Scenario& s, bool managed);

std::string fnv1a_hex(const void* data, size_t bytes);

// The tools/harness flags that run `s` again (" --stages=... --seed=...",
// with a leading space): replay lines of property tests and fault runs.
// A base_config_json is shown inline, as "--config=<a file holding: ...>"
// (cut to 2000 bytes).
std::string harness_flags(const Scenario& s);

// One JSON object on one line: the harness's --json record.
std::string to_json_line(const ScenarioResult& r);

}  // namespace zerostep

#endif  // ZEROSTEP_PARITY_SCENARIO_H_
