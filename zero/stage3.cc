#include "zero/stage3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "offload/swap_store.h"

namespace zerostep {
namespace {

// Runs issue(i) for i in [0, n), which returns an asynchronous collective
// or nullptr (nothing to do for i), until one throws; then waits for every
// collective issued, in issue order, calling done(i) after each while none
// has failed. Rethrows the first error once nothing issued is in flight, so
// no transfer outlives the call.
template <typename Issue, typename Done>
void in_flight_at_once(size_t n, Issue issue, Done done) {
  std::vector<std::pair<size_t, std::shared_ptr<Work>>> works;
  std::exception_ptr failed;
  try {
    for (size_t i = 0; i < n; ++i)
      if (std::shared_ptr<Work> w = issue(i)) works.emplace_back(i, w);
  } catch (...) {
    failed = std::current_exception();
  }
  for (auto& [i, w] : works) try {
      w->wait();
      if (!failed) done(i);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace

Stage3::Stage3(const StageOptions& options, const Stage3Options& own,
               std::vector<Stage3Group> groups,
               const std::vector<size_t>& param_numels, Stage3Initial& initial,
               GroupStorage* storage, Communicator* comm)
    : groups_(std::move(groups)),
      param_offset_(param_numels.size(), 0),
      param_numel_(param_numels),
      group_of_(param_numels.size(), 0),
      k_(options.kernels != nullptr ? *options.kernels : host_kernels()),
      gk_(own.group_kernels != nullptr ? *own.group_kernels : k_),
      storage_(storage),
      comm_(comm),
      grad_accum_(own.grad_accum),
      reduce_once_(own.reduce_once_per_step),
      gather_once_(own.gather_once_per_step),
      outside_backward_(own.collectives_outside_backward),
      world_(comm->world_size()),
      rank_(comm->rank()),
      averaging_(averaging_steps(options.averaging, 3, comm->world_size())),
      optimizer_(
          options.optimizer,
          [&] {
            size_t n = 0;
            for (const Stage3Group& g : groups_)
              n += zerostep::padded_numel(g.numel, comm->world_size()) /
                   comm->world_size();
            return n;
          }(),
          AdamKernel::kFused, options.optimizer_swap, &k_) {
  ZS_CHECK(storage_ != nullptr);
  // Note [Stage 3 offload from a device]: partitions apart from the groups
  // are the host's.
  ZS_CHECK(&gk_ == &k_ || k_.host_addressable());
  size_t canonical = 0;
  for (size_t n : param_numels) {
    canonical_offset_.push_back(canonical);
    canonical += n;
  }
  size_t virtual_offset = 0;  // groups laid out back to back, padded
  for (size_t g = 0; g < groups_.size(); ++g) {
    size_t at = 0;
    for (size_t p : groups_[g].params) {
      ZS_CHECK(p < param_numels.size());
      group_of_[p] = g;
      param_offset_[p] = at;
      at += param_numels[p];
    }
    ZS_CHECK(at == groups_[g].numel);
    const size_t padded = zerostep::padded_numel(at, world_);
    padded_.push_back(padded);
    partition_.push_back(padded / world_);
    part_offset_.push_back(owned_numel_);
    owned_.push_back({virtual_offset + rank_ * partition_[g], partition_[g]});
    owned_numel_ += partition_[g];
    virtual_offset += padded;
  }
  ZS_CHECK(optimizer_.numel() == owned_numel_);
  size_t largest = 0;
  for (size_t n : partition_) largest = std::max(largest, n);
  const ParamSwap& swap = own.param_swap;
  if (swap.device != nullptr) {
    // Note [NVMe parameter partitions].
    if (!k_.host_addressable())
      throw UsageError("Stage3: offload_param keeps the partitions on the "
                       "host, and the kernels' memory is " + k_.device() +
                       "'s. Fix: train a model on the CPU with "
                       "offload_param, or drop offload_param");
    if (swap.sub_group_numel < 1 || swap.buffer_count < 2)
      throw UsageError("Stage3: offload_param needs sub_group_numel >= 1 and "
                       "buffer_count >= 2 (got " +
                       std::to_string(swap.sub_group_numel) + " and " +
                       std::to_string(swap.buffer_count) + ")");
    SwapStoreOptions o;
    o.num_arrays = 1;
    o.numel = owned_numel_;
    o.subgroup_numel = std::min(swap.sub_group_numel, largest);
    o.buffer_count = swap.buffer_count;
    param_store_ = std::make_unique<SwapStore>(swap.device, o);
    part_scratch_.assign(largest, 0.0f);
  } else {
    part_params_ = k_.allocate(owned_numel_);
    // Note [Transactional update]: the spare is held for the stage's life;
    // the whole partition only where the update gathers every group.
    full_spare_ = gather_once_ || optimizer_.swapped();
    size_t spare = full_spare_ ? owned_numel_ : 0;
    if (!full_spare_)
      for (size_t g = 0; g < groups_.size(); ++g) {
        spare_offset_.push_back(spare);
        if (groups_[g].persistent) spare += partition_[g];
      }
    saved_params_ = k_.allocate(spare);
  }
  part_grads_ = k_.allocate(owned_numel_);
  fused_ = internal::reduces_into_partition(*comm_, grad_accum_);
  optimizer_.save(&saved_optimizer_);
  // Note [Reduce once per step]: every group's chunk at once.
  scratch_ = k_.allocate(reduce_once_ ? owned_numel_ : largest);
  full_params_.assign(groups_.size(), nullptr);
  full_grads_.assign(groups_.size(), nullptr);
  param_slot_.assign(groups_.size(), GroupStorage::kOwn);
  grad_slot_.assign(groups_.size(), GroupStorage::kOwn);
  for (size_t g = 0; g < groups_.size(); ++g)
    if (!groups_[g].persistent) slot_numel_ = std::max(slot_numel_, padded_[g]);
  refs_.assign(groups_.size(), 0);
  // Note [Stage 3 prefetch]: where it can help.
  if (world_ > 1 && !param_store_ && !outside_backward_ &&
      comm->overlaps_async())
    prefetch_numel_ = own.prefetch_numel;
  max_live_numel_ = own.max_live_numel;
  // Note [Stage 3 reduce-scatter in flight]: where it can help.
  if (own.overlap_comm && world_ > 1 && fused_ && !reduce_once_ &&
      comm->overlaps_async())
    in_flight_limit_ =
        static_cast<size_t>(std::max<int64_t>(1, own.reduce_bucket_size));
  kept_ = stage3_kept_for_backward(groups_, own.reuse_distance_numel);
  reduced_.assign(groups_.size(), false);
  pending_.assign(groups_.size(), 0);
  // Note [Stage 3 initial values]: group by group; with the partitions on
  // NVMe they are written once all are known (the store's sub-groups span
  // groups), from the host.
  std::vector<float> host;
  if (!param_store_ && !k_.host_addressable()) host.resize(largest);
  std::vector<float> stored(param_store_ ? owned_numel_ : 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const size_t first = rank_ * partition_[g];
    float* to = param_store_ ? stored.data() + part_offset_[g]
                             : part_params_.data() + part_offset_[g];
    const bool to_host = param_store_ || k_.host_addressable();
    if (!groups_[g].persistent &&
        initial.partition(g, first, partition_[g],
                          to_host ? to : host.data())) {
      if (!to_host) k_.upload(to, host.data(), partition_[g]);
      continue;
    }
    float* full = initial.full(g);
    ZS_CHECK(full != nullptr);
    if (param_store_)
      gk_.download(to, full + first, partition_[g]);
    else if (&gk_ == &k_)
      k_.copy(to, full + first, partition_[g]);
    else  // from the device's storage to the host
      gk_.download(to, full + first, partition_[g]);
    // The others' full storage is the engine's to free (their pool slots
    // come with the first use).
    if (groups_[g].persistent) {
      full_params_[g] = full;
      full_grads_[g] = storage_->materialize_grads(g, GroupStorage::kOwn);
    }
  }
  if (param_store_) {
    // Whatever the device held before is not this run's state: the first
    // generation is written whole.
    param_store_->write_all([&](const SwapSubgroup& s) {
      std::copy(stored.data() + s.first, stored.data() + s.first + s.count,
                s.arrays[0]);
    });
  }
  reset_peak();
}

Stage3::~Stage3() {
  // Note [Stage 3 prefetch], Note [Stage 3 reduce-scatter in flight]: no
  // transfer may outlive the storage it reads or writes.
  if (ahead_work_) try {
      ahead_work_->wait();
    } catch (...) {
    }
  for (auto& [g, w] : in_flight_) try {
      w->wait();
    } catch (...) {
    }
}

size_t Stage3::current_bytes() const {
  const MemoryStats m = memory();
  return m.param_bytes + m.grad_bytes + m.optimizer_state_bytes +
         m.rollback_bytes;
}

MemoryStats Stage3::memory() const {
  MemoryStats m;
  // Offloaded: the partitions are on the device; what is resident is the
  // read scratch, the store's buffers and, during an update, step_params_.
  m.param_bytes =
      (part_params_.size() + part_scratch_.size() + step_params_.size()) *
      sizeof(float);
  if (param_store_) m.param_bytes += param_store_->buffer_bytes();
  m.grad_bytes = (part_grads_.size() + scratch_.size()) * sizeof(float);
  // Note [Stage 3 buffer pool]: every slot stays resident, in use or not.
  m.param_bytes += param_slots_ * slot_numel_ * sizeof(float);
  m.grad_bytes += grad_slots_ * slot_numel_ * sizeof(float);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].persistent) m.param_bytes += padded_[g] * sizeof(float);
    // Persistent groups, and with reduce_once_per_step every group once
    // it has had a backward: the group's own full gradient storage.
    if (grad_slot_[g] == GroupStorage::kOwn && full_grads_[g] != nullptr)
      m.grad_bytes += padded_[g] * sizeof(float);
  }
  m.optimizer_state_bytes = optimizer_.state_bytes();
  m.rollback_bytes = rollback_bytes();
  m.peak_bytes = peak_bytes_;
  return m;
}

size_t Stage3::rollback_bytes() const {
  return saved_params_.bytes() + optimizer_.rollback_bytes();
}

void Stage3::note_memory() {
  peak_bytes_ = std::max(peak_bytes_, current_bytes());
}

float* Stage3::partition_of(size_t g) {
  if (!param_store_) return part_params_.data() + part_offset_[g];
  param_store_->read_range(0, part_offset_[g], partition_[g],
                           part_scratch_.data());
  return part_scratch_.data();
}

void Stage3::gather(size_t g, const char* phase) {
  ZS_CHECK(g < groups_.size());
  // Note [Stage 3 prefetch]: the group ahead is this one (now gathered),
  // or it goes.
  const bool was_ahead = ahead_ == g;
  const bool backward = std::strcmp(phase, phase::kBackward) == 0;
  settle_prefetch(g);
  if (refs_[g] > 0 || full_params_[g] != nullptr) {
    ++refs_[g];
    // A group kept from its forward (Note [Stage 3 reuse distance])
    // fetches the one its backward is followed by.
    if (was_ahead || backward) prefetch_after(g, backward, phase);
    return;
  }
  // Read before anything changes: a failed read leaves no reference and no
  // storage behind (Note [NVMe parameter partitions]).
  float* part = partition_of(g);
  ++refs_[g];
  take_params(g);
  comm_->all_gather(buffer(part, partition_[g]),
                    group_buffer(full_params_[g], padded_[g]), {phase});
  storage_->params_written(g);
  prefetch_after(g, backward, phase);
}

void Stage3::prefetch_after(size_t g, bool backward, const char* phase) {
  if (prefetch_numel_ == 0 || ahead_ != kNone) return;
  size_t next = g;
  do {
    if (backward ? next == 0 : next + 1 >= groups_.size()) return;
    next = backward ? next - 1 : next + 1;
  } while (groups_[next].persistent);
  if (padded_[next] > prefetch_numel_ || full_params_[next] != nullptr ||
      live_numel() + groups_[next].numel > max_live_numel_)
    return;
  take_params(next);
  try {
    ahead_work_ = comm_->all_gather_async(
        buffer(partition_of(next), partition_[next]),
        group_buffer(full_params_[next], padded_[next]), {phase});
  } catch (...) {
    drop_params(next);
    throw;
  }
  ahead_ = next;
}

void Stage3::settle_prefetch(size_t keep) {
  if (ahead_ == kNone) return;
  const size_t g = ahead_;
  ahead_ = kNone;
  std::shared_ptr<Work> work = std::move(ahead_work_);
  ahead_work_.reset();
  try {
    work->wait();
  } catch (...) {
    drop_params(g);
    throw;
  }
  // Note [Stage 3 gather once per step]: a group gathered ahead and not
  // used yet holds this step's values all the same.
  if (g == keep || gather_once_) {
    storage_->params_written(g);
  } else {
    ZS_CHECK(refs_[g] == 0);
    drop_params(g);
  }
}

void Stage3::release(size_t g) {
  ZS_CHECK(g < groups_.size());
  ZS_CHECK(refs_[g] > 0);
  // Note [Stage 3 gather once per step]: kept until the step.
  if (--refs_[g] > 0 || groups_[g].persistent || gather_once_) return;
  drop_params(g);
}

void Stage3::take_params(size_t g) {
  ZS_CHECK(!groups_[g].persistent);
  ZS_CHECK(param_slot_[g] == GroupStorage::kOwn);
  size_t slot = param_slots_;
  if (free_param_slots_.empty()) {
    ++param_slots_;
  } else {
    slot = free_param_slots_.back();
    free_param_slots_.pop_back();
  }
  param_slot_[g] = slot;
  full_params_[g] = storage_->materialize_params(g, slot);
  note_memory();
}

void Stage3::drop_params(size_t g) {
  ZS_CHECK(param_slot_[g] != GroupStorage::kOwn);
  storage_->release_params(g, param_slot_[g]);
  free_param_slots_.push_back(param_slot_[g]);
  param_slot_[g] = GroupStorage::kOwn;
  full_params_[g] = nullptr;
}

void Stage3::take_grads(size_t g) {
  ZS_CHECK(!groups_[g].persistent);
  ZS_CHECK(grad_slot_[g] == GroupStorage::kOwn);
  if (reduce_once_) {
    // Note [Reduce once per step]: the group's own storage, for good.
    full_grads_[g] = storage_->materialize_grads(g, GroupStorage::kOwn);
    note_memory();
    return;
  }
  size_t slot = grad_slots_;
  if (free_grad_slots_.empty()) {
    ++grad_slots_;
  } else {
    slot = free_grad_slots_.back();
    free_grad_slots_.pop_back();
  }
  grad_slot_[g] = slot;
  full_grads_[g] = storage_->materialize_grads(g, slot);
  note_memory();
}

void Stage3::drop_grads(size_t g) {
  ZS_CHECK(grad_slot_[g] != GroupStorage::kOwn);
  storage_->release_grads(g, grad_slot_[g]);
  free_grad_slots_.push_back(grad_slot_[g]);
  grad_slot_[g] = GroupStorage::kOwn;
  full_grads_[g] = nullptr;
}

void Stage3::gather_for_backward(size_t g) {
  if (outside_backward_ && full_params_[g] == nullptr)
    throw UsageError(
        "Stage3: group " + std::to_string(g) +
        " has no gathered parameters at its backward, and "
        "collectives_outside_backward forbids gathering them there (Note "
        "[Stage 3 collectives outside backward]): its forward ran without "
        "gradients, or its gathered parameters were dropped by a step or a "
        "load in between. Fix: run forward and backward in the same window, "
        "with gradients enabled");
  gather(g, phase::kBackward);
  if (full_grads_[g] == nullptr) take_grads(g);
}

size_t Stage3::live_numel() const {
  size_t n = 0;
  for (size_t g = 0; g < groups_.size(); ++g)
    if (!groups_[g].persistent && full_params_[g] != nullptr)
      n += groups_[g].numel;
  return n;
}

void Stage3::hold(size_t g) {
  ZS_CHECK(g < groups_.size());
  ZS_CHECK(keeps_for_backward(g));
  ZS_CHECK(refs_[g] > 0);
  if (groups_[g].persistent) return;  // always gathered
  ++refs_[g];
}

void Stage3::drop_held() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].persistent || full_params_[g] == nullptr) continue;
    refs_[g] = 0;
    drop_params(g);
  }
}

bool Stage3::backward_communicates() const {
  if (!reduce_once_) return true;  // every group's reduce-scatter
  // A group not gathered now is gathered by its backward, or prefetched.
  for (size_t g = 0; g < groups_.size(); ++g)
    if (!groups_[g].persistent && full_params_[g] == nullptr) return true;
  return false;
}

void Stage3::begin_backward(int64_t backward_index, int64_t global_steps) {
  settle_in_flight(kNone);  // a backward that threw may have left some
  // Note [Window agreement] in zero/stage.h.
  if (backward_communicates())
    internal::agree_on_window(*comm_, internal::WindowEvent::kBackward,
                              backward_index, global_steps);
  for (size_t g = 0; g < groups_.size(); ++g) {
    pending_[g] = groups_[g].params.size();
    reduced_[g] = false;
  }
}

void Stage3::reduce_group(size_t g) {
  ZS_CHECK(full_grads_[g] != nullptr);
  storage_->grads_ready(g);
  if (reduce_once_) {
    // Note [Reduce once per step]: the gradient waits for the step.
    reduced_[g] = true;
    if (groups_[g].persistent) return;
    refs_[g] = 0;
    if (full_params_[g] != nullptr && !gather_once_) drop_params(g);
    return;
  }
  // Note [Gradient averaging] in zero/averaging.h.
  scale_before_sum(gk_, averaging_, full_grads_[g], padded_[g]);
  if (in_flight_limit_ != 0) {
    reduce_scatter_in_flight(g);
    return;
  }
  reduce_scatter_group(g, phase::kBackward);
}

void Stage3::reduce_scatter_in_flight(size_t g) {
  settle_in_flight(padded_[g]);
  in_flight_.emplace_back(
      g, comm_->reduce_scatter_async(
             group_buffer(full_grads_[g], padded_[g]),
             buffer(part_grads_.data() + part_offset_[g], partition_[g]),
             {ReduceOp::kSum, phase::kBackward, /*accumulate=*/true}));
  in_flight_numel_ += padded_[g];
  reduced_[g] = true;
  // The reduce-scatter reads the gradient only.
  if (groups_[g].persistent) return;
  refs_[g] = 0;
  if (full_params_[g] != nullptr && !gather_once_) drop_params(g);
}

void Stage3::settle_in_flight(size_t room) {
  auto fits = [&] {
    return room != kNone && in_flight_numel_ + room <= in_flight_limit_;
  };
  while (!in_flight_.empty() && !fits()) {
    const auto [g, w] = in_flight_.front();
    try {
      w->wait();
    } catch (...) {
      // The first failure: the rest are waited for, then it is rethrown;
      // none is summed (the backward failed).
      in_flight_.pop_front();
      for (auto& [h, x] : in_flight_) try {
          x->wait();
        } catch (...) {
        }
      in_flight_.clear();
      in_flight_numel_ = 0;
      throw;
    }
    in_flight_.pop_front();
    in_flight_numel_ -= padded_[g];
    sum_reduced_chunk(g, nullptr);
  }
}

void Stage3::reduce_scatter_group(size_t g, const char* phase) {
  // Note [Reduce-scatter into the partition] in zero/stage.h.
  float* into = fused_ ? part_grads_.data() + part_offset_[g] : scratch_.data();
  comm_->reduce_scatter(group_buffer(full_grads_[g], padded_[g]),
                        buffer(into, partition_[g]),
                        {ReduceOp::kSum, phase, fused_});
  sum_reduced_chunk(g, fused_ ? nullptr : scratch_.data());
}

void Stage3::sum_reduced_chunk(size_t g, const float* chunk) {
  if (chunk != nullptr)  // else the reduce-scatter added it already
    k_.accumulate(part_grads_.data() + part_offset_[g], chunk, partition_[g],
                  Precision::kFp32, grad_accum_);
  reduced_[g] = true;
  if (groups_[g].persistent || reduce_once_) {
    gk_.zero(full_grads_[g], padded_[g]);
    return;
  }
  drop_grads(g);
  // Its backward is over: the parameters go too (Note [Stage 3 gather once
  // per step]: not before the step).
  refs_[g] = 0;
  if (full_params_[g] != nullptr && !gather_once_) drop_params(g);
}

void Stage3::on_grad_ready(size_t param_index) {
  ZS_CHECK(param_index < group_of_.size());
  const size_t g = group_of_[param_index];
  ZS_CHECK(pending_[g] > 0);
  // Note [Stage 3 collectives outside backward]: end_backward() reduces.
  if (--pending_[g] == 0 && !reduced_[g] && !outside_backward_)
    reduce_group(g);
}

void Stage3::end_backward() {
  // Note [Stage 3 prefetch]: a group gathered ahead for a backward that
  // did not come goes first (the loop below may release its storage).
  settle_prefetch(kNone);
  // Groups whose parameters got no gradient in this backward (or only
  // some): reduce what they hold, in group order, so every rank issues the
  // same collectives.
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (reduced_[g]) continue;
    if (full_grads_[g] == nullptr) take_grads(g);
    reduce_group(g);
  }
  settle_in_flight(kNone);  // Note [Stage 3 reduce-scatter in flight]
}

void Stage3::reduce_window(int64_t window_backwards, int64_t global_steps,
                           const char* phase) {
  settle_in_flight(kNone);  // a backward that threw may have left some
  internal::agree_on_window(*comm_, internal::WindowEvent::kStep,
                            window_backwards, global_steps);
  if (!reduce_once_) return;
  // Note [Reduce once per step]: every group has its full gradient (each
  // backward ends with all of them, end_backward()); reduce every one, all
  // in flight at once, each into its own range of the scratch; sum them
  // into the partition in group order and clear them for the next window.
  in_flight_at_once(
      groups_.size(),
      [&](size_t g) {
        ZS_CHECK(full_grads_[g] != nullptr);
        scale_before_sum(gk_, averaging_, full_grads_[g], padded_[g]);
        float* into = fused_ ? part_grads_.data() : scratch_.data();
        return comm_->reduce_scatter_async(
            group_buffer(full_grads_[g], padded_[g]),
            buffer(into + part_offset_[g], partition_[g]),
            {ReduceOp::kSum, phase, fused_});
      },
      [&](size_t g) {
        sum_reduced_chunk(g,
                          fused_ ? nullptr : scratch_.data() + part_offset_[g]);
      });
}

GradStats Stage3::finalize(double divisor, double clip) {
  // The partition holds the sum over ranks: made the average first, in
  // the same pass.
  if (averaging_.scaled)
    return internal::finalize_gradient(k_, comm_, part_grads_.data(),
                                       part_grads_.size(), 1.0, divisor, clip,
                                       averaging_.after);
  return internal::finalize_gradient(k_, comm_, part_grads_.data(),
                                     part_grads_.size(), world_, divisor,
                                     clip);
}

void Stage3::apply_update(const OptimizerHyper& hyper) {
  // Note [Stage 3 prefetch]: a group gathered ahead holds the old values.
  settle_prefetch(kNone);
  drop_held();
  if (param_store_) {
    apply_update_offloaded(hyper);
    return;
  }
  // Note [Transactional update]: the update writes the new partition
  // beside the old one (Note [Update out of place] in
  // offload/fused_adam.h), which stays until the persistent groups'
  // all-gather has succeeded.
  if (!full_spare_) {
    apply_update_persistent_spare(hyper);
    return;
  }
  float* fresh = saved_params_.data();
  optimizer_.save(&saved_optimizer_);
  try {
    internal::step_and_agree(*comm_, optimizer_.swapped(), [&] {
      optimizer_.step(part_params_.data(), fresh, part_grads_.data(), hyper);
    });
    gather_updated([&](size_t g) { return fresh + part_offset_[g]; },
                   /*blocks=*/gather_once_);
    optimizer_.commit();  // NVMe: the new moments count from here
  } catch (...) {
    // A block group gathered (or half gathered) holds the new values.
    drop_held();
    optimizer_.restore(saved_optimizer_);
    throw;
  }
  // The new partition is the partition; the old one is the next update's
  // output.
  std::swap(part_params_, saved_params_);
  publish_persistent();
  if (gather_once_)
    for (size_t g = 0; g < groups_.size(); ++g)
      if (!groups_[g].persistent) storage_->params_written(g);
}

// Note [Transactional update] with a spare of the persistent groups only:
// their new partitions go to the spare and are gathered; the block
// groups' are written in place by commit() (Note [Moments written at
// commit] in zero/optimizer.h), which runs only once the gather has
// succeeded and cannot fail; a failure before it has changed nothing.
void Stage3::apply_update_persistent_spare(const OptimizerHyper& hyper) {
  std::vector<FlatOptimizer::Piece> pieces;
  for (size_t g = 0; g < groups_.size(); ++g) {
    float* own = part_params_.data() + part_offset_[g];
    const bool spare = groups_[g].persistent;
    pieces.push_back({own,
                      spare ? saved_params_.data() + spare_offset_[g] : own,
                      part_offset_[g], partition_[g], /*at_commit=*/!spare});
  }
  optimizer_.save(&saved_optimizer_);
  try {
    optimizer_.step(pieces, part_grads_.data(), hyper);
    gather_updated(
        [&](size_t g) { return saved_params_.data() + spare_offset_[g]; },
        /*blocks=*/false);
    optimizer_.commit();
  } catch (...) {
    drop_held();
    optimizer_.restore(saved_optimizer_);
    throw;
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].persistent)
      k_.copy(part_params_.data() + part_offset_[g],
              saved_params_.data() + spare_offset_[g], partition_[g]);
  publish_persistent();
}

// Persistent groups are whole on every rank: they are refreshed at once,
// through their gradient storage (reduced and zeroed by now) so that a
// failed gather leaves the parameters untouched. With `blocks` so is every
// block group, into a pool slot (Note [Stage 3 gather once per step]);
// without it they are gathered from the partitions when next used. Every
// all-gather is in flight at once; on failure all have ended before this
// throws (the caller drops the slots).
void Stage3::gather_updated(
    const std::function<const float*(size_t)>& partition, bool blocks) {
  in_flight_at_once(
      groups_.size(),
      [&](size_t g) -> std::shared_ptr<Work> {
        float* out = nullptr;
        if (groups_[g].persistent) {
          ZS_CHECK(full_grads_[g] != nullptr);
          out = full_grads_[g];
        } else if (blocks) {
          take_params(g);
          out = full_params_[g];
        } else {
          return nullptr;
        }
        return comm_->all_gather_async(
            buffer(const_cast<float*>(partition(g)), partition_[g]),
            group_buffer(out, padded_[g]), {phase::kStep});
      },
      [](size_t) {});
}

void Stage3::publish_persistent() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].persistent) continue;
    gk_.copy(full_params_[g], full_grads_[g], padded_[g]);
    gk_.zero(full_grads_[g], padded_[g]);
    storage_->params_written(g);
  }
}

// Note [NVMe parameter partitions]: read, update, gather the persistent
// groups, and only then commit the partitions to the store.
void Stage3::apply_update_offloaded(const OptimizerHyper& hyper) {
  step_params_.assign(owned_numel_, 0.0f);
  note_memory();
  optimizer_.save(&saved_optimizer_);
  try {
    // Every rank reads its partitions, steps and prepares the new ones on
    // its devices; a device error on any rank stops all of them here
    // (Note [Transactional update]).
    internal::step_and_agree(*comm_, /*swapped=*/true, [&] {
      float* arrays[1] = {step_params_.data()};
      param_store_->read_arrays(arrays);
      optimizer_.step(step_params_.data(), part_grads_.data(), hyper);
      param_store_->prepare_update([&](const SwapSubgroup& sg) {
        std::memcpy(sg.arrays[0], step_params_.data() + sg.first,
                    sg.count * sizeof(float));
      });
    });
    // The forward gathers the blocks (Note [Stage 3 gather once per step]).
    gather_updated([&](size_t g) { return step_params_.data() + part_offset_[g]; },
                   /*blocks=*/false);
    // In memory the moments are written at commit from the old parameters
    // (Note [Moments written at commit] in zero/optimizer.h): the store
    // still holds them until its commit.
    if (!optimizer_.swapped())
      param_store_->read_range(0, 0, owned_numel_, step_params_.data());
    // The commits: old partitions and moments or new ones, never a mix
    // (but for the indeterminate commit of zero/optimizer.h).
    param_store_->commit_prepared();
    optimizer_.commit();
  } catch (...) {
    if (param_store_->has_prepared()) param_store_->discard_prepared();
    optimizer_.restore(saved_optimizer_);
    // The persistent groups' gradient storage may hold part of the gather;
    // it must be zero for the next backward to accumulate into.
    for (size_t g = 0; g < groups_.size(); ++g)
      if (groups_[g].persistent && full_grads_[g] != nullptr)
        gk_.zero(full_grads_[g], padded_[g]);
    std::vector<float>().swap(step_params_);
    throw;
  }
  std::vector<float>().swap(step_params_);
  publish_persistent();
}

std::vector<float> Stage3::owned_parameters() const {
  std::vector<float> out(owned_numel_);
  if (!param_store_) {
    k_.download(out.data(), part_params_.data(), owned_numel_);
    return out;
  }
  float* arrays[1] = {out.data()};
  param_store_->read_arrays(arrays);
  return out;
}

void Stage3::zero_grad() { k_.zero(part_grads_.data(), part_grads_.size()); }

std::vector<Segment> Stage3::owned_segments() const {
  // Rank r owns [r·P_g, (r+1)·P_g) of each group: cut it at the group's
  // parameters (each maps to its canonical range) and at the padding.
  std::vector<Segment> out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const size_t begin = rank_ * partition_[g], end = begin + partition_[g];
    for (size_t p : groups_[g].params) {
      const size_t lo = std::max(begin, param_offset_[p]);
      const size_t hi = std::min(end, param_offset_[p] + param_numel_[p]);
      if (lo >= hi) continue;
      out.push_back({part_offset_[g] + (lo - begin),
                     canonical_offset_[p] + (lo - param_offset_[p]), hi - lo});
    }
  }
  return out;
}

void Stage3::load_state(const std::vector<float>& params,
                        const std::vector<float>& exp_avg,
                        const std::vector<float>& exp_avg_sq,
                        int64_t optimizer_steps) {
  const size_t numel = canonical_offset_.empty()
                           ? 0
                           : canonical_offset_.back() + param_numel_.back();
  if (params.size() != numel)
    throw UsageError("checkpoint holds " + std::to_string(params.size()) +
                     " parameters; this model has " + std::to_string(numel));
  settle_prefetch(kNone);  // Note [Stage 3 prefetch]: the old values
  settle_in_flight(kNone);  // Note [Stage 3 reduce-scatter in flight]
  drop_held();
  const std::vector<Segment> segs = owned_segments();
  auto owned = [&](const std::vector<float>& full) {
    std::vector<float> out;
    if (full.empty()) return out;
    out.assign(owned_numel_, 0.0f);
    for (const Segment& s : segs)
      std::memcpy(out.data() + s.state_offset, full.data() + s.canonical_offset,
                  s.numel * sizeof(float));
    return out;
  };
  if (param_store_) {
    // First, so that a failed write (IoError) changes nothing.
    const std::vector<float> mine = owned(params);
    const float* arrays[1] = {mine.data()};
    param_store_->write_arrays(arrays);
  }
  optimizer_.load_state(optimizer_steps, owned(exp_avg), owned(exp_avg_sq));
  if (!param_store_)
    k_.upload(part_params_.data(), owned(params).data(), owned_numel_);
  // Persistent groups are whole on every rank: refresh them from the
  // canonical vector directly.
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!groups_[g].persistent) continue;
    for (size_t p : groups_[g].params)
      gk_.upload(full_params_[g] + param_offset_[p],
                params.data() + canonical_offset_[p], param_numel_[p]);
    storage_->params_written(g);
  }
}

void Stage3::full_parameters(float* out, const char* phase) {
  settle_in_flight(kNone);  // Note [Stage 3 reduce-scatter in flight]
  for (size_t g = 0; g < groups_.size(); ++g) {
    // In the kernels' memory; `out` is the host's.
    const DeviceArray staging = k_.allocate(padded_[g]);
    comm_->all_gather(buffer(partition_of(g), partition_[g]),
                      buffer(staging.data(), padded_[g]), {phase});
    size_t out_at = 0;
    for (size_t p = 0; p < param_numel_.size(); ++p) {
      if (group_of_[p] == g)
        k_.download(out + out_at, staging.data() + param_offset_[p],
                    param_numel_[p]);
      out_at += param_numel_[p];
    }
  }
}

}  // namespace zerostep
