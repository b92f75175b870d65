// Stage2: gradients and optimizer state partitioned across ranks; gradients
// reduced on every backward, in managed and unmanaged mode alike.
//
// Note [Bucket-interleaved partition]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The flat buffer is cut into buckets of at most reduce_bucket_size
// elements (a multiple of W × 16). Bucket k is a contiguous range; its
// reduce-scatter gives rank r the r-th chunk of that range. Rank r's
// partition is therefore its chunk of every bucket (owned_spans()), not one
// contiguous range as at stage 1. This keeps every reduce-scatter input a
// contiguous slice of the flat gradient (no staging copy), and makes a
// bucket ready as soon as the parameters in one contiguous range have their
// gradients, which is what overlap_comm needs: autograd finishes parameters
// roughly in reverse registration order.
//
// Note [Stage 2 buckets]
// ~~~~~~~~~~~~~~~~~~~~~~
// Stage 2 holds no full-size gradient (partitions_gradients() in
// zero/stage.h): each backward's gradient goes, parameter by parameter,
// into the reduce bucket that holds its elements, and autograd's own
// tensor for it is dropped at once. Per backward: agreement (Note [Window
// agreement]); then, as autograd completes each parameter's gradient, the
// engine's binding hands it to take_grad(), which goes through the
// buckets holding its elements, last first: a bucket with no memory
// yet takes a slot of the bucket pool, zeroed; the binding adds the
// parameter's elements there (0 + g: the bits autograd's own accumulation
// into a zeroed buffer gives; the fold of Note [Precision model] under
// bf16 and fp16); a bucket whose parameters are now all done is
// reduce-scattered (sum) into the rank's accumulated gradient
// partition (Note [Reduce-scatter into the partition] in zero/stage.h,
// else through a scratch chunk of its slot) and its slot goes back to the
// pool: at once without overlap_comm (as DeepSpeed reduces a full bucket
// inside its backward hook), asynchronously with it, waited for when its
// slot is needed again and at the end of the backward. end_backward()
// reduces the buckets some of whose parameters got no gradient (their
// elements zero), in bucket order, and waits for every reduction. Each
// element is reduced once per backward and added once into its partition
// element, so the bits are those of reducing a full flat gradient bucket
// by bucket (and of zerostep before this note: the harness's digests did
// not move).
//
// Memory, per rank, with B the largest bucket (at most reduce_bucket_size
// elements, and at most the padded model): the pool starts with
// min(buckets, 2) slots of B floats, each with a scratch chunk of B/W, and
// keeps them (allocated once, like the rest of stage 2's state, so a
// window allocates and faults in nothing). Gradient memory during backward
// is therefore the partition (padded/W), the pool, and the gradients
// autograd holds for parameters not yet copied into a bucket (each is
// dropped as soon as it is copied, right after autograd completes it).
// Two slots cover a model whose parameters complete in reverse
// registration order, as a chain of layers does: at most two buckets are
// open at once (the one filling, and the one before it while a parameter
// straddles their boundary; a parameter spanning many buckets completes
// its middle ones one by one), and with overlap_comm a bucket in flight is
// waited for before its slot is reused. A model that completes them in
// another order may need more: the pool then grows by one slot at a time
// (memory() reports it), as a test of such a model shows.
//
// Step: the optimizer updates the owned chunks in place, keeping a copy
// of them and of its moments (Note [Transactional update]); each bucket is
// all-gathered in place (in pieces of allgather_bucket_size through a
// staging buffer when the bucket is larger).
//
// With reduce_once_per_step (Note [Reduce once per step] in zero/stage.h)
// the backwards only agree; the full gradient accumulates every backward
// and reduce_window() reduces its buckets once, in bucket order. In managed
// mode with overlap_comm the boundary backward agrees on the window before
// its autograd pass and launches each bucket as soon as its parameters are
// complete, as stage 0 does (Note [Stage 0 buckets] in zero/stage0.h): the
// same buckets of the same data, so the same bits as unmanaged mode, which
// reduces them all in step(). That mode (and collectives_outside_backward)
// updates through the full gradient buffer, as stage 1 does.
//
// Ownership and threading: see zero/stage.h.
#ifndef ZEROSTEP_ZERO_STAGE2_H_
#define ZEROSTEP_ZERO_STAGE2_H_

#include <deque>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "zero/stage.h"

namespace zerostep {

namespace internal {
// Note [Bucket-interleaved partition]: `n` rounded down to a multiple of
// FlatLayout::kAlignNumel (at least one), and the buckets of a layout.
// Shared with zero/schedule.h, which plans the same collectives.
size_t aligned_elements(int64_t n);
std::vector<Span> make_buckets(const FlatLayout& layout, int64_t bucket_size);

// One reduction of the flat gradient, bucket by bucket (stages 0 and 2):
// with overlap_comm a bucket's collective is launched from inside autograd
// as soon as every parameter whose elements it holds has its gradient
// (ready()); finish() launches the rest in bucket order and waits for all.
// Which collective a bucket gets is the stage's `launch`.
class BucketLauncher {
 public:
  using Launch =
      std::function<std::shared_ptr<Work>(size_t bucket, const char* phase)>;
  BucketLauncher(const FlatLayout& layout, int64_t bucket_size, Launch launch);

  const std::vector<Span>& buckets() const { return buckets_; }
  // The buckets holding parameter p's elements, in bucket order.
  const std::vector<size_t>& buckets_of(size_t p) const {
    return buckets_of_param_[p];
  }
  // A new reduction: every bucket pending, none launched.
  void begin();
  // Parameter p's gradient is complete: launch the buckets that completes.
  void ready(size_t p, const char* phase);
  // One parameter's elements in bucket k are complete (each parameter's
  // buckets reported once per begin()): launch k if that completes it.
  void ready_in(size_t k, const char* phase);
  // Launch every bucket not launched yet, in bucket order, and wait for all
  // (a launch may return nullptr: nothing to wait for).
  void finish(const char* phase);

 private:
  void launch(size_t k, const char* phase);

  std::vector<Span> buckets_;
  Launch launch_;
  std::vector<std::vector<size_t>> buckets_of_param_;
  std::vector<size_t> params_in_bucket_;
  std::vector<size_t> pending_;  // parameters of bucket k not yet ready
  std::vector<bool> launched_;
  std::vector<std::shared_ptr<Work>> works_;
};
}  // namespace internal

class Stage2 final : public FlatStage, public ParamGradSink {
 public:
  Stage2(const StageOptions& options, const Stage2Options& own,
         FlatBuffers buffers, Communicator* comm);
  ~Stage2() override;

  int stage() const override { return 2; }
  void begin_backward(int64_t backward_index, int64_t global_steps) override;
  void begin_boundary_backward(int64_t window_backwards,
                               int64_t global_steps) override;
  void on_grad_ready(size_t param_index) override;
  void end_backward() override;
  bool wants_grad_ready() const override { return overlap_comm_ && !pooled_; }
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     const char* phase) override;
  GradStats finalize(double divisor, double clip) override;
  void apply_update(const OptimizerHyper& hyper) override;
  void zero_grad() override;
  MemoryStats memory() const override;
  // ParamGradSink (Note [Stage 2 buckets]).
  void take_grad(size_t param_index,
                 const std::function<void(const GradSlice&)>& write) override;

  // Bucket k's range of the flat buffer (for tests and docs).
  const std::vector<Span>& buckets() const { return launcher_.buckets(); }
  // Note [Stage 2 buckets]: the pool's slots (each one bucket) now.
  size_t bucket_slots() const { return slots_.size(); }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  // Reduce-scatters every bucket not yet launched, waits for all and adds
  // the chunks into the accumulated partition.
  void reduce_buckets(const char* phase);
  // Note [Stage 2 buckets]: bucket k's reduce-scatter from its slot, at
  // once or in flight.
  std::shared_ptr<Work> launch_pooled(size_t bucket, const char* phase);
  // Bucket k's reduction is done: its chunk into the partition (unless the
  // reduce-scatter added it), its slot back to the pool.
  void finish_pooled(size_t bucket);
  // A free slot for bucket k, zeroed: from the pool, else after the oldest
  // reduction in flight, else a new one.
  void take_slot(size_t bucket);
  // Waits for every reduction in flight, oldest first (on a failure, for
  // the others too, then rethrows), and returns every slot to the pool.
  void settle_pooled();
  // Note [Transactional update] without a full gradient buffer.
  void update_in_place(const OptimizerHyper& hyper);
  // All-gathers every bucket's updated chunk of `params`, in place.
  void gather_buckets(float* params);

  bool overlap_comm_;
  bool reduce_once_;  // Note [Reduce once per step] in zero/stage.h
  Precision grad_accum_;
  // Note [Reduce-scatter into the partition] in zero/stage.h.
  bool fused_ = false;
  size_t allgather_piece_;              // elements per rank per all-gather
  std::vector<size_t> scratch_offset_;  // bucket k's chunk in the scratch
  internal::BucketLauncher launcher_;   // the buckets and their launches
  // reduce_once_per_step with overlap_comm, managed mode: the window's
  // reduce began in the boundary backward (agreed, some buckets launched).
  bool begun_ = false;
  DeviceArray grad_partition_;  // accumulated over the window
  // This backward's reduced chunks; unused where fused_ (still allocated,
  // so memory() does not depend on the backend).
  DeviceArray reduce_scratch_;
  DeviceArray gather_staging_;  // only if a bucket exceeds a piece
  // Note [Stage 2 buckets] (pooled_: no full gradient buffer): the pool's
  // slots (the largest bucket's elements each) with their scratch chunks,
  // the free ones, the slot each bucket holds in this backward (kNone),
  // and the reductions in flight with overlap_comm, in launch order.
  bool pooled_ = false;
  size_t slot_numel_ = 0;
  std::vector<DeviceArray> slots_;
  std::vector<DeviceArray> slot_scratch_;
  std::vector<size_t> free_slots_;
  std::vector<size_t> slot_of_bucket_;
  std::deque<std::pair<size_t, std::shared_ptr<Work>>> in_flight_;
  // Note [Transactional update]: the owned chunks before an update.
  DeviceArray saved_owned_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE2_H_
