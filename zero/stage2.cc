#include "zero/stage2.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/errors.h"

namespace zerostep {
namespace internal {

// Rounds down to a multiple of FlatLayout::kAlignNumel, at least one.
size_t aligned_elements(int64_t n) {
  const size_t a = FlatLayout::kAlignNumel;
  const size_t x = n > 0 ? static_cast<size_t>(n) : 0;
  return std::max(a, x / a * a);
}

std::vector<Span> make_buckets(const FlatLayout& layout, int64_t bucket_size) {
  const size_t w = static_cast<size_t>(layout.world_size);
  // Elements per rank per bucket: a multiple of the alignment, so every
  // bucket's size is a multiple of W × 16 and divides into W chunks.
  const size_t per_rank = aligned_elements(bucket_size / static_cast<int64_t>(w));
  const size_t size = per_rank * w;
  std::vector<Span> buckets;
  for (size_t at = 0; at < layout.padded_numel; at += size)
    buckets.push_back({at, std::min(size, layout.padded_numel - at)});
  return buckets;
}

BucketLauncher::BucketLauncher(const FlatLayout& layout, int64_t bucket_size,
                               Launch launch)
    : buckets_(make_buckets(layout, bucket_size)), launch_(std::move(launch)) {
  // Which buckets each parameter's elements touch, and how many parameters
  // touch each bucket.
  buckets_of_param_.assign(layout.numels.size(), {});
  params_in_bucket_.assign(buckets_.size(), 0);
  for (size_t p = 0; p < layout.numels.size(); ++p) {
    const size_t begin = layout.offsets[p];
    const size_t end = begin + layout.numels[p];
    for (size_t k = 0; k < buckets_.size(); ++k) {
      const Span& b = buckets_[k];
      if (begin < b.offset + b.numel && b.offset < end && begin < end) {
        buckets_of_param_[p].push_back(k);
        ++params_in_bucket_[k];
      }
    }
  }
  begin();
}

void BucketLauncher::begin() {
  pending_ = params_in_bucket_;
  launched_.assign(buckets_.size(), false);
  works_.clear();
}

void BucketLauncher::launch(size_t k, const char* phase) {
  launched_[k] = true;
  works_.push_back(launch_(k, phase));
}

void BucketLauncher::ready(size_t p, const char* phase) {
  ZS_CHECK(p < buckets_of_param_.size());
  for (size_t k : buckets_of_param_[p]) {
    ZS_CHECK(pending_[k] > 0);
    if (--pending_[k] == 0 && !launched_[k]) launch(k, phase);
  }
}

void BucketLauncher::finish(const char* phase) {
  // Buckets whose parameters got no gradient (or all of them, when none
  // was launched from autograd) go now, in bucket order.
  for (size_t k = 0; k < buckets_.size(); ++k)
    if (!launched_[k]) launch(k, phase);
  for (const std::shared_ptr<Work>& w : works_) w->wait();
  works_.clear();
}

}  // namespace internal

namespace {
using internal::aligned_elements;
using internal::make_buckets;

std::vector<Span> owned_chunks(const FlatLayout& layout, int64_t bucket_size,
                               int rank) {
  std::vector<Span> owned;
  for (const Span& b : make_buckets(layout, bucket_size)) {
    const size_t chunk = b.numel / layout.world_size;
    owned.push_back({b.offset + rank * chunk, chunk});
  }
  return owned;
}

}  // namespace

Stage2::Stage2(const StageOptions& options, FlatBuffers buffers,
               Communicator* comm)
    : FlatStage(options, buffers, comm, /*partitioned=*/true,
                owned_chunks(options.layout, options.reduce_bucket_size,
                             comm->rank())),
      overlap_comm_(options.overlap_comm),
      reduce_once_(options.reduce_once_per_step),
      grad_accum_(options.grad_accum),
      allgather_piece_(aligned_elements(options.allgather_bucket_size /
                                        options.layout.world_size)),
      launcher_(options.layout, options.reduce_bucket_size,
                [this](size_t k, const char* phase) {
                  const Span& b = launcher_.buckets()[k];
                  // Note [Reduce-scatter into the partition]: straight into
                  // the partition where the backend can add.
                  float* into =
                      fused_ ? grad_partition_.data() : reduce_scratch_.data();
                  // Note [Gradient averaging] in zero/averaging.h.
                  scale_before_sum(k_, averaging_, buf_.grads + b.offset,
                                   b.numel);
                  return comm_->reduce_scatter_async(
                      buffer(buf_.grads + b.offset, b.numel),
                      buffer(into + scratch_offset_[k], owned_[k].numel),
                      {ReduceOp::kSum, phase, fused_});
                }) {
  ZS_CHECK(launcher_.buckets().size() == owned_.size());
  size_t at = 0;
  for (const Span& o : owned_) {
    scratch_offset_.push_back(at);
    at += o.numel;
  }
  fused_ = internal::reduces_into_partition(*comm_, grad_accum_);
  grad_partition_ = k_.allocate(owned_numel_);
  reduce_scratch_ = k_.allocate(owned_numel_);
  set_owned_grad(grad_partition_.data());
  size_t largest = 0;
  for (const Span& o : owned_) largest = std::max(largest, o.numel);
  if (largest > allgather_piece_)
    gather_staging_ = k_.allocate(allgather_piece_ * layout_.world_size);
}

void Stage2::begin_backward(int64_t backward_index, int64_t global_steps) {
  // Note [Window agreement] in zero/stage.h: with reduce_once_per_step
  // no backward communicates.
  if (reduce_once_) return;
  internal::agree_on_window(*comm_, internal::WindowEvent::kBackward,
                            backward_index, global_steps);
  launcher_.begin();
}

// Note [Reduce once per step] with overlap_comm in managed mode: agree on
// the window now, so that the boundary backward can launch its buckets.
void Stage2::begin_boundary_backward(int64_t window_backwards,
                                     int64_t global_steps) {
  if (!reduce_once_ || !overlap_comm_) return;
  internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                            window_backwards, global_steps);
  begun_ = true;
  launcher_.begin();
}

void Stage2::on_grad_ready(size_t param_index) {
  // With reduce_once_per_step only the boundary backward reduces.
  if (!overlap_comm_ || (reduce_once_ && !begun_)) return;
  launcher_.ready(param_index, phase::kBackward);
}

void Stage2::end_backward() {
  // Note [Reduce once per step]: the full gradient keeps accumulating.
  if (reduce_once_) return;
  reduce_buckets(phase::kBackward);
  k_.zero(buf_.grads, layout_.padded_numel);
}

void Stage2::reduce_buckets(const char* phase) {
  launcher_.finish(phase);
  if (fused_) return;  // each bucket added itself to the partition
  // Bucket order, whatever the launch order: the sums are elementwise and
  // the buckets disjoint, so the result is the same bits either way.
  k_.accumulate(grad_partition_.data(), reduce_scratch_.data(), owned_numel_,
                Precision::kFp32, grad_accum_);
}

void Stage2::reduce_window(int64_t window_backwards, int64_t global_steps,
                           const char* phase) {
  // By default every backward already reduced its gradient into the
  // partitions. Note [Reduce once per step]: the window's full gradient is
  // reduced now (its buckets that the boundary backward did not launch);
  // the buffer is free afterwards (staged_update stages the update in it)
  // and zero_grad() clears it.
  if (!begun_) {
    internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                              window_backwards, global_steps);
    launcher_.begin();
  }
  begun_ = false;
  if (reduce_once_) reduce_buckets(phase);
}

GradStats Stage2::finalize(double divisor, double clip) {
  // The partition holds the sum over ranks: make it the average first.
  return finalize_owned(layout_.world_size, divisor, clip);
}

void Stage2::apply_update(const OptimizerHyper& hyper) {
  // Note [Transactional update]: update and gather in the staging buffer.
  staged_update(hyper, [&](float* staged) {
    const size_t w = static_cast<size_t>(layout_.world_size);
    const size_t r = static_cast<size_t>(comm_->rank());
    for (size_t k = 0; k < launcher_.buckets().size(); ++k) {
      const Span& b = launcher_.buckets()[k];
      const size_t chunk = owned_[k].numel;
      if (chunk <= allgather_piece_) {
        comm_->all_gather(buffer(staged + owned_[k].offset, chunk),
                          buffer(staged + b.offset, b.numel),
                          {phase::kStep});
        continue;
      }
      // The bucket is larger than one all-gather: gather it piece by piece
      // through the gather buffer, then put each rank's piece in place.
      for (size_t at = 0; at < chunk; at += allgather_piece_) {
        const size_t piece = std::min(allgather_piece_, chunk - at);
        comm_->all_gather(buffer(staged + b.offset + r * chunk + at, piece),
                          buffer(gather_staging_.data(), piece * w),
                          {phase::kStep});
        for (size_t q = 0; q < w; ++q)
          k_.copy(staged + b.offset + q * chunk + at,
                  gather_staging_.data() + q * piece, piece);
      }
    }
  });
}

MemoryStats Stage2::memory() const {
  MemoryStats m = FlatStage::memory();
  m.grad_bytes += reduce_scratch_.bytes();
  m.param_bytes += gather_staging_.bytes();
  m.peak_bytes = m.param_bytes + m.grad_bytes + m.optimizer_state_bytes +
                 m.rollback_bytes;
  return m;
}

}  // namespace zerostep
