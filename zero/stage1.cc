#include "zero/stage1.h"

#include <algorithm>

#include "zero/stage2.h"

namespace zerostep {

namespace internal {
size_t stage1_reduce_piece(const FlatLayout& layout, int64_t bucket_size) {
  const size_t p = layout.partition_numel;
  if (bucket_size <= 0 || static_cast<size_t>(bucket_size) >= layout.padded_numel)
    return p;
  return std::min(p, aligned_elements(bucket_size / layout.world_size));
}
}  // namespace internal

Stage1::Stage1(const StageOptions& options, const Stage1Options& own,
               FlatBuffers buffers, Communicator* comm)
    : FlatStage(options, buffers, comm, /*stage=*/1,
                {Span{options.layout.partition_begin(comm->rank()),
                      options.layout.partition_numel}}),
      grad_partition_(k_.allocate(options.layout.partition_numel)),
      piece_(internal::stage1_reduce_piece(options.layout,
                                           own.reduce_bucket_size)) {
  set_owned_grad(grad_partition_.data());
  if (piece_ < owned_numel_)
    reduce_staging_ = k_.allocate(piece_ * layout_.world_size);
}

MemoryStats Stage1::memory() const {
  MemoryStats m = FlatStage::memory();
  m.grad_bytes += reduce_staging_.bytes();
  m.peak_bytes += reduce_staging_.bytes();
  return m;
}

void Stage1::reduce_window(int64_t window_backwards, int64_t global_steps,
                           const char* phase) {
  internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                            window_backwards, global_steps);
  // Note [Gradient averaging] in zero/averaging.h.
  scale_before_sum(k_, averaging_, buf_.grads, layout_.padded_numel);
  const ReduceScatterOptions opts{
      averaging_.scaled ? ReduceOp::kSum : ReduceOp::kAvg, phase};
  if (reduce_staging_.size() == 0) {
    comm_->reduce_scatter(buffer(buf_.grads, layout_.padded_numel),
                          buffer(owned_grad_, owned_numel_), opts);
    return;
  }
  // Note [Stage 1 reduce buckets].
  const size_t w = static_cast<size_t>(layout_.world_size);
  for (size_t at = 0; at < owned_numel_; at += piece_) {
    const size_t n = std::min(piece_, owned_numel_ - at);
    for (size_t q = 0; q < w; ++q)
      k_.copy(reduce_staging_.data() + q * n,
              buf_.grads + q * owned_numel_ + at, n);
    comm_->reduce_scatter(buffer(reduce_staging_.data(), n * w),
                          buffer(owned_grad_ + at, n), opts);
  }
}

void Stage1::apply_update(const OptimizerHyper& hyper) {
  if (master_partitioned()) {
    update_master(hyper);
    return;
  }
  // Note [Transactional update]: update and gather in the staging buffer.
  staged_update(hyper, [&](float* staged) {
    comm_->all_gather(buffer(staged + owned_[0].offset, owned_numel_),
                      buffer(staged, layout_.padded_numel),
                      {phase::kStep});
  });
}

// Note [Partitioned master]: the update on a copy of the owned master in
// the full gradient buffer (free now: the window's gradient is in the
// partition), gathered there, and published only once the gather
// succeeded; a failure restores the optimizer and leaves the master and
// the model's weights as they were.
void Stage1::update_master(const OptimizerHyper& hyper) {
  float* staged = buf_.grads;
  float* mine = staged + owned_[0].offset;
  optimizer_.save(&saved_);
  try {
    // Out of place: the master keeps the old values that commit() reads
    // (Note [Moments written at commit] in zero/optimizer.h).
    internal::step_and_agree(*comm_, optimizer_.swapped(), [&] {
      optimizer_.step(master_.data(), mine, owned_grad_, hyper);
    });
    comm_->all_gather(buffer(mine, owned_numel_),
                      buffer(staged, layout_.padded_numel), {phase::kStep});
    optimizer_.commit();
  } catch (...) {
    optimizer_.restore(saved_);
    throw;
  }
  weights_->publish(0, staged, layout_.padded_numel);
  k_.copy(master_.data(), mine, owned_numel_);
}

}  // namespace zerostep
