#include "engine/stage3_binding.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <variant>

#include "common/errors.h"
#include "common/log.h"
#include "precision/precision.h"
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
  const Stage3Options& own = std::get<Stage3Options>(options.stage.per_stage);
  Kernels* k =
      own.group_kernels != nullptr ? own.group_kernels : options.stage.kernels;
  if (k != nullptr && !k->host_addressable()) kernels_ = k;
  const torch::Device device = internal::model_device(params_);
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
  const bool bf16 = dtype_ == Precision::kBf16;
  // Note [Stage 3 initial values] (zero/stage3.h): every group's storages
  // start empty (zero bytes) and the parameters view them at once; the
  // values as the caller built them stay reachable through `built` until
  // their group has been partitioned, then are let go (the caller's
  // storage is freed there unless the caller holds it too).
  std::vector<torch::Tensor> built(params_.size());
  {
    torch::NoGradGuard no_grad;
    // Note [Stage 3 on a device] (zero/stage3.h): on the model's device.
    const auto f32 =
        torch::TensorOptions().dtype(torch::kFloat32).device(device);
    const auto model_dtype = torch::TensorOptions()
                                 .dtype(bf16 ? torch::kBFloat16 : torch::kFloat32)
                                 .device(device);
    // Allocated but never touched (no resident memory) while the
    // parameters' views are made (a view needs storage in bounds), then
    // freed below: full() gives each group its memory in turn.
    auto unallocated = [](int64_t n, const torch::TensorOptions& o) {
      return torch::empty({n}, o);
    };
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      const Stage3Group& g = groups[gi];
      if (g.block >= 0) block_group_[map.blocks[g.block]] = gi;
      const int64_t padded = static_cast<int64_t>(padded_numel(g.numel, world));
      group_params_.push_back(unallocated(padded, model_dtype));
      group_grads_.push_back(unallocated(padded, model_dtype));
      if (bf16) {
        group_params32_.push_back(unallocated(padded, f32));
        group_grads32_.push_back(unallocated(padded, f32));
      }
      int64_t at = 0;
      for (size_t i : g.params) {
        torch::Tensor& p = params_[i];
        const int64_t n = p.numel();
        if (!p.is_meta()) built[i] = p.detach();
        internal::bind_parameter(p, group_params_.back().narrow(0, at, n).view(p.sizes()));
        p.mutable_grad() = group_grads_.back().narrow(0, at, n).view(p.sizes());
        at += n;
      }
      free_storage(group_params_.back());
      free_storage(group_grads_.back());
      if (bf16) {
        free_storage(group_params32_.back());
        free_storage(group_grads32_.back());
      }
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
  for (const Stage3Group& g : groups) persistent_.push_back(g.persistent);

  // Note [Stage 3 initial values]: one group at a time.
  struct Initial final : Stage3Initial {
    Stage3Binding* self;
    const std::vector<Stage3Group>* groups;
    std::vector<torch::Tensor>* built;
    const ParameterSource* source;
    const std::vector<std::string>* names;
    Communicator* comm;
    // The group whose full storage is out, if any.
    std::optional<size_t> last;

    // Releases the previous non-persistent group's full storage.
    void drop_last() {
      if (!last) return;
      if (!self->persistent_[*last]) {
        free_storage(self->group_params_[*last]);
        if (!self->group_params32_.empty())
          free_storage(self->group_params32_[*last]);
      }
      last.reset();
    }
    void read(size_t i, int64_t offset, int64_t n, float* out) const {
      internal::read_from_source(source, (*names)[i], offset, n, self->dtype_,
                                 out);
    }
    bool partition(size_t g, size_t first, size_t numel, float* out) override {
      const Stage3Group& group = (*groups)[g];
      if (source == nullptr) return false;
      for (size_t i : group.params)
        if (!self->params_[i].is_meta()) return false;
      // The group's padded range, parameter by parameter; padding is zero.
      std::fill(out, out + numel, 0.0f);
      size_t at = 0;
      for (size_t i : group.params) {
        const size_t n = static_cast<size_t>(self->params_[i].numel());
        const size_t lo = std::max(at, first);
        const size_t hi = std::min(at + n, first + numel);
        if (lo < hi)
          read(i, static_cast<int64_t>(lo - at), static_cast<int64_t>(hi - lo),
               out + (lo - first));
        at += n;
      }
      return true;
    }
    float* full(size_t g) override {
      drop_last();
      last = g;
      torch::NoGradGuard no_grad;
      const Stage3Group& group = (*groups)[g];
      const bool bf16 = !self->group_params32_.empty();
      torch::Tensor& model = self->group_params_[g];
      torch::Tensor& master = bf16 ? self->group_params32_[g] : model;
      own_storage(model, true);
      if (bf16) own_storage(master, true);
      bool from_ranks = false;  // any value as a rank built it
      int64_t at = 0;
      for (size_t i : group.params) {
        const torch::Tensor& p = self->params_[i];
        const int64_t n = p.numel();
        torch::Tensor to = master.narrow(0, at, n);
        if ((*built)[i].defined()) {
          to.view(p.sizes()).copy_((*built)[i]);
          (*built)[i] = torch::Tensor();
          from_ranks = true;
        } else {
          torch::Tensor host = torch::empty({n}, torch::kFloat32);
          read(i, 0, n, host.data_ptr<float>());
          to.copy_(host);
        }
        at += n;
      }
      // Rank 0's values, once per run; a source gives every rank the same.
      if (from_ranks) {
        if (self->kernels_ != nullptr) {  // through the host
          std::vector<float> host(static_cast<size_t>(master.numel()));
          self->kernels_->download(host.data(), master.data_ptr<float>(),
                                   host.size());
          broadcast_initial_parameters(*comm, host.data(), host.size());
          self->kernels_->upload(master.data_ptr<float>(), host.data(),
                                 host.size());
        } else {
          broadcast_initial_parameters(*comm, master.data_ptr<float>(),
                                       static_cast<size_t>(master.numel()));
        }
      }
      if (bf16) model.copy_(master);
      return master.data_ptr<float>();
    }
  };
  Initial initial;
  initial.self = this;
  initial.groups = &groups;
  initial.built = &built;
  initial.source = options.source;
  initial.names = &options.names;
  initial.comm = comm;
  stage3_ = std::make_unique<Stage3>(options.stage, own, groups,
                                     options.stage.layout.numels, initial,
                                     static_cast<GroupStorage*>(this), comm);
  initial.drop_last();
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
  // persistent groups' and the pool's slots), allocated once and kept, so
  // in the peak too.
  if (group_params32_.empty()) return m;
  size_t params = params_pool_.allocated * params_pool_.slot_bytes;
  size_t grads = grads_pool_.allocated * grads_pool_.slot_bytes;
  for (size_t g = 0; g < persistent_.size(); ++g) {
    if (persistent_[g]) params += group_params_[g].storage().nbytes();
    // Persistent groups, and every group with reduce_once_per_step: the
    // group's own gradient storage (Note [Reduce once per step]).
    if (own_grads_[g]) grads += group_grads_[g].storage().nbytes();
  }
  m.param_bytes += params;
  m.grad_bytes += grads;
  m.peak_bytes += params + grads;
  return m;
}

}  // namespace zerostep
