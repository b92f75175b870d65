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
// Per backward: agreement (Note [Window agreement]); then each bucket is
// reduce-scattered (sum) into a per-bucket scratch chunk (launched from
// on_grad_ready() as soon as its parameters are complete with overlap_comm,
// else all in end_backward()); end_backward() waits for all of them in
// launch order, adds the chunks into the rank's accumulated gradient
// partition in bucket order, and clears the full gradient for the next
// backward. The accumulated partition is the sum over backwards of the sum
// over ranks; finalize() divides it by W (then by the per_step_count
// divisor). Step: the optimizer updates the owned chunks; each bucket is
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
// reduces them all in step().
//
// Memory: the full flat gradient stays allocated (autograd accumulates into
// it); what is partitioned is the accumulated window gradient, the
// optimizer state, and the reduce scratch.
//
// Ownership and threading: see zero/stage.h.
#ifndef ZEROSTEP_ZERO_STAGE2_H_
#define ZEROSTEP_ZERO_STAGE2_H_

#include <functional>
#include <memory>
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
  // A new reduction: every bucket pending, none launched.
  void begin();
  // Parameter p's gradient is complete: launch the buckets that completes.
  void ready(size_t p, const char* phase);
  // Launch every bucket not launched yet, in bucket order, and wait for all.
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

class Stage2 final : public FlatStage {
 public:
  Stage2(const StageOptions& options, FlatBuffers buffers, Communicator* comm);

  int stage() const override { return 2; }
  void begin_backward(int64_t backward_index, int64_t global_steps) override;
  void begin_boundary_backward(int64_t window_backwards,
                               int64_t global_steps) override;
  void on_grad_ready(size_t param_index) override;
  void end_backward() override;
  bool wants_grad_ready() const override { return overlap_comm_; }
  void reduce_window(int64_t window_backwards, int64_t global_steps,
                     const char* phase) override;
  GradStats finalize(double divisor, double clip) override;
  void apply_update(const OptimizerHyper& hyper) override;
  MemoryStats memory() const override;

  // Bucket k's range of the flat buffer (for tests and docs).
  const std::vector<Span>& buckets() const { return launcher_.buckets(); }

 private:
  // Reduce-scatters every bucket not yet launched, waits for all and adds
  // the chunks into the accumulated partition.
  void reduce_buckets(const char* phase);

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
};

}  // namespace zerostep

#endif  // ZEROSTEP_ZERO_STAGE2_H_
