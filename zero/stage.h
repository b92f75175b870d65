// Stage: one ZeRO stage's data movement and update over flat buffers.
//
// The Engine owns the flat parameter and gradient buffers (LibTorch tensors
// whose storage the model's parameters and .grad views alias) and drives a
// Stage through the window protocol below; the Stage decides which
// collectives run and which part of the buffers this rank updates. Stages
// never count micro-steps: AccumulationBoundary (engine/boundary.h) decides
// when each call happens (Note [Boundary semantics]).
//
//   begin_backward(k, s)    before the autograd pass of the window's k-th
//                           backward (stages 2/3: agree on k, s, if the
//                           backward communicates: Note [Window
//                           agreement]).
//   begin_boundary_backward(n, s)  managed mode, before the autograd pass of
//                           the window's last backward, which ends in
//                           reduce_window (stage 0 with overlap_comm: agree
//                           now and reduce buckets during autograd).
//   on_grad_ready(i)        during autograd, once parameter i's gradient of
//                           this backward is complete (stage 2 with
//                           overlap_comm: launch the buckets it completes).
//   end_backward()          after the autograd pass (stage 2: reduce-scatter
//                           every bucket into the rank's accumulated
//                           partition, clear the full gradient).
//   reduce_window(n, s, p)  once per window: agree on n and s, then reduce
//                           (stage 0: all-reduce; stage 1: reduce-scatter;
//                           stage 2: nothing left to reduce).
//   finalize(divisor, clip) inside step(): divide the reduced gradient,
//                           compute the global norm, clip.
//   apply_update(hyper)     the optimizer on this rank's part, then (stages
//                           1/2) all-gather of the updated parameters;
//                           all or nothing (Note [Transactional update]).
//   zero_grad()             clear the window's gradients.
//
// Note [Window agreement]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Before the first gradient collective of a backward (stages 2/3) and of a
// step, every rank all-gathers (event, count, global step): event is
// "backward number k of the window" or "step after n backwards". Ranks that
// disagree (one runs an extra backward while another steps) meet in the same
// small all-gather, all see the disagreement and raise the same UsageError
// before any gradient of that call is reduced: nothing is updated and
// nothing hangs, on any backend. Both accumulation modes issue the same
// agreements, so managed and unmanaged runs move the same bytes.
// A backward that issues no collective skips its agreement: stage 2 with
// reduce_once_per_step, and stage 3 with it when every block group is
// gathered as the backward begins (kept from its forward by the reuse
// distance or by gather_once_per_step: nothing is gathered, prefetched or
// reduced before the window's reduce). Nothing it does can meet another
// rank's collective, so a rank that runs one backward too many meets the
// others in the step's agreement (managed mode: the boundary backward's),
// still before anything is reduced. An agreement there would only make
// every rank wait for the slowest at every backward.
//
// Note [Reduce once per step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// By default stages 2/3 reduce-scatter every backward's gradient into the
// rank's partition, so only the partition accumulates over the window
// (DeepSpeed's semantics). With reduce_once_per_step (Stage2Options,
// Stage3Options; zero_optimization.reduce_once_per_step) every backward
// accumulates locally into the full, unsharded gradient (stage 2: the flat
// gradient buffer, which stage 2 holds anyway; stage 3: one full
// gradient storage per group, kept from the group's first backward on), and
// reduce_window() reduce-scatters it once per window, sums it into the
// partition and clears it. The engine cannot know, in unmanaged mode,
// which backward is the last before step(), so the reduction is always in
// reduce_window(): in step() (unmanaged) or at the end of the boundary
// backward (managed). Both modes therefore run the same additions in the
// same order and the same collectives: still bitwise equal. Against the
// default the sum over backwards comes before the sum over ranks, so the
// results differ in rounding (within the reference tolerance, not
// bitwise). Costs: 1/N of the reduce-scatter traffic for N backwards;
// stage 3 holds every group's full gradient (4 bytes per parameter) for
// the rest of the run, and a reduce scratch of its whole partition instead
// of the largest group's chunk (4 bytes per owned element: every group's
// reduce-scatter is in flight at once, the latencies overlapping).
// overlap_comm: stage 2 in managed mode launches the boundary backward's
// buckets from inside its autograd pass (the same buckets, the same bits:
// zero/stage2.h); unmanaged mode has no backward to overlap (the key is listed
// as not acted on), and stage 3 reduces its groups in order after the boundary
// backward either way. A backward that communicates nothing skips its window
// agreement (Note [Window agreement]); a rank that runs an extra backward is
// still caught, by the step's agreement, before anything is reduced.
//
// Note [Transactional update]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// apply_update() changes the parameters and the optimizer state (moments,
// step count) on every rank, or, if it throws (a collective failed:
// CommError), leaves both exactly as they were before the call. What each
// stage does, and what it costs:
//   stage 0   nothing: the update is local and is the last thing
//             apply_update does, so nothing can fail after it has begun.
//   stages 1-3  the moments are not copied: the update computes the new
//             parameters reading the moments without writing them, and
//             only once the all-gather has succeeded does
//             FlatOptimizer::commit() write the new moments in place, by
//             the same update again over the same inputs (bitwise the
//             values the first pass computed: Note [Moments written at
//             commit] in zero/optimizer.h); a failure restores the step
//             count and nothing else needs undoing. Cost: a scratch of
//             one 256K-element chunk per state array (2 MB for Adam) and
//             a second pass over the moments per step.
//   stages 1, 2  the updated owned parameters are written, from the
//             parameters, into the full gradient buffer, which holds
//             nothing once the window's gradients are reduced into the
//             owned partition; the all-gather runs there, in place, and
//             only after it has succeeded does the buffer become the
//             parameters (a failed collective may leave its output
//             undefined, so it never writes the parameters): the Engine's
//             binding trades the two buffers' memory
//             (FlatBuffers::exchange), so the gradient buffer now holds
//             the old parameters, which zero_grad() clears; a caller of
//             make_stage() without an exchange gets a copy of the
//             parameter buffer. Cost: nothing beyond the scratch. This
//             holds for stage 2 only where it keeps the full gradient
//             buffer (reduce_once_per_step, collectives outside
//             backward).
//   stage 2 without a full gradient (Note [Stage 2 buckets]), and stages
//             1-2 under bf16's partitioned master (Note [Partitioned
//             master]): there is no full buffer to stage the all-gather
//             in, so the owned chunks (or the owned master) are copied (4
//             bytes per owned element), the update reads the copy and
//             writes the chunks in place, and each bucket is all-gathered
//             into the model's replica (stage 1's partitioned master
//             stages in the full gradient buffer instead: no copy). A
//             failure restores the owned chunks: the rank's
//             partition, which is what checkpoints save, is as it was; the
//             replica's chunks owned by other ranks may hold the new values
//             of the buckets gathered before the failure (keeping them
//             whole would cost the full replica again, 4 bytes per
//             parameter, which is what stage 2 saves). The Engine refuses
//             backward() and step() afterwards; load_checkpoint() makes the
//             replica whole again.
//   stage 3   the persistent groups' new partitions go to a spare (4
//             bytes per persistent owned element) and are all-gathered
//             into their gradient storage (reduced and zeroed by then);
//             the block groups' new partitions are written in place by
//             commit(), with the moments, once that all-gather has
//             succeeded (they are gathered when next used); on success the
//             spare is copied into the persistent partitions. With
//             gather_once_per_step every block group is gathered in the
//             step too, so the spare holds the whole partition (4 bytes
//             per owned element). Cost: the spare and the scratch.
//             With the partitions on NVMe (Note [NVMe parameter
//             partitions] in zero/stage3.h) the store keeps the old
//             partitions until its commit, after the all-gather (and the
//             moments' commit reads them back from it first).
//   Until issue 46 the moments were kept in a second bank (8 bytes per
//   owned element for Adam), which flipped back on failure: stage 1 at
//   two ranks then held more than stage 0.
// MemoryStats::rollback_bytes reports the copies. reduce_window() and
// finalize() change no parameter and no optimizer state, so a failure there
// needs no undo. After any failed call the window's gradients are
// undefined: a CommError means a peer or the network failed, and the run
// continues in a new world from a checkpoint (the Engine refuses further
// calls; engine/engine.h).
// With the optimizer state offloaded to NVMe (zero/optimizer.h Note [NVMe
// optimizer state]) the moments are not copied: the swap store keeps the
// old ones and the step only prepares the new ones, committed after the
// all-gather (restore() discards them). Its device can fail on one rank
// alone, so the ranks first agree that every optimizer step succeeded
// (internal::step_and_agree, one all-gather of 8 bytes per rank) and only
// then gather: a device error is IoError on its rank and CommError naming
// it on the others, with nothing applied anywhere.
//
// Ownership: `comm` and the buffers must outlive the Stage.
// Thread safety: none; one Stage per rank.
#ifndef ZEROSTEP_ZERO_STAGE_H_
#define ZEROSTEP_ZERO_STAGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <variant>
#include <vector>

#include "comm/communicator.h"
#include "common/zero_defaults.h"
#include "precision/precision.h"
#include "zero/averaging.h"
#include "zero/flat_layout.h"
#include "zero/kernels.h"
#include "zero/optimizer.h"
#include "zero/phase.h"

namespace zerostep {

// Where stage 3 keeps this rank's fp32 parameter partitions (Note [NVMe
// parameter partitions] in zero/stage3.h); in memory by default.
struct ParamSwap {
  // nullptr: in memory. Otherwise the device holding the partitions
  // (offload_param.device = "nvme"); it must outlive the stage and is used
  // by it alone.
  BlockDevice* device = nullptr;
  // Elements per sub-group of the store (zero_optimization.sub_group_size),
  // >= 1; capped at the largest group's partition so that the store's
  // buffers stay the size of one group.
  size_t sub_group_numel = size_t{1} << 22;
  // offload_param.buffer_count: the store's sub-group buffers (>= 2).
  size_t buffer_count = 5;
};

// The options only stage 0 takes (Note [Stage 0 buckets] in zero/stage0.h).
struct Stage0Options {
  // Elements per all-reduce bucket (zero_optimization.reduce_bucket_size).
  int64_t reduce_bucket_size = zero_defaults::kBucketElements;
  // Managed mode: the boundary backward's buckets are all-reduced during
  // its autograd pass.
  bool overlap_comm = false;
};

// The options only stage 1 takes.
struct Stage1Options {
  // Elements per reduce-scatter bucket, all ranks' chunks together
  // (zero_optimization.reduce_bucket_size; Note [Stage 1 reduce buckets]
  // in zero/stage1.h).
  int64_t reduce_bucket_size = zero_defaults::kBucketElements;
  // The model computes with bf16 weights of its own and no
  // offload_optimizer moves the master elsewhere, so the float32 master is
  // partitioned (Note [Partitioned master]).
  bool bf16_weights = false;
};

// The options only stage 2 takes (Note [Stage 2 buckets] in zero/stage2.h).
struct Stage2Options {
  // Elements per reduce-scatter bucket (all ranks' chunks together: the
  // bucket pool's slot size) and per all-gather
  // (zero_optimization.reduce_bucket_size, allgather_bucket_size).
  int64_t reduce_bucket_size = zero_defaults::kBucketElements;
  int64_t allgather_bucket_size = zero_defaults::kBucketElements;
  // Reduce buckets asynchronously during autograd.
  bool overlap_comm = false;
  // The format of the partition gradient accumulated over the window
  // (data_types.grad_accum_dtype; Note [Precision model]).
  Precision grad_accum = Precision::kFp32;
  // As Stage1Options::bf16_weights (Note [Partitioned master]).
  bool bf16_weights = false;
  // zero_optimization.reduce_once_per_step (Note [Reduce once per step]).
  bool reduce_once_per_step = false;
  // No collective inside backward, for ranks that share one autograd
  // thread: stage 2 then keeps the full gradient buffer and reduces it
  // after each backward (Note [Stage 2 buckets] in zero/stage2.h).
  bool collectives_outside_backward = false;
};

// The options only stage 3 takes (zero/stage3.h).
struct Stage3Options {
  // Elements of reduce-scatters in flight with overlap_comm (Note [Stage 3
  // reduce-scatter in flight] in zero/stage3.h).
  int64_t reduce_bucket_size = zero_defaults::kBucketElements;
  bool overlap_comm = false;
  // As Stage2Options::grad_accum.
  Precision grad_accum = Precision::kFp32;
  // zero_optimization.reduce_once_per_step (Note [Reduce once per step]).
  bool reduce_once_per_step = false;
  // zerostep's zero_optimization.gather_once_per_step (Note [Stage 3
  // gather once per step] in zero/stage3.h): a block group gathered once
  // stays gathered until the step or a load.
  bool gather_once_per_step = false;
  // No collective inside backward (Note [Stage 3 collectives outside
  // backward] in zero/stage3.h).
  bool collectives_outside_backward = false;
  // The largest group (padded elements) gathered ahead of its use (Note
  // [Stage 3 prefetch] in zero/stage3.h;
  // zero_optimization.stage3_prefetch_bucket_size); 0: none.
  size_t prefetch_numel = 0;
  // A block group stays gathered from its forward to its backward when
  // fewer than this many elements of other block groups run in between
  // (Note [Stage 3 reuse distance] in zero/stage3.h;
  // zero_optimization.stage3_max_reuse_distance); 0: released after every
  // forward.
  size_t reuse_distance_numel = 0;
  // A prefetch is issued only while the block groups gathered, with it,
  // hold at most this many elements
  // (zero_optimization.stage3_max_live_parameters).
  size_t max_live_numel = static_cast<size_t>(-1);
  // Where the parameter partitions live.
  ParamSwap param_swap;
  // The memory of the gathered groups (the GroupStorage's buffers) when it
  // is not StageOptions::kernels' (Note [Stage 3 offload from a device] in
  // zero/stage3.h: the partitions on the host, the groups on the model's
  // device); nullptr: StageOptions::kernels. Must outlive the stage.
  Kernels* group_kernels = nullptr;
};

// The stage and the options only it takes: the alternative's index is the
// stage number (stage_number()). A stage is handed its own alternative
// only, so it cannot be given an option it would ignore.
using PerStageOptions =
    std::variant<Stage0Options, Stage1Options, Stage2Options, Stage3Options>;

// What every stage takes, and the stage's own options.
struct StageOptions {
  // Which stage, with its own options; stage 0 by default.
  PerStageOptions per_stage;
  FlatLayout layout;
  OptimizerHyper optimizer;
  // prescale_gradients and gradient_predivide_factor: each rank's gradient
  // scaled before the sum, the sum after it, as DeepSpeed's code does at
  // this stage (Note [Gradient averaging] in zero/averaging.h); the
  // default sums and divides by the world size once.
  GradAveraging averaging;
  // Where the optimizer keeps its state (zero/optimizer.h Note [NVMe
  // optimizer state]); in memory by default.
  OptimizerSwap optimizer_swap;
  // The memory the stage's buffers are in and the kernels that work on it
  // (Note [Device kernels] in zero/kernels.h; stage 3: Note [Stage 3 on a
  // device] in zero/stage3.h); nullptr: host_kernels(). Must outlive the
  // stage.
  Kernels* kernels = nullptr;
};

// 0, 1, 2 or 3: the alternative options.per_stage holds.
inline int stage_number(const StageOptions& options) {
  return static_cast<int>(options.per_stage.index());
}

// Whether the stage takes each backward's gradient parameter by parameter,
// into reduce buckets, instead of from a full flat gradient buffer (Note
// [Stage 2 buckets] in zero/stage2.h): stage 2, unless reduce_once_per_step
// (which accumulates the full gradient by design) or
// collectives_outside_backward (no collective may run inside autograd) keep
// the full gradient. The one place this choice is made.
bool partitions_gradients(const StageOptions& options);

// Note [Partitioned master]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// At stages 1-2 under bf16 (without offload_optimizer) the float32 master
// weights are partitioned like the optimizer state: the ZeRO paper's K =
// 12 bytes per element (master and both moments) are held for the owned
// elements only, and the model's bf16 weights are the one full copy. The
// stage keeps the master of its owned spans, contiguous in optimizer
// order; its first values are the model's weights read back (exact: they
// are bf16 values). An update runs the optimizer on the owned master,
// all-gathers it (float32, as every collective here) and publishes each
// gathered range to the model's weights through the WeightsSink, rounded
// to bf16: the bits the model computes with are those of rounding a full
// master, as before the note. Stage 1 gathers into its full gradient
// buffer (free by then) and publishes only after the gather succeeded, so
// the update stays all or nothing; stage 2, which has no full buffer,
// gathers bucket by bucket in pieces of allgather_bucket_size through a
// staging buffer and publishes each piece as it arrives (Note
// [Transactional update]). Engine::flat_parameters() is then refused;
// full_parameters() all-gathers the master, as at stage 3.
bool partitions_master(const StageOptions& options);

// The model's own weights, for a stage whose master is partitioned (Note
// [Partitioned master]). Offsets and counts are in flat-buffer elements;
// `values` and `out` are in the stage kernels' memory.
class WeightsSink {
 public:
  virtual ~WeightsSink() = default;
  // The weights [offset, offset + n) := values, rounded to their format.
  virtual void publish(size_t offset, const float* values, size_t n) = 0;
  // out := the weights [offset, offset + n), widened to float32.
  virtual void read(size_t offset, float* out, size_t n) = 0;
};

// Views of the engine's flat buffers; each holds layout.padded_numel floats,
// in the memory of StageOptions::kernels.
struct FlatBuffers {
  // nullptr exactly when partitions_master(options): `weights` then.
  float* params = nullptr;
  // nullptr exactly when partitions_gradients(options): the stage then
  // takes gradients through ParamGradSink.
  float* grads = nullptr;
  // Optional (Note [Transactional update]): trades the memory behind the
  // two buffers, wherever else it is seen (the model's parameter tensors
  // view `params`): afterwards the memory at `grads` holds the parameters
  // and the memory at `params` is the gradients', and the stage swaps its
  // two pointers to match. Returns false, changing nothing, when the
  // owner cannot; the stage copies then.
  std::function<bool()> exchange;
  // Note [Partitioned master]: the model's weights, exactly when `params`
  // is nullptr.
  WeightsSink* weights = nullptr;
};

// A range of the flat buffers.
struct Span {
  size_t offset = 0;
  size_t numel = 0;
};

// Where part of one parameter's gradient goes: `numel` elements starting at
// the parameter's element `param_offset` (flattened), written to `dst`, in
// the stage's memory (StageOptions::kernels).
struct GradSlice {
  float* dst = nullptr;
  size_t param_offset = 0;
  size_t numel = 0;
};

// A stage that takes each backward's gradient parameter by parameter (Note
// [Stage 2 buckets] in zero/stage2.h), in place of on_grad_ready(): per
// backward, take_grad(i) for each parameter i whose gradient autograd has
// completed. Parameters without a gradient in a backward are left out:
// their elements stay zero.
class ParamGradSink {
 public:
  virtual ~ParamGradSink() = default;
  // For each bucket holding parameter i's elements, last bucket first:
  // `write` adds the parameter's elements [s.param_offset, s.param_offset +
  // s.numel) into s.dst, zeroed memory of the stage's kernels
  // (Kernels::accumulate: the fold of Note [Precision model]); then a
  // bucket that is complete is reduced. Called at most once per parameter
  // per backward, between Stage::begin_backward and Stage::end_backward.
  // May reduce, or wait for a reduction in flight to reuse its memory:
  // CommError when a collective fails.
  virtual void take_grad(size_t param_index,
                         const std::function<void(const GradSlice&)>& write) = 0;
};

// Where a piece of a rank's owned state sits in the canonical order: the
// trainable parameters concatenated in registration order, no padding
// (FlatLayout::numel elements). Checkpoints store state in this order, so
// any world size and stage can read them.
struct Segment {
  size_t state_offset = 0;      // into the owned state (optimizer order)
  size_t canonical_offset = 0;  // into the canonical parameter vector
  size_t numel = 0;
};

struct GradStats {
  double global_norm = 0.0;  // L2 norm over all ranks' gradients
  bool clipped = false;
};

// Bytes resident on this rank, by kind.
struct MemoryStats {
  size_t param_bytes = 0;
  size_t grad_bytes = 0;
  size_t optimizer_state_bytes = 0;
  // Copies kept to undo a failed update (Note [Transactional update]).
  size_t rollback_bytes = 0;
  // The most params + grads + optimizer bytes resident at once since
  // construction or Engine::reset_peak_memory() (stage 3, whose full
  // storages come and go); stages 0-2 allocate up front: the same as now.
  size_t peak_bytes = 0;
};

class Stage {
 public:
  virtual ~Stage() = default;

  virtual int stage() const = 0;
  // Throws UsageError (Note [Window agreement]) or CommError; nothing has
  // changed on error.
  virtual void begin_backward(int64_t backward_index, int64_t global_steps) = 0;
  // Managed mode: the backward about to run is the window's last (its
  // reduce_window(n, s, ...) follows it). Throws as begin_backward.
  virtual void begin_boundary_backward(int64_t window_backwards,
                                       int64_t global_steps) {
    (void)window_backwards;
    (void)global_steps;
  }
  virtual void on_grad_ready(size_t param_index) = 0;
  virtual void end_backward() = 0;
  // Whether on_grad_ready() does anything (the engine then installs hooks).
  virtual bool wants_grad_ready() const = 0;
  // `phase` (zero/phase.h) labels the reduce's collectives. Throws
  // UsageError (Note [Window agreement]) or CommError; the gradient buffers
  // are unchanged on error.
  virtual void reduce_window(int64_t window_backwards, int64_t global_steps,
                             const char* phase) = 0;
  // `divisor` >= 1 divides the reduced gradient (per_step_count scaling);
  // `clip` > 0 clips to that global L2 norm.
  virtual GradStats finalize(double divisor, double clip) = 0;
  // All or nothing (Note [Transactional update]): on CommError, parameters
  // and optimizer state are as before the call; gradients are undefined.
  virtual void apply_update(const OptimizerHyper& hyper) = 0;
  virtual void zero_grad() = 0;

  virtual const FlatOptimizer& optimizer() const = 0;
  // The flat-buffer ranges this rank's optimizer updates, in the order of
  // its state (stage 0: everything; stage 1: the rank's partition; stage 2:
  // the rank's chunk of every bucket).
  virtual const std::vector<Span>& owned_spans() const = 0;
  virtual MemoryStats memory() const = 0;

  // The owned state's pieces in canonical order (padding left out).
  virtual std::vector<Segment> owned_segments() const = 0;
  // The owned parameters, in optimizer-state order, in host memory.
  virtual std::vector<float> owned_parameters() const = 0;
  // Restores from canonical full vectors (numel elements each; the
  // moments may be empty when the optimizer keeps none): parameters
  // everywhere this rank holds them, optimizer state for its owned part.
  // Local: no collective. UsageError if the sizes do not fit (nothing
  // changes then).
  virtual void load_state(const std::vector<float>& params,
                          const std::vector<float>& exp_avg,
                          const std::vector<float>& exp_avg_sq,
                          int64_t optimizer_steps) = 0;
};

namespace internal {
// A collective's view of n floats at p in k's memory: marked as device
// memory when k's is not the host's (Note [Device kernels]).
inline Buffer buffer_in(const Kernels& k, float* p, size_t n) {
  Buffer b = Buffer::of(p, n);
  b.device = !k.host_addressable();
  return b;
}
}  // namespace internal

// What stages 0-2 share: the buffers, the communicator, and one optimizer
// over the spans of the flat buffer this rank updates, whose reduced
// gradient lives contiguously at `owned_grad`.
class FlatStage : public Stage {
 public:
  void begin_backward(int64_t, int64_t) override {}
  void on_grad_ready(size_t) override {}
  void end_backward() override {}
  bool wants_grad_ready() const override { return false; }
  // Divides the owned gradient, computes the global norm (an 8-byte
  // all-reduce when the owned spans are a partition), clips.
  GradStats finalize(double divisor, double clip) override;
  void zero_grad() override;
  const FlatOptimizer& optimizer() const override { return optimizer_; }
  const std::vector<Span>& owned_spans() const override { return owned_; }
  MemoryStats memory() const override;
  std::vector<Segment> owned_segments() const override;
  std::vector<float> owned_parameters() const override;
  void load_state(const std::vector<float>& params,
                  const std::vector<float>& exp_avg,
                  const std::vector<float>& exp_avg_sq,
                  int64_t optimizer_steps) override;
  // Note [Partitioned master]: whether the stage holds only its owned
  // master, and (a collective, every rank at the same point) the whole
  // master gathered into host `out` (padded_numel floats).
  bool master_partitioned() const { return weights_ != nullptr; }
  void gather_master(float* out);

 protected:
  // `stage`: the subclass's number (0, 1 or 2), which sets the gradient
  // averaging (zero/averaging.h); at stages 1/2 the owned spans are this
  // rank's share, reduced into a buffer of its own, at stage 0 the
  // replicated whole.
  FlatStage(const StageOptions& options, FlatBuffers buffers,
            Communicator* comm, int stage, std::vector<Span> owned);
  // finalize() of an owned gradient that holds the sum over the ranks
  // (stage 2): divided by `sum_divisor` (W) first, in the same pass; with
  // averaging_.scaled, multiplied by averaging_.after instead (Note
  // [Gradient averaging]).
  GradStats finalize_owned(double sum_divisor, double divisor, double clip);
  // A collective's view of n floats at p, one of this stage's buffers:
  // marked as device memory when the kernels' memory is not the host's.
  Buffer buffer(float* p, size_t n) const {
    return internal::buffer_in(k_, p, n);
  }
  // Points the owned gradient at its storage (the flat gradient buffer, or
  // a partition buffer the subclass owns).
  void set_owned_grad(float* owned_grad) { owned_grad_ = owned_grad; }
  // The optimizer on the owned spans of the parameters; the updated values
  // go to the same offsets of `target` (the parameters themselves, or a
  // staging buffer: Note [Transactional update]). `packed`: the owned
  // parameters read from there (optimizer order) instead of the spans.
  void update_owned(const OptimizerHyper& hyper, float* target,
                    const float* packed = nullptr);
  // Note [Transactional update] for stages 1/2: saves the optimizer state,
  // runs the update into the gradient buffer and `gather` (the all-gather
  // over that buffer), then copies it into the parameters; on any error
  // restores the optimizer state and rethrows.
  void staged_update(const OptimizerHyper& hyper,
                     const std::function<void(float* staged)>& gather);

  FlatLayout layout_;
  Kernels& k_;  // every buffer below is in its memory
  FlatBuffers buf_;
  Communicator* comm_;
  bool partitioned_;
  std::vector<Span> owned_;
  size_t owned_numel_;
  float* owned_grad_ = nullptr;
  FlatOptimizer optimizer_;
  // Note [Gradient averaging] for this stage: the subclasses scale each
  // reduction's input with it (scale_before_sum) and, when scaled, reduce
  // with kSum; finalize_owned scales the sum.
  AveragingSteps averaging_;
  // Stage 2 with several buckets and a swapped optimizer state: the owned
  // chunks gathered into one span for the update (in memory the optimizer
  // steps the chunks where they are).
  DeviceArray owned_params_;
  FlatOptimizer::Snapshot saved_;  // stages 1/2: to undo an update
  // Note [Partitioned master]: the model's weights, the owned master
  // (optimizer order) and, at stage 2, the staging its pieces are gathered
  // through (set by the subclass).
  WeightsSink* weights_ = nullptr;
  DeviceArray master_;
  // All-gathers `owned` (this rank's values, optimizer order) span by span
  // in pieces of at most `piece` elements per rank through `staging`
  // (piece x W floats, this stage's memory), handing each gathered range
  // to `put(flat offset, values, n)`.
  void gather_owned(const float* owned, size_t piece, float* staging,
                    const std::function<void(size_t, const float*, size_t)>&
                        put);
};

// Stages 0-2, as options.per_stage holds. Throws UsageError for stage 3
// (its Stage3 needs the storages the Engine's binding builds).
std::unique_ptr<Stage> make_stage(const StageOptions& options,
                                  FlatBuffers buffers, Communicator* comm);

namespace internal {
enum class WindowEvent : int64_t { kStep = 0, kBackward = 1 };
// Note [Window agreement]. `count` is the backward's number in the window
// (kBackward) or the window's backward count (kStep). Throws UsageError
// naming each rank's position.
// Runs `step` (the optimizer on this rank's state) and then, when
// `swapped` (its state is on a device that can fail on this rank alone),
// agrees with every rank on whether all steps succeeded before anything is
// published: one all-gather of an 8-byte flag. A rank whose step threw
// rethrows its error after the agreement; the others throw CommError
// naming the failed ranks. Without `swapped`, just runs `step`.
void step_and_agree(Communicator& comm, bool swapped,
                    const std::function<void()>& step);
void agree_on_window(Communicator& comm, WindowEvent event, int64_t count,
                     int64_t global_steps);

// Note [Reduce-scatter into the partition]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Stages 2 and 3 add every reduce-scatter's chunk into the rank's
// gradient partition (after each backward by default, once per window with
// reduce_once_per_step). Where the backend can add as it reduces
// (Communicator::reduce_scatter_accumulates(): sim, gloo) and the window
// accumulates in float32 (Kernels::accumulate's acc += g), the reduce-
// scatter goes straight into the partition with
// ReduceScatterOptions::accumulate: each element is the same fold of the
// ranks in rank order, then one float addition to the partition, so the
// bits are those of reducing into a scratch buffer and adding it
// (tools/harness's digests did not move). It saves the scratch buffer's
// write and read: about 100 MB of memory traffic per backward for the 26M
// model's 105 MB gradient at 2 ranks (docs/benchmarks.md as of fee84cc).
// Elsewhere (nccl, a device's staging, grad_accum_dtype bf16) the scratch
// stays.
bool reduces_into_partition(const Communicator& comm, Precision grad_accum);
// What every stage's finalize() does to the gradient it owns (`grad`, in
// k's memory): multiply by `after_sum` (Note [Gradient averaging]'s scaling
// of the sum; 1: none, and then `sum_divisor` is 1), divide by
// `sum_divisor` (W where the reduction summed over the ranks, else 1),
// then by `divisor`, compute the global L2 norm
// (all-reducing the squares over `partition_comm` when the gradient is a
// partition; nullptr when it is replicated), clip to `clip` (> 0). The norm
// is the one value a step needs on the host (Note [Device kernels]).
GradStats finalize_gradient(Kernels& k, Communicator* partition_comm,
                            float* grad, size_t n, double sum_divisor,
                            double divisor, double clip,
                            float after_sum = 1.0f);
// LibTorch's clip_grad_norm_ coefficient: max_norm / (norm + 1e-6), or 1.
float clip_coefficient(double norm, double max_norm);
}  // namespace internal

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE_H_
