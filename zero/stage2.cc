#include "zero/stage2.h"

#include <algorithm>
#include <cstring>
#include <exception>
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
  for (size_t k : buckets_of_param_[p]) ready_in(k, phase);
}

void BucketLauncher::ready_in(size_t k, const char* phase) {
  ZS_CHECK(k < pending_.size());
  ZS_CHECK(pending_[k] > 0);
  if (--pending_[k] == 0 && !launched_[k]) launch(k, phase);
}

void BucketLauncher::finish(const char* phase) {
  // Buckets whose parameters got no gradient (or all of them, when none
  // was launched from autograd) go now, in bucket order.
  for (size_t k = 0; k < buckets_.size(); ++k)
    if (!launched_[k]) launch(k, phase);
  for (const std::shared_ptr<Work>& w : works_)
    if (w) w->wait();
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

Stage2::Stage2(const StageOptions& options, const Stage2Options& own,
               FlatBuffers buffers, Communicator* comm)
    : FlatStage(
          options, buffers, comm, /*stage=*/2,
          owned_chunks(options.layout, own.reduce_bucket_size, comm->rank())),
      overlap_comm_(own.overlap_comm),
      reduce_once_(own.reduce_once_per_step),
      grad_accum_(own.grad_accum),
      allgather_piece_(aligned_elements(own.allgather_bucket_size /
                                        options.layout.world_size)),
      launcher_(options.layout, own.reduce_bucket_size,
                [this](size_t k, const char* phase) -> std::shared_ptr<Work> {
                  if (pooled_) return launch_pooled(k, phase);
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
                }),
      pooled_(partitions_gradients(options)) {
  ZS_CHECK(launcher_.buckets().size() == owned_.size());
  ZS_CHECK(pooled_ == (buf_.grads == nullptr));
  size_t at = 0;
  for (const Span& o : owned_) {
    scratch_offset_.push_back(at);
    at += o.numel;
  }
  fused_ = internal::reduces_into_partition(*comm_, grad_accum_);
  grad_partition_ = k_.allocate(owned_numel_);
  set_owned_grad(grad_partition_.data());
  size_t largest = 0;
  for (const Span& o : owned_) largest = std::max(largest, o.numel);
  // Note [Partitioned master]: every bucket's gather goes through the
  // staging buffer, in pieces; otherwise only a bucket larger than a piece.
  if (master_partitioned())
    gather_staging_ = k_.allocate(std::min(largest, allgather_piece_) *
                                  layout_.world_size);
  else if (largest > allgather_piece_)
    gather_staging_ = k_.allocate(allgather_piece_ * layout_.world_size);
  // Note [Transactional update]: the copy of the owned chunks (or master)
  // an in-place update keeps.
  if (pooled_ || master_partitioned())
    saved_owned_ = k_.allocate(owned_numel_);
  if (!pooled_) {
    reduce_scratch_ = k_.allocate(owned_numel_);
    return;
  }
  // Note [Stage 2 buckets]: the pool's first slots, allocated now.
  for (const Span& b : launcher_.buckets())
    slot_numel_ = std::max(slot_numel_, b.numel);
  slot_of_bucket_.assign(launcher_.buckets().size(), kNone);
  const size_t first = std::min<size_t>(launcher_.buckets().size(), 2);
  for (size_t i = 0; i < first; ++i) {
    slots_.push_back(k_.allocate(slot_numel_));
    slot_scratch_.push_back(k_.allocate(slot_numel_ / layout_.world_size));
    free_slots_.push_back(first - 1 - i);  // slot 0 is taken first
  }
}

Stage2::~Stage2() {
  // No transfer may outlive the slots it reads.
  for (auto& [k, w] : in_flight_) try {
      w->wait();
    } catch (...) {
    }
}

void Stage2::begin_backward(int64_t backward_index, int64_t global_steps) {
  // Note [Window agreement] in zero/stage.h: with reduce_once_per_step
  // no backward communicates.
  if (reduce_once_) return;
  // A backward that threw may have left buckets open or in flight.
  if (pooled_) settle_pooled();
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

void Stage2::take_grad(size_t p,
                       const std::function<void(const GradSlice&)>& write) {
  ZS_CHECK(pooled_);
  ZS_CHECK(p < layout_.offsets.size());
  const size_t begin = layout_.offsets[p];
  const size_t end = begin + layout_.numels[p];
  // Last bucket first: in a chain of layers autograd completes the
  // parameters after this one first, so that bucket closes now and its
  // slot serves the next (Note [Stage 2 buckets]).
  const std::vector<size_t>& mine = launcher_.buckets_of(p);
  for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
    const size_t k = *it;
    if (slot_of_bucket_[k] == kNone) take_slot(k);
    const Span& b = launcher_.buckets()[k];
    const size_t lo = std::max(begin, b.offset);
    const size_t hi = std::min(end, b.offset + b.numel);
    write({slots_[slot_of_bucket_[k]].data() + (lo - b.offset), lo - begin,
           hi - lo});
    launcher_.ready_in(k, phase::kBackward);
  }
}

void Stage2::take_slot(size_t k) {
  if (free_slots_.empty() && !in_flight_.empty()) {
    const size_t oldest = in_flight_.front().first;
    std::shared_ptr<Work> w = std::move(in_flight_.front().second);
    in_flight_.pop_front();
    w->wait();
    finish_pooled(oldest);
  }
  if (free_slots_.empty()) {
    free_slots_.push_back(slots_.size());
    slots_.push_back(k_.allocate(slot_numel_));
    slot_scratch_.push_back(k_.allocate(slot_numel_ / layout_.world_size));
  }
  const size_t slot = free_slots_.back();
  free_slots_.pop_back();
  slot_of_bucket_[k] = slot;
  k_.zero(slots_[slot].data(), launcher_.buckets()[k].numel);
}

std::shared_ptr<Work> Stage2::launch_pooled(size_t k, const char* phase) {
  // A bucket none of whose parameters got a gradient is reduced as zeros:
  // every rank issues the same collectives.
  if (slot_of_bucket_[k] == kNone) take_slot(k);
  const size_t slot = slot_of_bucket_[k];
  const Span& b = launcher_.buckets()[k];
  float* into = fused_ ? grad_partition_.data() + scratch_offset_[k]
                       : slot_scratch_[slot].data();
  // Note [Gradient averaging] in zero/averaging.h.
  scale_before_sum(k_, averaging_, slots_[slot].data(), b.numel);
  const ReduceScatterOptions o{ReduceOp::kSum, phase, fused_};
  const Buffer in = buffer(slots_[slot].data(), b.numel);
  const Buffer out = buffer(into, owned_[k].numel);
  if (!overlap_comm_) {
    comm_->reduce_scatter(in, out, o);
    finish_pooled(k);
    return nullptr;
  }
  in_flight_.emplace_back(k, comm_->reduce_scatter_async(in, out, o));
  return nullptr;
}

void Stage2::finish_pooled(size_t k) {
  const size_t slot = slot_of_bucket_[k];
  ZS_CHECK(slot != kNone);
  if (!fused_)
    k_.accumulate(grad_partition_.data() + scratch_offset_[k],
                  slot_scratch_[slot].data(), owned_[k].numel,
                  Precision::kFp32, grad_accum_);
  slot_of_bucket_[k] = kNone;
  free_slots_.push_back(slot);
}

void Stage2::settle_pooled() {
  std::exception_ptr first;
  while (!in_flight_.empty()) {
    const size_t k = in_flight_.front().first;
    std::shared_ptr<Work> w = std::move(in_flight_.front().second);
    in_flight_.pop_front();
    try {
      w->wait();
      finish_pooled(k);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  // Buckets left open (a backward that threw): their slots come back.
  for (size_t k = 0; k < slot_of_bucket_.size(); ++k) {
    if (slot_of_bucket_[k] == kNone) continue;
    free_slots_.push_back(slot_of_bucket_[k]);
    slot_of_bucket_[k] = kNone;
  }
  if (first) std::rethrow_exception(first);
}

void Stage2::on_grad_ready(size_t param_index) {
  // Note [Stage 2 buckets]: take_grad() reports each parameter instead.
  ZS_CHECK(!pooled_);
  // With reduce_once_per_step only the boundary backward reduces.
  if (!overlap_comm_ || (reduce_once_ && !begun_)) return;
  launcher_.ready(param_index, phase::kBackward);
}

void Stage2::end_backward() {
  // Note [Reduce once per step]: the full gradient keeps accumulating.
  if (reduce_once_) return;
  reduce_buckets(phase::kBackward);
  if (!pooled_) k_.zero(buf_.grads, layout_.padded_numel);
}

void Stage2::reduce_buckets(const char* phase) {
  launcher_.finish(phase);
  if (pooled_) {
    settle_pooled();
    return;
  }
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

void Stage2::zero_grad() {
  if (!pooled_) {
    FlatStage::zero_grad();
    return;
  }
  k_.zero(grad_partition_.data(), owned_numel_);
}

void Stage2::apply_update(const OptimizerHyper& hyper) {
  if (pooled_ || master_partitioned()) {
    update_in_place(hyper);
    return;
  }
  // Note [Transactional update]: update and gather in the staging buffer.
  staged_update(hyper, [&](float* staged) { gather_buckets(staged); });
}

// Note [Transactional update] without a full gradient buffer to stage in:
// the owned chunks are updated in place after a copy of them is kept, and
// every bucket is all-gathered in place. A failure restores the owned
// chunks and the moments; the other ranks' chunks of the replica may then
// hold the new values of the buckets gathered before the failure.
void Stage2::update_in_place(const OptimizerHyper& hyper) {
  if (master_partitioned()) {
    // Note [Partitioned master]: the owned master in place, gathered piece
    // by piece into the model's weights.
    k_.copy(saved_owned_.data(), master_.data(), owned_numel_);
    optimizer_.save(&saved_);
    try {
      // From the copy: it keeps the old values that commit() reads (Note
      // [Moments written at commit] in zero/optimizer.h).
      internal::step_and_agree(*comm_, optimizer_.swapped(), [&] {
        optimizer_.step(saved_owned_.data(), master_.data(), owned_grad_,
                        hyper);
      });
      gather_owned(master_.data(), gather_staging_.size() / layout_.world_size,
                   gather_staging_.data(),
                   [&](size_t offset, const float* values, size_t n) {
                     weights_->publish(offset, values, n);
                   });
      optimizer_.commit();
    } catch (...) {
      optimizer_.restore(saved_);
      k_.copy(master_.data(), saved_owned_.data(), owned_numel_);
      throw;
    }
    return;
  }
  size_t at = 0;
  for (const Span& s : owned_) {
    k_.copy(saved_owned_.data() + at, buf_.params + s.offset, s.numel);
    at += s.numel;
  }
  optimizer_.save(&saved_);
  try {
    internal::step_and_agree(*comm_, optimizer_.swapped(), [&] {
      update_owned(hyper, buf_.params, saved_owned_.data());
    });
    gather_buckets(buf_.params);
    optimizer_.commit();  // NVMe: the new moments count from here
  } catch (...) {
    optimizer_.restore(saved_);
    at = 0;
    for (const Span& s : owned_) {
      k_.copy(buf_.params + s.offset, saved_owned_.data() + at, s.numel);
      at += s.numel;
    }
    throw;
  }
}

void Stage2::gather_buckets(float* params) {
  const size_t w = static_cast<size_t>(layout_.world_size);
  const size_t r = static_cast<size_t>(comm_->rank());
  for (size_t k = 0; k < launcher_.buckets().size(); ++k) {
    const Span& b = launcher_.buckets()[k];
    const size_t chunk = owned_[k].numel;
    if (chunk <= allgather_piece_) {
      comm_->all_gather(buffer(params + owned_[k].offset, chunk),
                        buffer(params + b.offset, b.numel), {phase::kStep});
      continue;
    }
    // The bucket is larger than one all-gather: gather it piece by piece
    // through the gather buffer, then put each rank's piece in place.
    for (size_t at = 0; at < chunk; at += allgather_piece_) {
      const size_t piece = std::min(allgather_piece_, chunk - at);
      comm_->all_gather(buffer(params + b.offset + r * chunk + at, piece),
                        buffer(gather_staging_.data(), piece * w),
                        {phase::kStep});
      for (size_t q = 0; q < w; ++q)
        k_.copy(params + b.offset + q * chunk + at,
                gather_staging_.data() + q * piece, piece);
    }
  }
}

MemoryStats Stage2::memory() const {
  MemoryStats m = FlatStage::memory();
  m.grad_bytes += reduce_scratch_.bytes();
  for (size_t i = 0; i < slots_.size(); ++i)
    m.grad_bytes += slots_[i].bytes() + slot_scratch_[i].bytes();
  m.param_bytes += gather_staging_.bytes();
  m.rollback_bytes += saved_owned_.bytes();
  // Everything is allocated up front (the pool grows only for a model
  // whose parameters complete out of order): the peak is what is resident.
  m.peak_bytes = m.param_bytes + m.grad_bytes + m.optimizer_state_bytes +
                 m.rollback_bytes;
  return m;
}

}  // namespace zerostep
