#include "engine/stage3_binding.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cstring>

#include "common/errors.h"
#include "common/log.h"
#include "zero/agreement.h"
#include "zero/grouping.h"
#include "zero/phase.h"

namespace zerostep {
namespace {

// Zeroes t: memset on the host, LibTorch's fill on a device.
void clear(torch::Tensor& t) {
  if (t.is_cpu())
    std::memset(t.data_ptr(), 0,
                static_cast<size_t>(t.numel()) * t.element_size());
  else
    t.zero_();
}

// A group's own storage, sized to t: memory from t's device's allocator
// when it holds none (freed after the stage's construction).
void* own_storage(torch::Tensor& t, bool zero) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() < bytes) {
    const c10::DeviceGuard on(t.device());  // cuda:1's memory for cuda:1
    s->set_data_ptr(c10::GetAllocator(t.device().type())->allocate(bytes));
    s->set_nbytes(bytes);
  }
  if (zero) clear(t);
  return t.data_ptr();
}

void free_storage(torch::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

}  // namespace

// Note [Stage 3 buffer pool] (zero/stage3.h): the slot's memory moves into
// the tensor's storage (allocated on the slot's first use), which then
// holds the tensor's bytes; tensors autograd saved from it see them.
void* Stage3Binding::Pool::attach(size_t slot, torch::Tensor& t, bool zero) {
  ZS_CHECK(slot <= slots.size());
  if (slot == slots.size()) {
    const c10::DeviceGuard on(t.device());  // cuda:1's memory for cuda:1
    slots.push_back(c10::GetAllocator(t.device().type())->allocate(slot_bytes));
    ++allocated;
  }
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  ZS_CHECK(bytes <= slot_bytes);
  ZS_CHECK(slots[slot].get() != nullptr);  // not attached elsewhere
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  at::DataPtr memory = std::move(slots[slot]);
  slots[slot] = at::DataPtr(nullptr, t.device());
  // What the storage held: zero bytes (released, or freed after the
  // stage's construction).
  at::DataPtr old = s->set_data_ptr(std::move(memory));
  s->set_nbytes(bytes);
  if (zero) clear(t);
  return t.data_ptr();
}

// The storage gives the memory back and holds zero bytes.
void Stage3Binding::Pool::detach(size_t slot, torch::Tensor& t) {
  ZS_CHECK(slot < slots.size());
  ZS_CHECK(slots[slot].get() == nullptr);
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  ZS_CHECK(s->data() != nullptr);
  slots[slot] = s->set_data_ptr(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

namespace {

// Which group an identity node gathers: held by the node's saved data.
struct GroupRef final : torch::CustomClassHolder {
  GroupRef(Stage3* s, size_t g) : stage3(s), group(g) {}
  Stage3* stage3;
  size_t group;
};

// Identity in forward; in backward, gathers the block's group (parameters
// and zeroed gradient storage) before the block's own backward runs.
struct GatherForBackward : public torch::autograd::Function<GatherForBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor output,
                               c10::intrusive_ptr<GroupRef> ref) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(ref));
    return output;
  }
  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<GroupRef>(
        ctx->saved_data["group"].toCapsule());
    ref->stage3->gather_for_backward(ref->group);
    return {grads[0], torch::Tensor()};
  }
};

}  // namespace

Stage3Binding::Stage3Binding(std::shared_ptr<torch::nn::Module> model,
                             std::vector<torch::Tensor> params,
                             const BindingOptions& options, Communicator* comm,
                             FailureLatch* latch)
    : model_(std::move(model)),
      params_(std::move(params)),
      dtype_(options.dtype),
      numel_(options.stage.layout.numel),
      latch_(latch) {
  ZS_CHECK(latch_ != nullptr);
  // The groups' memory: the stage's kernels, or with offload from a device
  // its group_kernels (Note [Stage 3 offload from a device]).
  Kernels* k = options.stage.group_kernels != nullptr
                   ? options.stage.group_kernels
                   : options.stage.kernels;
  if (k != nullptr && !k->host_addressable()) kernels_ = k;
  const torch::Device device =
      params_.empty() ? torch::Device(torch::kCPU) : params_[0].device();
  const Zero3BlockMap map = map_zero3_blocks(*model_);
  ModelShape shape;
  shape.numels = options.stage.layout.numels;
  shape.block = map.block_of_param;
  shape.num_blocks = static_cast<int>(map.blocks.size());
  const std::vector<Stage3Group> groups =
      stage3_groups(shape, options.persistence_threshold);
  if (comm->rank() == 0) {
    const std::string warning =
        stage3_whole_model_warning(shape, options.persistence_threshold);
    if (!warning.empty()) log_message(LogLevel::kWarning, warning);
  }
  const int world = comm->world_size();
  std::vector<float*> initial;
  {
    torch::NoGradGuard no_grad;
    const bool bf16 = dtype_ == Precision::kBf16;
    // Note [Stage 3 on a device] (zero/stage3.h): on the model's device.
    const auto f32 =
        torch::TensorOptions().dtype(torch::kFloat32).device(device);
    const auto model_dtype = torch::TensorOptions()
                                 .dtype(bf16 ? torch::kBFloat16 : torch::kFloat32)
                                 .device(device);
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const Stage3Group& g = groups[gi];
      if (g.block >= 0) block_group_[map.blocks[g.block]] = gi;
      const int64_t padded = static_cast<int64_t>(padded_numel(g.numel, world));
      group_params_.push_back(torch::zeros({padded}, model_dtype));
      group_grads_.push_back(torch::zeros({padded}, model_dtype));
      if (bf16) {
        group_params32_.push_back(torch::zeros({padded}, f32));
        group_grads32_.push_back(torch::zeros({padded}, f32));
      }
      torch::Tensor& master =
          bf16 ? group_params32_.back() : group_params_.back();
      int64_t at = 0;
      for (size_t i : g.params) {
        torch::Tensor& p = params_[i];
        const int64_t n = p.numel();
        master.narrow(0, at, n).view(p.sizes()).copy_(p);
        p.set_data(group_params_.back().narrow(0, at, n).view(p.sizes()));
        p.mutable_grad() = group_grads_.back().narrow(0, at, n).view(p.sizes());
        at += n;
      }
      if (kernels_ != nullptr) {
        // Once per run: rank 0's values through the host.
        std::vector<float> host(static_cast<size_t>(padded));
        kernels_->download(host.data(), master.data_ptr<float>(), host.size());
        broadcast_initial_parameters(*comm, host.data(), host.size());
        kernels_->upload(master.data_ptr<float>(), host.data(), host.size());
      } else {
        broadcast_initial_parameters(*comm, master.data_ptr<float>(),
                                     static_cast<size_t>(padded));
      }
      if (bf16) group_params_.back().copy_(master);
      initial.push_back(master.data_ptr<float>());
    }
  }
  size_t slot_numel = 0;
  for (const Stage3Group& g : groups)
    if (!g.persistent)
      slot_numel = std::max(slot_numel, padded_numel(g.numel, world));
  const size_t model_bytes = dtype_ == Precision::kBf16 ? 2 : 4;
  params_pool_.slot_bytes = grads_pool_.slot_bytes = slot_numel * model_bytes;
  params32_pool_.slot_bytes = grads32_pool_.slot_bytes = slot_numel * 4;
  own_grads_.assign(groups.size(), false);
  stage3_ = std::make_unique<Stage3>(options.stage, groups,
                                     options.stage.layout.numels, initial,
                                     static_cast<GroupStorage*>(this), comm);
  // Note [Stage 3 buffer pool]: the non-persistent groups' initial storage
  // has served the stage's constructor; from now on they use pool slots.
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    persistent_.push_back(groups[gi].persistent);
    if (groups[gi].persistent) continue;
    free_storage(group_params_[gi]);
    free_storage(group_grads_[gi]);
    if (!group_params32_.empty()) {
      free_storage(group_params32_[gi]);
      free_storage(group_grads32_[gi]);
    }
  }
  for (torch::nn::Module* b : map.blocks)
    dynamic_cast<Zero3Block*>(b)->set_zero3_hooks(this);
  blocks_ = map.blocks;
  install_grad_ready_hooks(params_);
}

Stage3Binding::~Stage3Binding() {
  for (torch::nn::Module* b : blocks_) {
    auto* marked = dynamic_cast<Zero3Block*>(b);
    if (marked->zero3_hooks() == this) marked->set_zero3_hooks(nullptr);
  }
}

// bf16: the model views bf16 storages; the stage gathers into and reduces
// from float32 ones, converted by the two hooks below.
// kOwn: a persistent group's own storage, sized once for the binding's
// lifetime; otherwise a pool slot.
float* Stage3Binding::materialize_params(size_t g, size_t slot) {
  const bool bf16 = !group_params32_.empty();
  void* model = slot == kOwn
                    ? own_storage(group_params_[g], false)
                    : params_pool_.attach(slot, group_params_[g], false);
  if (!bf16) return static_cast<float*>(model);
  return static_cast<float*>(
      slot == kOwn ? own_storage(group_params32_[g], false)
                   : params32_pool_.attach(slot, group_params32_[g], false));
}

void Stage3Binding::release_params(size_t g, size_t slot) {
  ZS_CHECK(slot != kOwn);
  params_pool_.detach(slot, group_params_[g]);
  if (!group_params32_.empty()) params32_pool_.detach(slot, group_params32_[g]);
}

float* Stage3Binding::materialize_grads(size_t g, size_t slot) {
  const bool bf16 = !group_grads32_.empty();
  if (slot == kOwn) own_grads_[g] = true;
  void* model = slot == kOwn ? own_storage(group_grads_[g], true)
                             : grads_pool_.attach(slot, group_grads_[g], true);
  if (!bf16) return static_cast<float*>(model);
  return static_cast<float*>(
      slot == kOwn ? own_storage(group_grads32_[g], true)
                   : grads32_pool_.attach(slot, group_grads32_[g], true));
}

void Stage3Binding::release_grads(size_t g, size_t slot) {
  ZS_CHECK(slot != kOwn);
  grads_pool_.detach(slot, group_grads_[g]);
  if (!group_grads32_.empty()) grads32_pool_.detach(slot, group_grads32_[g]);
}

void Stage3Binding::params_written(size_t g) {
  if (group_params32_.empty()) return;
  torch::Tensor& model = group_params_[g];
  if (kernels_ != nullptr) {  // LibTorch's rounding, on the device
    model.copy_(group_params32_[g]);
    return;
  }
  to_bf16(group_params32_[g].data_ptr<float>(),
          reinterpret_cast<uint16_t*>(model.data_ptr()),
          static_cast<size_t>(model.numel()));
}

void Stage3Binding::grads_ready(size_t g) {
  torch::Tensor& model = group_grads_[g];
  const size_t n = static_cast<size_t>(model.numel());
  if (kernels_ != nullptr) {
    // On the device: the same roundings and sums as the host's loops below
    // (bf16 to float32 is exact, so accumulating it is one addition).
    if (dtype_ == Precision::kFp16)
      model.copy_(model.to(torch::kHalf));
    else if (dtype_ == Precision::kBf16) {
      const torch::Tensor g32 = model.to(torch::kFloat32);
      kernels_->accumulate(group_grads32_[g].data_ptr<float>(),
                           g32.data_ptr<float>(), n, Precision::kFp32,
                           Precision::kFp32);
      model.zero_();
    }
    return;
  }
  switch (dtype_) {
    case Precision::kFp32:
      return;
    case Precision::kFp16:
      round_in_place(Precision::kFp16, model.data_ptr<float>(), n);
      return;
    case Precision::kBf16: {
      // The float32 buffer is zero here (fresh, or cleared after the
      // group's last reduce).
      auto* bits = reinterpret_cast<uint16_t*>(model.data_ptr());
      accumulate_bf16(group_grads32_[g].data_ptr<float>(), bits, n,
                      Precision::kFp32);
      std::memset(bits, 0, n * sizeof(uint16_t));
      return;
    }
  }
}

bool Stage3Binding::enter(torch::nn::Module& block) {
  auto it = block_group_.find(&block);
  if (it == block_group_.end()) return false;
  latch_->require_working("a ZeRO-3 block's forward");
  try {
    stage3_->gather(it->second, phase::kForward);
  } catch (const CommError& e) {
    latch_->comm_failed(e,
                        "the forward of a ZeRO-3 block (group " +
                            std::to_string(it->second) + ")",
                        "no counter moved");
  }
  return true;
}

torch::Tensor Stage3Binding::exit(torch::nn::Module& block,
                                  const torch::Tensor& output) {
  const size_t g = block_group_.at(&block);
  const bool backward =
      torch::GradMode::is_enabled() && output.requires_grad();
  // Note [Stage 3 collectives outside backward], Note [Stage 3 reuse
  // distance]: kept for the backward.
  if (backward && stage3_->keeps_for_backward(g)) stage3_->hold(g);
  stage3_->release(g);
  if (!backward) return output;
  return GatherForBackward::apply(
      output, c10::make_intrusive<GroupRef>(stage3_.get(), g));
}

void Stage3Binding::abandon(torch::nn::Module& block) {
  stage3_->release(block_group_.at(&block));
}

torch::Tensor Stage3Binding::full_parameters() {
  torch::Tensor out =
      torch::empty({static_cast<int64_t>(numel_)}, torch::kFloat32);
  stage3_->full_parameters(out.data_ptr<float>(), phase::kSetup);
  return out;
}

void Stage3Binding::require_flat(const char* what) const {
  throw UsageError(std::string(what) +
                   "() is not available at ZeRO stage 3: parameters and "
                   "gradients are partitioned at rest. Fix: use "
                   "full_parameters() (a collective: call it on every rank)");
}

torch::Tensor Stage3Binding::flat_parameters() const {
  require_flat("flat_parameters");
}

torch::Tensor Stage3Binding::flat_gradients() const {
  require_flat("flat_gradients");
}

MemoryStats Stage3Binding::memory() const {
  MemoryStats m = stage3_->memory();
  // bf16: the model's own storages beside the stage's float32 ones (the
  // persistent groups' and the pool's slots); not in stage 3's peak.
  if (group_params32_.empty()) return m;
  m.param_bytes += params_pool_.allocated * params_pool_.slot_bytes;
  m.grad_bytes += grads_pool_.allocated * grads_pool_.slot_bytes;
  for (size_t g = 0; g < persistent_.size(); ++g) {
    if (persistent_[g]) m.param_bytes += group_params_[g].storage().nbytes();
    // Persistent groups, and every group with reduce_once_per_step: the
    // group's own gradient storage (Note [Reduce once per step]).
    if (own_grads_[g]) m.grad_bytes += group_grads_[g].storage().nbytes();
  }
  return m;
}

}  // namespace zerostep
