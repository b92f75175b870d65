#include "zero/stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>
#include <variant>
#include <vector>

#include "common/errors.h"
#include "zero/stage0.h"
#include "zero/stage1.h"
#include "zero/stage2.h"

namespace zerostep {

bool partitions_master(const StageOptions& options) {
  if (const auto* s1 = std::get_if<Stage1Options>(&options.per_stage))
    return s1->bf16_weights;
  if (const auto* s2 = std::get_if<Stage2Options>(&options.per_stage))
    return s2->bf16_weights;
  return false;
}

bool partitions_gradients(const StageOptions& options) {
  const auto* s2 = std::get_if<Stage2Options>(&options.per_stage);
  return s2 != nullptr && !s2->reduce_once_per_step &&
         !s2->collectives_outside_backward;
}

std::unique_ptr<Stage> make_stage(const StageOptions& options,
                                  FlatBuffers buffers, Communicator* comm) {
  ZS_CHECK(comm != nullptr);
  // Note [Partitioned master]: no full parameter buffer exactly then.
  ZS_CHECK((buffers.params == nullptr) == partitions_master(options));
  ZS_CHECK((buffers.weights != nullptr) == partitions_master(options));
  // Note [Stage 2 buckets]: no full gradient buffer exactly then.
  ZS_CHECK((buffers.grads == nullptr) == partitions_gradients(options));
  ZS_CHECK(options.layout.world_size == comm->world_size());
  struct Make {
    const StageOptions& options;
    FlatBuffers buffers;
    Communicator* comm;
    std::unique_ptr<Stage> operator()(const Stage0Options& own) const {
      return std::make_unique<Stage0>(options, own, buffers, comm);
    }
    std::unique_ptr<Stage> operator()(const Stage1Options& own) const {
      return std::make_unique<Stage1>(options, own, buffers, comm);
    }
    std::unique_ptr<Stage> operator()(const Stage2Options& own) const {
      return std::make_unique<Stage2>(options, own, buffers, comm);
    }
    std::unique_ptr<Stage> operator()(const Stage3Options&) const {
      throw UsageError(
          "zero_optimization.stage = 3 is not one make_stage() builds "
          "(stages 0, 1 and 2; the Engine builds stage 3, which needs its "
          "LibTorch storages). Fix: use stage 0, 1, 2, or an Engine for "
          "stage 3");
    }
  };
  return std::visit(Make{options, buffers, comm}, options.per_stage);
}

FlatStage::FlatStage(const StageOptions& options, FlatBuffers buffers,
                     Communicator* comm, int stage, std::vector<Span> owned)
    : layout_(options.layout),
      k_(options.kernels != nullptr ? *options.kernels : host_kernels()),
      buf_(buffers),
      comm_(comm),
      partitioned_(stage > 0),
      owned_(std::move(owned)),
      owned_numel_(0),
      optimizer_(options.optimizer, [&] {
        size_t n = 0;
        for (const Span& s : owned_) n += s.numel;
        return n;
      }(), AdamKernel::kFused, options.optimizer_swap, &k_),
      averaging_(averaging_steps(options.averaging, stage,
                                 options.layout.world_size)) {
  ZS_CHECK(stage >= 0 && stage <= 2);
  for (const Span& s : owned_) {
    ZS_CHECK(s.offset + s.numel <= layout_.padded_numel);
    owned_numel_ += s.numel;
  }
  // Note [Partitioned master]: the owned master, from the model's weights.
  if (buf_.weights != nullptr) {
    weights_ = buf_.weights;
    master_ = k_.allocate(owned_numel_);
    size_t at = 0;
    for (const Span& s : owned_) {
      weights_->read(s.offset, master_.data() + at, s.numel);
      at += s.numel;
    }
  }
  // Stage 2's chunks of several buckets: the optimizer steps them piece
  // by piece, but a swapped state streams one span, gathered here.
  if (owned_.size() > 1 && !optimizer_.steps_pieces())
    owned_params_ = k_.allocate(owned_numel_);
  // Stages 1/2 keep a snapshot of the optimizer state to undo a failed
  // update (Note [Transactional update]); allocated now, so that memory()
  // at construction is what the stage holds for its lifetime.
  if (partitioned_) optimizer_.save(&saved_);
}

GradStats FlatStage::finalize(double divisor, double clip) {
  return finalize_owned(1.0, divisor, clip);
}

GradStats FlatStage::finalize_owned(double sum_divisor, double divisor,
                                    double clip) {
  ZS_CHECK(owned_grad_ != nullptr);
  if (averaging_.scaled)
    return internal::finalize_gradient(k_, partitioned_ ? comm_ : nullptr,
                                       owned_grad_, owned_numel_, 1.0,
                                       divisor, clip, averaging_.after);
  return internal::finalize_gradient(k_, partitioned_ ? comm_ : nullptr,
                                     owned_grad_, owned_numel_, sum_divisor,
                                     divisor, clip);
}

std::vector<Segment> FlatStage::owned_segments() const {
  // Stages 0-2 lay the flat buffer out in canonical order: a span's offset
  // is its canonical offset, cut at the padding.
  std::vector<Segment> out;
  size_t at = 0;
  for (const Span& s : owned_) {
    if (s.offset < layout_.numel)
      out.push_back({at, s.offset, std::min(s.numel, layout_.numel - s.offset)});
    at += s.numel;
  }
  return out;
}

std::vector<float> FlatStage::owned_parameters() const {
  std::vector<float> out(owned_numel_);
  if (master_partitioned()) {
    k_.download(out.data(), master_.data(), owned_numel_);
    return out;
  }
  size_t at = 0;
  for (const Span& s : owned_) {
    k_.download(out.data() + at, buf_.params + s.offset, s.numel);
    at += s.numel;
  }
  return out;
}

namespace {
// Scatters canonical `full` into a state vector of `n` elements along
// `segments` (zero elsewhere: padding); empty `full` gives empty.
std::vector<float> owned_from_canonical(const std::vector<float>& full,
                                        const std::vector<Segment>& segments,
                                        size_t n) {
  if (full.empty()) return {};
  std::vector<float> out(n, 0.0f);
  for (const Segment& g : segments)
    std::memcpy(out.data() + g.state_offset, full.data() + g.canonical_offset,
                g.numel * sizeof(float));
  return out;
}
}  // namespace

void FlatStage::load_state(const std::vector<float>& params,
                           const std::vector<float>& exp_avg,
                           const std::vector<float>& exp_avg_sq,
                           int64_t optimizer_steps) {
  if (params.size() != layout_.numel)
    throw UsageError("checkpoint holds " + std::to_string(params.size()) +
                     " parameters; this model has " +
                     std::to_string(layout_.numel));
  const std::vector<Segment> segs = owned_segments();
  optimizer_.load_state(optimizer_steps,
                        owned_from_canonical(exp_avg, segs, owned_numel_),
                        owned_from_canonical(exp_avg_sq, segs, owned_numel_));
  if (master_partitioned()) {
    // Note [Partitioned master]: the owned master, and the model's
    // weights from the whole (through the kernels' memory off the host).
    const std::vector<float> owned =
        owned_from_canonical(params, segs, owned_numel_);
    k_.upload(master_.data(), owned.data(), owned_numel_);
    std::vector<float> all(layout_.padded_numel, 0.0f);
    std::copy(params.begin(), params.end(), all.begin());
    if (k_.host_addressable()) {
      weights_->publish(0, all.data(), all.size());
      return;
    }
    DeviceArray on_device = k_.allocate(all.size());
    k_.upload(on_device.data(), all.data(), all.size());
    weights_->publish(0, on_device.data(), all.size());
    return;
  }
  // Every rank holds the whole flat buffer at stages 0-2: write it all.
  k_.upload(buf_.params, params.data(), params.size());
  k_.zero(buf_.params + layout_.numel, layout_.padded_numel - layout_.numel);
}

void FlatStage::gather_owned(
    const float* owned, size_t piece, float* staging,
    const std::function<void(size_t, const float*, size_t)>& put) {
  // Each span is the same-numbered span of every rank (a stage 1
  // partition, a stage 2 bucket's chunk), `numel` long on each: rank q's
  // lies (q - r) spans' lengths from this rank's.
  const int w = layout_.world_size;
  const int r = comm_->rank();
  size_t at = 0;
  for (const Span& s : owned_) {
    for (size_t i = 0; i < s.numel; i += piece) {
      const size_t n = std::min(piece, s.numel - i);
      comm_->all_gather(buffer(const_cast<float*>(owned) + at + i, n),
                        buffer(staging, n * w), {phase::kStep});
      for (int q = 0; q < w; ++q)
        put(s.offset + static_cast<size_t>(q - r) * s.numel + i,
            staging + static_cast<size_t>(q) * n, n);
    }
    at += s.numel;
  }
}

void FlatStage::gather_master(float* out) {
  ZS_CHECK(master_partitioned());
  size_t largest = 0;
  for (const Span& s : owned_) largest = std::max(largest, s.numel);
  const size_t piece = std::min<size_t>(largest, size_t{1} << 20);
  DeviceArray staging = k_.allocate(piece * layout_.world_size);
  gather_owned(master_.data(), piece, staging.data(),
               [&](size_t offset, const float* values, size_t n) {
                 k_.download(out + offset, values, n);
               });
}

void FlatStage::update_owned(const OptimizerHyper& hyper, float* target,
                             const float* packed) {
  size_t at = 0;
  // Into `target` straight from the parameters, one piece per owned span
  // (Note [Update out of place] in offload/fused_adam.h).
  if (owned_.size() == 1 || optimizer_.steps_pieces()) {
    std::vector<FlatOptimizer::Piece> pieces;
    for (const Span& s : owned_) {
      pieces.push_back({packed != nullptr ? packed + at : buf_.params + s.offset,
                        target + s.offset, at, s.numel});
      at += s.numel;
    }
    optimizer_.step(pieces, owned_grad_, hyper);
    return;
  }
  for (const Span& s : owned_) {
    k_.copy(owned_params_.data() + at, buf_.params + s.offset, s.numel);
    at += s.numel;
  }
  optimizer_.step(owned_params_.data(), owned_grad_, hyper);
  at = 0;
  for (const Span& s : owned_) {
    k_.copy(target + s.offset, owned_params_.data() + at, s.numel);
    at += s.numel;
  }
}

void FlatStage::staged_update(
    const OptimizerHyper& hyper,
    const std::function<void(float* staged)>& gather) {
  // The full gradient buffer is free: the window's gradient now lives in
  // the owned partition (owned_grad_), which the optimizer reads.
  ZS_CHECK(partitioned_);
  ZS_CHECK(owned_grad_ != buf_.grads);
  float* staged = buf_.grads;
  optimizer_.save(&saved_);
  try {
    internal::step_and_agree(*comm_, optimizer_.swapped(),
                             [&] { update_owned(hyper, staged); });
    gather(staged);
    optimizer_.commit();  // NVMe: the new moments count from here
  } catch (...) {
    optimizer_.restore(saved_);
    throw;
  }
  // The staged values become the parameters: the buffers' owner trades
  // their memory where it can (FlatBuffers::exchange), else a copy.
  if (buf_.exchange && buf_.exchange()) {
    std::swap(buf_.params, buf_.grads);
    return;
  }
  k_.copy(buf_.params, staged, layout_.padded_numel);
}

void FlatStage::zero_grad() {
  k_.zero(buf_.grads, layout_.padded_numel);
  if (partitioned_) k_.zero(owned_grad_, owned_numel_);
}

MemoryStats FlatStage::memory() const {
  MemoryStats m;
  // Note [Partitioned master]: the owned master instead of a full buffer.
  m.param_bytes = master_partitioned()
                      ? master_.bytes()
                      : layout_.padded_numel * sizeof(float);
  m.grad_bytes = (buf_.grads != nullptr ? layout_.padded_numel : 0) *
                     sizeof(float) +
                 (partitioned_ ? owned_numel_ * sizeof(float) : 0);
  m.optimizer_state_bytes =
      optimizer_.state_bytes() + owned_params_.bytes();
  m.rollback_bytes = optimizer_.rollback_bytes();
  // Stages 0-2 allocate everything up front: the peak is what is resident.
  m.peak_bytes = m.param_bytes + m.grad_bytes + m.optimizer_state_bytes +
                 m.rollback_bytes;
  return m;
}

namespace internal {

void step_and_agree(Communicator& comm, bool swapped,
                    const std::function<void()>& step) {
  if (!swapped) {
    step();
    return;
  }
  std::exception_ptr mine;
  try {
    step();
  } catch (const Error&) {
    mine = std::current_exception();
  }
  const int w = comm.world_size();
  int64_t flag = mine ? 1 : 0;
  std::vector<int64_t> all(w);
  comm.all_gather(Buffer::of(&flag, 1), Buffer::of(all.data(), all.size()),
                  {phase::kStep});
  if (mine) std::rethrow_exception(mine);
  std::string failed;
  for (int r = 0; r < w; ++r)
    if (all[r] != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (failed.empty()) return;
  throw CommError("the optimizer step failed on rank(s) " + failed +
                  " (their offloaded optimizer state's device; see their "
                  "error), so no rank applies this update");
}

void agree_on_window(Communicator& comm, WindowEvent event, int64_t count,
                     int64_t global_steps) {
  const int w = comm.world_size();
  int64_t mine[3] = {static_cast<int64_t>(event), count, global_steps};
  std::vector<int64_t> all(3 * w);
  comm.all_gather(Buffer::of(mine, 3), Buffer::of(all.data(), all.size()),
                  {event == WindowEvent::kStep ? phase::kStep
                                               : phase::kBackward});
  bool agree = true;
  for (int r = 1; r < w; ++r)
    for (int i = 0; i < 3; ++i) agree = agree && all[3 * r + i] == all[i];
  if (agree) return;
  std::ostringstream os;
  os << "ranks disagree on the accumulation window (rank " << comm.rank()
     << " reporting): ";
  for (int r = 0; r < w; ++r) {
    const int64_t* a = &all[3 * r];
    os << (r ? ", " : "") << "rank " << r;
    if (a[0] == static_cast<int64_t>(WindowEvent::kStep)) {
      os << " ran " << a[1] << " backward() call" << (a[1] == 1 ? "" : "s")
         << " and steps";
    } else {
      os << " starts backward() number " << a[1] << " of the window";
    }
    os << " at global step " << a[2];
  }
  os << ". Every rank must call backward() the same number of times before "
        "each step(); no gradient of this call was reduced and no parameter "
        "was updated";
  throw UsageError(os.str());
}

bool reduces_into_partition(const Communicator& comm, Precision grad_accum) {
  return comm.reduce_scatter_accumulates() && grad_accum == Precision::kFp32;
}

GradStats finalize_gradient(Kernels& k, Communicator* partition_comm,
                            float* grad, size_t n, double sum_divisor,
                            double divisor, double clip, float after_sum) {
  // Note [Gradient averaging]: DeepSpeed scales the sum before anything.
  ZS_CHECK(after_sum == 1.0f || sum_divisor == 1.0);
  if (after_sum != 1.0f) k.scale(grad, n, after_sum);
  // One pass where the kernels fuse it: / sum_divisor, / divisor, squares.
  GradStats stats;
  double sq = k.divide_and_sum_of_squares(grad, n, sum_divisor, divisor);
  // A replicated gradient's local norm is the global one; a partition's is
  // not (one 8-byte all-reduce per step, in both modes; a host value).
  if (partition_comm != nullptr)
    partition_comm->all_reduce(Buffer::of(&sq, 1),
                               {ReduceOp::kSum, phase::kStep});
  stats.global_norm = std::sqrt(sq);
  const float coef = clip_coefficient(stats.global_norm, clip);
  if (coef < 1.0f) {
    k.scale(grad, n, coef);
    stats.clipped = true;
  }
  return stats;
}

float clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

}  // namespace internal
}  // namespace zerostep
