// Stage3: parameters, gradients and optimizer state partitioned at rest.
//
// Note [Stage 3 groups]
// ~~~~~~~~~~~~~~~~~~~~~
// Trainable parameters are split into groups: one per block (a module the
// model marks as a Zero3Block, blocks/zero3_block.h) plus one persistent
// group for everything else and for parameters smaller than
// stage3_param_persistence_threshold (Note [Stage 3 grouping rule] in
// zero/grouping.h). Each group is one flat range, padded by Note [Padding
// rule] (zero/flat_layout.h); rank r owns its r-th 1/W. At rest a rank holds
// only its partitions (fp32 parameters = the master copy, the accumulated
// gradient, the optimizer state): the full parameter and gradient storage
// of a non-persistent group exists only while the group is in use.
//
//   forward     gather(g): all-gather the partitions into the group's
//               full storage (a pool slot: Note [Stage 3 buffer pool]);
//               release(g) after the block.
//   backward    gather_for_backward(g) before the block's backward
//               (again all-gather, plus zeroed gradient storage); when
//               every parameter of the group has its gradient
//               (on_grad_ready), reduce-scatter (sum) the group's gradient
//               into the rank's partition accumulator and release both
//               slots. end_backward() does the same for groups whose
//               parameters got no gradient.
//               With reduce_once_per_step (Note [Reduce once per step]
//               in zero/stage.h) the group's gradient stays in its full
//               storage (its own, not a pool slot, kept from the group's
//               first backward on) and accumulates over the window; only
//               the parameters are released.
//   step        agreement (reduce_once_per_step: then every group's full
//               gradient reduce-scattered, all in flight at once, summed
//               into the partition in group order, and cleared),
//               divide by W (and the per_step_count divisor),
//               norm (8-byte all-reduce), clip, optimizer on the
//               partitions, all-gather of the persistent group (and,
//               with gather_once_per_step, of every block group); all
//               or nothing (Note [Transactional update] in zero/stage.h:
//               a spare of the persistent groups' partitions, or of the
//               whole partition with gather_once_per_step, kept to undo
//               it).
// Memory: Note [Stage 3 buffer pool]; memory() reports what is resident
// now and the peak since the last reset_peak().
//
// Note [Stage 3 buffer pool]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A non-persistent group's full parameters and full gradient live in a
// slot of a pool while the group is in use, not in memory allocated for
// that use: gather() and gather_for_backward() take a free slot (a new one
// only when every slot is taken), the release returns it. A slot holds the
// largest non-persistent group's padded_numel floats, is allocated once
// and is kept for the stage's lifetime, so a window allocates and faults
// in no gradient or parameter storage once the pool has grown to the most
// groups in use at once (one for parameters and one for gradients in a
// chain of blocks: a block's group is released before the block in front
// of it is gathered). Memory: the pool holds what the peak held before
// (one block group's parameters and gradients) also at rest between
// windows; with groups of unequal size, each slot is the largest one.
// Persistent groups keep their own full storage, as before. The
// GroupStorage (engine/stage3_binding.h) owns the slots' memory and moves
// it into and out of the group's storage; gradients come back zeroed.
//
// Note [NVMe parameter partitions]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With Stage3Options::param_swap.device set (offload_param.device =
// "nvme"), the rank's partitions live in a SwapStore of one array (the
// partitions concatenated, part_offset_ as in memory) on that device, not
// in part_params_. Every read of a group's partition (gather,
// gather_for_backward, full_parameters) copies it into a scratch of the
// largest partition with SwapStore::read_range, which checks the data's
// checksums; the all-gather then runs from the scratch. A failed read is
// an IoError naming the device, and the call changes nothing (no storage
// materialized, no reference taken).
// The update stays all or nothing (Note [Transactional update]): every
// rank reads its partitions into a transient buffer, runs the optimizer on
// it and prepares the new partitions in the store (durable in its spare
// copy, not yet committed); the ranks agree that all of that succeeded
// (internal::step_and_agree: a device error is IoError on its rank and
// CommError naming it elsewhere); the persistent groups are all-gathered
// from the buffer; only then do the parameter store and the optimizer
// (if it is swapped too) commit. A failure before the commits discards
// what was prepared and restores the optimizer, so partitions and moments
// stay at the old step (the one indeterminate case is a commit record
// that fails after other ranks committed: zero/optimizer.h). No 4-byte
// copy of the partition is kept for rollback: the store's committed
// generation is the undo. Memory at rest: the scratch and the store's
// buffers (each about the largest group's partition); during the step,
// one partition-sized buffer more (the optimizer takes its span whole; a
// range-wise optimizer step would stream it instead).
//
// Note [Stage 3 on a device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// With StageOptions::kernels set (Note [Device kernels] in
// zero/kernels.h), every buffer above lives in the kernels' memory: the
// partitions, their accumulated gradient, the reduced chunk, the rollback
// copy and the optimizer state, and the GroupStorage's materialized
// storages too (the engine's Stage3Binding allocates them on the model's
// device). The stage copies, clears, accumulates and divides through the
// kernels; collectives get the buffers marked as device memory. Host waits:
// the norm in finalize() (once per step), and what leaves the device for
// the host by nature: full_parameters(), owned_parameters() and a
// checkpoint's load. Nothing per backward or per group. The NVMe partitions
// (param_swap) stay on the host: with them the kernels must be the host's.
//
// Note [Stage 3 collectives outside backward]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// By default stage 3 communicates inside backward: gather_for_backward
// all-gathers a block's parameters before its backward, and a group's
// gradient is reduce-scattered as soon as it is complete. Ranks whose
// backward passes run on one thread (the simulated ranks of one process on
// one CUDA device: LibTorch runs every backward on a device through that
// device's one autograd thread) would hang there, each waiting in a
// collective for ranks queued behind it. With
// Stage3Options::collectives_outside_backward:
//   - the engine holds a group's parameters from the end of its forward
//     (hold()) to its backward, so gather_for_backward finds them gathered
//     and communicates nothing (a group that was not held is a UsageError
//     there, not a hang);
//   - no group is reduced in on_grad_ready; end_backward() reduce-scatters
//     every group, in group order, after backward has returned.
// The bits are the same: each group's reduction adds into its own range of
// the partition gradient, whatever the order of the groups. The cost is
// memory: every group's full parameters and gradient are materialized
// from its forward to the end of the backward (about stage 0's
// parameters and gradients at the peak), so it serves the simulator's
// ranks on one device, not memory savings. apply_update() and
// load_state() drop what a forward without backward left held, so a held
// group never outlives the values it was gathered from.
//
// Note [Stage 3 offload from a device]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A model on a device with offload_optimizer (or offload_param) keeps the
// gathered groups on its device and the rank's partitions on the host:
// StageOptions::kernels are the host's (the partitions, their gradient,
// the optimizer state, the NVMe store) and Stage3Options::group_kernels
// the device's (the GroupStorage's full parameters and gradients). Each
// collective's buffers are marked by where they live: a gather reads a
// host partition into device storage, a reduce-scatter reads device
// gradients into a host chunk; the clears and copies of group storage go
// through group_kernels, the initial partitions are downloaded from the
// device storage once. The fused CPU Adam updates the partitions; the
// next gather brings them to the device. Without group_kernels both are
// the same kernels.
//
// Note [Stage 3 prefetch]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A gather of a block's group for its forward (backward) issues, right
// after it, the all-gather of the next non-persistent group in group
// order (the previous one in backward): blocks run in registration order
// forward and in reverse backward. It is asynchronous
// (Communicator::all_gather_async), so on a backend that overlaps (gloo,
// nccl) the next block's parameters travel while this block computes; the
// gather of that group then waits for it instead of communicating. On a
// backend whose async collectives complete in the call (sim, the default)
// only the order of the collectives changes. The bits never do: the
// gathered values are the same. At most one group is ahead at a time, and
// only one of at most Stage3Options::prefetch_numel padded elements
// (DeepSpeed's stage3_prefetch_bucket_size; 0 turns prefetch off). A
// prefetched group that is not the next one gathered (a model that runs
// its blocks in another order, or skips one) is waited for and dropped at
// the next gather, and at the end of backward, a step, a load or a
// full_parameters(): every rank issued the same prefetches, so waiting
// for it never hangs. Memory: one pool slot more (Note [Stage 3 buffer
// pool]: one group's parameters in use and one ahead). Only on a
// communicator that overlaps its asynchronous collectives
// (Communicator::overlaps_async(): gloo, nccl; not sim, where an early
// gather would cost the slot and gain nothing, so the simulator's memory
// figures stay those of a run without prefetch). Off with one rank (nothing to
// fetch), with the NVMe partitions (one read scratch) and with
// collectives_outside_backward (the groups stay gathered anyway).
// A prefetch is also skipped when it would bring the block groups gathered
// above Stage3Options::max_live_numel elements (their unpadded sizes;
// DeepSpeed's stage3_max_live_parameters, which bounds its prefetch the
// same way).
//
// Note [Stage 3 reduce-scatter in flight]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// With zero_optimization.overlap_comm, a group whose gradient is complete
// in backward has its reduce-scatter issued asynchronously
// (Communicator::reduce_scatter_async) instead of waited for there:
// autograd goes on to the next block while the gradient travels, and
// end_backward() waits for them all, in issue order. The group's
// parameters are released at once (the reduce-scatter does not read
// them); its gradient slot stays taken until its reduce-scatter is done.
// Each reduce-scatter adds into the group's own range of the partition
// accumulator, once per backward, as the blocking one does, so the bits
// are the same. What it costs is gradient memory: at most
// Stage3Options::reduce_bucket_size padded elements are in flight (a group
// larger than that goes alone); before issuing another, the oldest are
// waited for. The pool keeps the extra gradient slots between windows
// (Note [Stage 3 buffer pool]), so the memory at rest grows as the peak
// does. That is DeepSpeed's bound too: its stage 3 copies
// gradients into a bucket of reduce_bucket_size elements and
// reduce-scatters it when full, with overlap_comm (its default at stage
// 3) on a stream of its own. Only where it can help and where the
// reduce-scatter adds into the partition itself (Note [Reduce-scatter
// into the partition] in zero/stage.h): a communicator that overlaps its
// asynchronous collectives (gloo; on sim they complete in the call, so
// its memory figures stay those of the blocking reduce-scatter), float32
// accumulation, more than one rank, and not with reduce_once_per_step
// (backward reduces nothing). A reduce-scatter left in flight by a
// backward that threw is waited for by the next backward, step, load or
// full_parameters(), and by the destructor: no transfer outlives the
// memory it reads or writes.
//
// Note [Stage 3 reuse distance]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// DeepSpeed does not release a parameter after a module's forward if its
// next use comes within stage3_max_reuse_distance elements (default 1e9)
// of the modules that run in between. Here: a block group g stays
// gathered from the end of its forward to its backward (the engine calls
// hold(), as with collectives_outside_backward) when
//   2 x (elements of the block groups after g) < reuse_distance_numel,
// the blocks that run forward after g and backward before it, each
// counted once per pass (blocks run in registration order forward and in
// reverse backward; the persistent group, always whole, is not counted).
// gather_for_backward() then finds it gathered and all-gathers nothing:
// one all-gather per block per forward+backward instead of two. Its
// reduction at the end of its backward releases it as before. With the
// default 1e9 every group of a model under 5e8 block elements is kept, so
// the peak holds every block group's parameters at the turn from forward
// to backward (and the pool keeps that many slots: Note [Stage 3 buffer
// pool]); 0 releases every group after its forward (the memory of a
// ZeRO-3 that gathers twice). DeepSpeed starts doing this only after its
// first forward+backward has recorded the order of the modules; here the
// order is the blocks' registration order from the first window on. The
// gathered values are the partitions' at the window's start either way,
// so the bits never change, only traffic and memory. A group held by a
// forward whose backward never runs stays gathered until the end of the
// next backward, or until a step or a load drops it (drop_held()).
//
// Note [Stage 3 gather once per step]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The partitions change only in a step (apply_update) or a load
// (load_state), so a group gathered after one of them holds the right
// values until the next. With Stage3Options::gather_once_per_step
// (zerostep's zero_optimization.gather_once_per_step) a block group, once
// gathered (by a forward, a backward, or a prefetch), stays gathered:
// neither release() after its forward nor the reduction after its backward
// drops it; drop_held() does, at the step and at a load. So each block
// group is all-gathered at most once between two steps instead of once or
// twice per forward+backward: a window of N backward calls makes 1 all-
// gather per group where DeepSpeed's behaviour (the default, off) makes N
// (reuse distance keeping it) or 2N. It is FSDP2's
// reshard_after_backward=False.
// The step gathers them: once the update has written the new partitions,
// apply_update all-gathers every block group from them into its pool slot,
// all the all-gathers in flight at once, inside the update's transaction
// (a failure drops the slots with the rest: Note [Transactional update]).
// The next window's forward then finds every group gathered; only a run's
// first window, and the first after a load, gather in forward. The same
// bytes move, in one burst: the forward's blocks no longer wait in turn
// for their gathers (each a synchronization of the ranks), and the gathers'
// latencies overlap one another (measured in docs/benchmarks.md as of
// fee84cc). With the partitions on NVMe (Note [NVMe parameter
// partitions]) the forward gathers, as
// without the option. A forward without backward (sampling, evaluation)
// between steps uses what the step gathered. The bits never change (the
// gathered values are the same); what it costs is memory: from the first
// use of every block in the window to the step, every block group's
// parameters are gathered, one pool slot each (Note [Stage 3 buffer
// pool]). With the default stage3_max_reuse_distance (1e9) the pool holds
// one slot per block group already (every group is kept from its forward
// to its backward), so for models under 5e8 block elements the option
// costs no memory; with a reuse distance of 0 it grows the pool from one
// parameter slot to one per block group. Gradient storage is unchanged.
//
// Ownership: `comm` and `storage` must outlive the Stage3.
// Thread safety: none; one Stage3 per rank.
#ifndef ZEROSTEP_ZERO_STAGE3_H_
#define ZEROSTEP_ZERO_STAGE3_H_

#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "zero/grouping.h"
#include "zero/stage.h"

namespace zerostep {

// Full-size storage of a group, owned by the engine (LibTorch storages that
// the parameters and their .grad view). Note [Stage 3 buffer pool]: the
// stage says which slot of the pool (0, 1, ...: a new one is the next
// number) holds a non-persistent group while it is in use; kOwn is a
// persistent group's own storage. Each materialize returns padded_numel
// floats; materialize_grads returns zeros. Under mixed precision the model
// may compute in another format than these float32 buffers
// (precision/precision.h): the two hooks let the engine convert.
class GroupStorage {
 public:
  static constexpr size_t kOwn = static_cast<size_t>(-1);
  virtual ~GroupStorage() = default;
  virtual float* materialize_params(size_t group, size_t slot) = 0;
  // The slot's memory goes back to the pool; the group's storage holds
  // zero bytes until it is materialized again.
  virtual void release_params(size_t group, size_t slot) = 0;
  virtual float* materialize_grads(size_t group, size_t slot) = 0;
  virtual void release_grads(size_t group, size_t slot) = 0;
  // The float32 parameters of the group were (re)written: gathered, updated
  // or loaded.
  virtual void params_written(size_t /*group*/) {}
  // Autograd has finished this backward's gradients of the group; the
  // float32 gradient buffer must hold them when this returns.
  virtual void grads_ready(size_t /*group*/) {}
};

// Note [Stage 3 initial values]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Stage3's constructor takes its partitions' first values one group at a
// time, in group order, so that no rank ever holds the whole model: for a
// non-persistent group, partition() may write the rank's share straight
// (read from a file by a ParameterSource: no full group at all); otherwise
// full() materializes the whole group (rank 0's values after a broadcast),
// the stage copies its share out, and the storage is the engine's to free
// before the next group's. A persistent group's full() storage is its own
// from then on. Peak during construction: the partitions, one group, and
// whatever the caller's model still holds (engine/engine.h).
class Stage3Initial {
 public:
  virtual ~Stage3Initial() = default;
  // Group g's full values: padded_numel floats in the GroupStorage's
  // memory, valid until the next call.
  virtual float* full(size_t group) = 0;
  // Writes the group's padded elements [first, first + numel) into `out`
  // (host memory) and returns true, or returns false (full() serves then).
  virtual bool partition(size_t group, size_t first, size_t numel,
                         float* out) = 0;
};

class Stage3 final : public Stage {
 public:
  // `initial` gives the groups' first values (Note [Stage 3 initial
  // values]); `param_numels[i]` is parameter i's size (to map parameters to
  // offsets inside their group).
  Stage3(const StageOptions& options, const Stage3Options& own,
         std::vector<Stage3Group> groups,
         const std::vector<size_t>& param_numels, Stage3Initial& initial,
         GroupStorage* storage, Communicator* comm);

  ~Stage3() override;

  int stage() const override { return 3; }
  void begin_backward(int64_t backward_index, int64_t global_steps) override;
  void on_grad_ready(size_t param_index) override;
  void end_backward() override;
  bool wants_grad_ready() const override { return true; }
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     const char* phase) override;
  GradStats finalize(double divisor, double clip) override;
  void apply_update(const OptimizerHyper& hyper) override;
  void zero_grad() override;
  const FlatOptimizer& optimizer() const override { return optimizer_; }
  const std::vector<Span>& owned_spans() const override { return owned_; }
  MemoryStats memory() const override;
  std::vector<Segment> owned_segments() const override;
  // Offloaded: read from the device (IoError if that fails).
  std::vector<float> owned_parameters() const override;
  void load_state(const std::vector<float>& params,
                  const std::vector<float>& exp_avg,
                  const std::vector<float>& exp_avg_sq,
                  int64_t optimizer_steps) override;

  // Forward: makes group g's full parameters available (reference counted).
  void gather(size_t group, const char* phase);
  // Forward: drops one reference; frees the storage at zero (persistent
  // groups stay).
  void release(size_t group);
  // Backward: the group's parameters and zeroed gradient storage, before
  // the block's backward runs.
  void gather_for_backward(size_t group);
  // Forward, after the block (Note [Stage 3 collectives outside
  // backward], Note [Stage 3 reuse distance]): one more reference to the
  // gathered group, which its backward's reduction drops. Only where
  // keeps_for_backward(group).
  void hold(size_t group);
  // Whether the group stays gathered from its forward to its backward.
  bool keeps_for_backward(size_t group) const {
    return outside_backward_ || kept_[group];
  }
  bool collectives_outside_backward() const { return outside_backward_; }
  // Every rank calls it: all-gathers every group into `out` (the
  // parameters in registration order, param_numels concatenated).
  void full_parameters(float* out, const char* phase);
  void reset_peak() { peak_bytes_ = current_bytes(); }

  size_t num_groups() const { return groups_.size(); }
  size_t group_of(size_t param_index) const { return group_of_[param_index]; }
  size_t padded_numel(size_t group) const { return padded_[group]; }
  // The store holding the partitions (Note [NVMe parameter partitions]),
  // or nullptr when they are in memory.
  const SwapStore* param_store() const { return param_store_.get(); }

 private:
  // A group's gradient is complete for this backward: reduce it (by
  // default) or keep it for the step (reduce_once_per_step).
  void reduce_group(size_t group);
  // Note [Stage 3 collectives outside backward], Note [Stage 3 reuse
  // distance], Note [Stage 3 gather once per step]: drops the parameters
  // of every non-persistent group still gathered (no forward is running
  // when this is called).
  void drop_held();
  // Elements of the block groups gathered now, by their unpadded sizes
  // (Note [Stage 3 prefetch]).
  size_t live_numel() const;
  // Reduce-scatter the group's full gradient into its partition
  // accumulator, then clear it (persistent groups, reduce_once_per_step)
  // or release it and the parameters.
  void reduce_scatter_group(size_t group, const char* phase);
  // The second half of that: `chunk` holds the group's reduced chunk
  // (nullptr: the reduce-scatter added it, Note [Reduce-scatter into the
  // partition] in zero/stage.h).
  void sum_reduced_chunk(size_t group, const float* chunk);
  // Note [Stage 3 buffer pool]: group g's parameters (gradients) into a
  // free slot, and back.
  void take_params(size_t group);
  void drop_params(size_t group);
  void take_grads(size_t group);
  void drop_grads(size_t group);
  size_t current_bytes() const;
  size_t rollback_bytes() const;
  void note_memory();
  // Group g's partition: in memory, or read from the store into
  // part_scratch_ (IoError).
  float* partition_of(size_t group);
  // Note [Stage 3 prefetch]: issues the gather of the group after (before,
  // in backward) `group`, if any is to be fetched; waits for the one ahead
  // and drops it unless it is `keep`.
  void prefetch_after(size_t group, bool backward, const char* phase);
  void settle_prefetch(size_t keep);
  // Note [Stage 3 reduce-scatter in flight]: issues group g's
  // reduce-scatter after making room for it; waits for the oldest in flight
  // until `room` more elements fit under the limit (every one with
  // room = kNone); on a failure, waits for all the others too and rethrows.
  void reduce_scatter_in_flight(size_t group);
  void settle_in_flight(size_t room);
  static constexpr size_t kNone = static_cast<size_t>(-1);
  // A collective's view of n floats of this stage's memory (Note [Stage 3
  // on a device]).
  Buffer buffer(float* p, size_t n) const {
    return internal::buffer_in(k_, p, n);
  }
  // The same for the gathered groups' memory (Note [Stage 3 offload from a
  // device]).
  Buffer group_buffer(float* p, size_t n) const {
    return internal::buffer_in(gk_, p, n);
  }
  // Whether this backward may issue a collective (Note [Window agreement]
  // in zero/stage.h).
  bool backward_communicates() const;
  // After an update: all-gathers the persistent groups (into their
  // gradient storage) and, with `blocks`, every block group (into pool
  // slots) from `partition(g)`, group g's new partition.
  void gather_updated(const std::function<const float*(size_t)>& partition,
                      bool blocks);
  // apply_update with the partitions on the device.
  void apply_update_offloaded(const OptimizerHyper& hyper);
  // apply_update where only the persistent groups are gathered (Note
  // [Transactional update]).
  void apply_update_persistent_spare(const OptimizerHyper& hyper);
  // The persistent groups' parameters := their gradient storage, which
  // holds the gathered update; the gradient storage is zeroed again.
  void publish_persistent();

  std::vector<Stage3Group> groups_;
  std::vector<size_t> param_offset_;  // within its group
  std::vector<size_t> canonical_offset_;  // in registration order
  std::vector<size_t> param_numel_;
  std::vector<size_t> group_of_;
  std::vector<size_t> padded_, partition_, part_offset_;
  Kernels& k_;  // the memory of every buffer below but the NVMe scratches
  Kernels& gk_;  // the GroupStorage's memory (Note [Stage 3 offload from a
                 // device]); k_ unless given
  GroupStorage* storage_;
  Communicator* comm_;
  Precision grad_accum_;
  // Note [Reduce-scatter into the partition] in zero/stage.h.
  bool fused_ = false;
  // Note [Reduce once per step] in zero/stage.h: the groups' full gradients
  // accumulate over the window, each in the group's own storage.
  bool reduce_once_;
  // Note [Stage 3 gather once per step]: block groups stay gathered until
  // the step (or a load).
  bool gather_once_;
  bool outside_backward_;  // Note [Stage 3 collectives outside backward]
  int world_;
  int rank_;
  // Note [Gradient averaging] in zero/averaging.h: each group's gradient
  // scaled before its reduce-scatter, the partition after the sum.
  AveragingSteps averaging_;
  std::vector<Span> owned_;
  size_t owned_numel_ = 0;
  DeviceArray part_params_;  // the rank's partitions, concatenated
                             // (empty when offloaded)
  // Note [NVMe parameter partitions]: the store, a scratch of the largest
  // partition, and the partitions during an update (empty otherwise).
  std::unique_ptr<SwapStore> param_store_;
  std::vector<float> part_scratch_;
  std::vector<float> step_params_;
  DeviceArray part_grads_;  // accumulated over the window
  // One group's reduced chunk; with reduce_once_per_step every group's,
  // at its partition's offset. Unused where fused_ (Note [Reduce-scatter
  // into the partition]; still allocated, so memory() does not depend on
  // the backend).
  DeviceArray scratch_;
  FlatOptimizer optimizer_;
  // Note [Transactional update]: the spare partition the update writes
  // (it becomes part_params_ once the update has succeeded), and the
  // optimizer's state before the update in progress. Where only the
  // persistent groups are gathered in the update (neither
  // gather_once_per_step nor a swapped optimizer), only theirs: the block
  // groups' new partitions are written by the optimizer's commit(), once
  // the gather has succeeded; spare_offset_[g] is then each persistent
  // group's place in it.
  DeviceArray saved_params_;
  bool full_spare_ = true;
  std::vector<size_t> spare_offset_;
  FlatOptimizer::Snapshot saved_optimizer_;
  // Per group, live state.
  std::vector<float*> full_params_;  // nullptr while released
  std::vector<float*> full_grads_;   // nullptr while released
  // Note [Stage 3 buffer pool]: the slot each group holds (kOwn for the
  // persistent ones and while released), the free slots, and how many
  // there are, each of slot_numel_ floats.
  std::vector<size_t> param_slot_, grad_slot_;
  std::vector<size_t> free_param_slots_, free_grad_slots_;
  size_t param_slots_ = 0, grad_slots_ = 0;
  size_t slot_numel_ = 0;
  std::vector<int> refs_;
  // Note [Stage 3 prefetch]: the limit (0: off), the group ahead (kNone)
  // and its all-gather until waited for.
  size_t prefetch_numel_ = 0;
  size_t max_live_numel_ = static_cast<size_t>(-1);
  // Note [Stage 3 reuse distance]: per group, whether it is kept gathered
  // from its forward to its backward.
  std::vector<bool> kept_;
  size_t ahead_ = kNone;
  std::shared_ptr<Work> ahead_work_;
  std::vector<size_t> pending_;  // parameters still without gradient
  std::vector<bool> reduced_;    // this backward
  size_t peak_bytes_ = 0;
  // Note [Stage 3 reduce-scatter in flight]: the limit in padded elements
  // (0: off), and the reduce-scatters issued and not yet waited for, in
  // issue order, with their elements. Last, so that they are destroyed
  // (and waited for) before the memory they use.
  size_t in_flight_limit_ = 0;
  size_t in_flight_numel_ = 0;
  std::deque<std::pair<size_t, std::shared_ptr<Work>>> in_flight_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE3_H_
