// Schedule: the collectives (and the compute between them) that the stages
// and the Engine issue, as data, for a model given by its shape alone.
//
// Note [Shape-only schedule]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// The simulator's scale mode (scale/scale_sim.h) needs the collective
// sequence of a 7B-parameter model at thousands of ranks, in seconds. The
// stage classes cannot produce it there: they update, copy and clear
// full-size buffers (28 GB per buffer at 7B; stage 0 holds 112 GB of state
// per rank). This file states, per stage, which collectives one window of N
// backward() calls plus its step() issues, with which payload, dtype, phase
// and asynchrony, and where compute falls between them; it takes the
// partitioning from the same functions the stages use (FlatLayout,
// Note [Bucket-interleaved partition]'s make_buckets, Stage 3's group
// padding) and the stage 3 grouping rule (zero/grouping.h) the engine uses. It
// does not run the stage code; what keeps it equal to the stage code is
// parity/schedule_test.cc, which compares it entry for entry (kind, dtype,
// elements, phase, as a multiset per window) with the ledger of real
// training runs at every stage, in both modes, with and without
// overlap_comm and small buckets, for the built-in models at worlds 1-4,
// and planned_memory() with the stages' own MemoryStats.
//
// The schedule is that of zero_optimization.reduce_once_per_step off (the
// default); with it on (Note [Reduce once per step] in zero/stage.h) the
// reduce-scatters move from every backward to the window's reduce, which
// is not modelled here.
//
// Order within a backward (what the virtual clock sees):
//   stage 0/1  forward, backward (no collective; the boundary backward of
//              managed mode ends with the window's agreement and reduce;
//              stage 0's reduce is one asynchronous all-reduce per bucket,
//              and with overlap_comm the boundary backward agrees first and
//              launches them as stage 2 does: Note [Stage 0 buckets]);
//   stage 2    forward, agreement, backward; the buckets' reduce-scatters
//              are asynchronous: with overlap_comm each is launched as soon
//              as the backward has passed every parameter it holds (reverse
//              registration order), else all after the backward; then every
//              one is waited for, in launch order;
//   stage 3    per block group: all-gather (with gather_once_per_step
//              none: the step before gathered it; only a run's first
//              window gathers, in its first forward), then its forward;
//              agreement; per block group in reverse: all-gather (none
//              for a group kept by the reuse distance, nor with
//              gather_once_per_step), its backward, its
//              reduce-scatter; the persistent group's backward and
//              reduce-scatter last. All blocking (no prefetch: the
//              simulator does not overlap).
// step(): agreement (unmanaged; managed mode agrees in the boundary
// backward), the reduce (stages 0/1), the norm all-reduce (stages 1-3), the
// optimizer over the owned elements, the all-gathers (stages 1, 2; stage
// 3's persistent groups and, with gather_once_per_step, every block
// group's, in group order, asynchronous, all launched before the first is
// waited for; the simulator's all-gathers complete in the call).
//
// Thread safety: pure functions of their arguments.
#ifndef ZEROSTEP_ZERO_SCHEDULE_H_
#define ZEROSTEP_ZERO_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/ledger.h"
#include "common/zero_defaults.h"
#include "precision/precision.h"
#include "zero/grouping.h"
#include "zero/phase.h"
#include "zero/stage.h"
#include "zero/stage3.h"

namespace zerostep {

struct ScheduleOptions {
  int stage = 0;
  int world_size = 1;
  bool managed = false;
  int backwards = 1;  // backward() calls in the window
  // zero_optimization keys, with DeepSpeed's defaults.
  int64_t reduce_bucket_size = zero_defaults::kBucketElements;
  int64_t allgather_bucket_size = zero_defaults::kBucketElements;
  bool overlap_comm = false;
  int64_t persistence_threshold = zero_defaults::kPersistenceThreshold;
  // stage3_max_reuse_distance (Note [Stage 3 reuse distance] in
  // zero/stage3.h): a kept block group is not all-gathered again for its
  // backward, and the pool holds one parameter slot per kept group.
  int64_t max_reuse_distance = zero_defaults::kMaxReuseDistance;
  // zerostep's gather_once_per_step (Note [Stage 3 gather once per step] in
  // zero/stage3.h): a block group is all-gathered by the step, for the next
  // window, and the pool holds one parameter slot per block group.
  bool gather_once_per_step = false;
  // With gather_once_per_step: the window is a run's first (or the first
  // after a load), whose first forward gathers the block groups; later
  // windows find them gathered by the step before.
  bool first_window = false;
  // Optimizer state bytes per owned element (AdamW: 8).
  size_t optimizer_bytes_per_element = 8;
  // The training dtype (fp16 and bf16 with float32 master weights), for
  // memory_plan() and the setup broadcast (Note [Partitioned master] in
  // zero/stage.h). Without offload_optimizer.
  Precision dtype = Precision::kFp32;
  // zero_optimization.reduce_once_per_step, for memory_plan() only (Note
  // [Reduce once per step]; the collective schedule is not modelled).
  bool reduce_once_per_step = false;
};

// Note [Memory plan]
// ~~~~~~~~~~~~~~~~~~
// What a rank holds between windows, term by term, as Engine::memory()
// counts it (the stage's buffers and the binding's copies of the model's
// weights and gradients), for a model given by its shape: the ZeRO paper's
// model states (Rajbhandari et al. 2020, Table 1: weights, gradients and
// optimizer states, whose K bytes per element hold the float32 master under
// mixed precision) at the sizes zerostep holds them, and every other buffer
// by name (bucket pool, scratch, staging, gathered groups, persistent
// groups, rollback). For Psi padded elements over Nd ranks (docs/
// design/engine.md, "Memory per rank", gives the table):
//   fp32   stage 0: 16 Psi; 1: 8 Psi + 8 Psi/Nd; 2: 4 Psi + 12 Psi/Nd;
//          3: 16 Psi/Nd (the paper's formula with fp32 weights and
//          gradients and K = 8);
//   bf16   stage 0: 16 Psi; 1: 4 Psi + 12 Psi/Nd; 3: 16 Psi/Nd (the
//          paper's, K = 12); 2: 2 Psi + 16 Psi/Nd, the paper's 2 Psi +
//          14 Psi/Nd plus 2 bytes per owned element because the gradient
//          partition accumulates in float32 (grad_accum_dtype);
//   fp16   emulated on the CPU (Note [Precision model]): the fp32
//          figures, the float32 weights being the master.
// The stages allocate everything up front except stage 3's pool and
// stage 2's bucket pool, which hold their peak at rest after a window:
// the plan's peak is what it holds at rest. Not modelled: offload and the
// pools' growth on a backend that overlaps
// (Note [Stage 3 prefetch], [Stage 3 reduce-scatter in flight]) or for a
// model whose parameters complete out of order (Note [Stage 2 buckets]).
struct MemoryTerm {
  enum class Field { kParams, kGrads, kOptimizer, kRollback };
  std::string name;
  size_t bytes = 0;
  Field field = Field::kParams;  // where MemoryStats counts it
  bool model_state = false;      // one of the paper's three
};

struct MemoryPlan {
  std::vector<MemoryTerm> terms;
  // Summed per MemoryStats field; the peak is the total.
  MemoryStats stats() const;
  size_t model_state_bytes() const;
  size_t total_bytes() const;
};

// Note [Memory plan]. UsageError as window_schedule.
MemoryPlan memory_plan(const ModelShape& model, const ScheduleOptions& options);

struct ScheduleEvent {
  enum class Type : uint8_t { kCollective, kCompute, kWait };
  enum class Work : uint8_t { kForward, kBackward, kOptimizer };
  Type type = Type::kCollective;
  // kCollective: what the ledger records (numel is the ledger's payload:
  // all_reduce/broadcast buffer, reduce_scatter input, all_gather output).
  CollectiveKind kind = CollectiveKind::kAllReduce;
  ReduceOp op = ReduceOp::kSum;
  DType dtype = DType::kFloat32;
  size_t numel = 0;
  const char* phase = phase::kStep;  // zero/phase.h: the ledger's label
  bool async = false;
  // kCompute: forward or backward over `params` parameters (per token),
  // or the optimizer over `params` owned elements.
  Work work = Work::kForward;
  double params = 0.0;
  // kWait: the index (in the event list) of the async collective.
  size_t waits_for = 0;
};

// The Engine's construction (the broadcast of rank 0's parameters).
std::vector<ScheduleEvent> setup_schedule(const ModelShape& model,
                                          const ScheduleOptions& options);
// One window: options.backwards backward() calls (each after its forward)
// and the step() that applies the update. UsageError for a stage outside
// 0-3, world_size < 1, backwards < 1, or a shape whose vectors differ in
// length.
std::vector<ScheduleEvent> window_schedule(const ModelShape& model,
                                           const ScheduleOptions& options);
// memory_plan(model, options).stats(): what Engine::memory() reports
// after a window.
MemoryStats planned_memory(const ModelShape& model,
                           const ScheduleOptions& options);
}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_SCHEDULE_H_
