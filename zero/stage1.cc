#include "zero/stage1.h"

namespace zerostep {

Stage1::Stage1(const StageOptions& options, FlatBuffers buffers,
               Communicator* comm)
    : FlatStage(options, buffers, comm, /*stage=*/1,
                {Span{options.layout.partition_begin(comm->rank()),
                      options.layout.partition_numel}}),
      grad_partition_(k_.allocate(options.layout.partition_numel)) {
  set_owned_grad(grad_partition_.data());
}

void Stage1::reduce_window(int64_t window_backwards, int64_t global_steps,
                           const char* phase) {
  internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                            window_backwards, global_steps);
  // Note [Gradient averaging] in zero/averaging.h.
  scale_before_sum(k_, averaging_, buf_.grads, layout_.padded_numel);
  comm_->reduce_scatter(
      buffer(buf_.grads, layout_.padded_numel),
      buffer(owned_grad_, owned_numel_),
      {averaging_.scaled ? ReduceOp::kSum : ReduceOp::kAvg, phase});
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
  k_.copy(mine, master_.data(), owned_numel_);
  optimizer_.save(&saved_);
  try {
    internal::step_and_agree(*comm_, optimizer_.swapped(), [&] {
      optimizer_.step(mine, owned_grad_, hyper);
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
