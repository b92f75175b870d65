#include "engine/flat_binding.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstring>

#include "common/errors.h"
#include "zero/agreement.h"

namespace zerostep {

FlatBinding::FlatBinding(std::shared_ptr<torch::nn::Module> model,
                         std::vector<torch::Tensor> params,
                         const BindingOptions& options, Communicator* comm)
    : model_(std::move(model)),
      params_(std::move(params)),
      layout_(options.stage.layout),
      dtype_(options.dtype),
      fold_accum_(options.fold_accum),
      by_param_(partitions_gradients(options.stage)),
      master_apart_(partitions_master(options.stage)),
      folded_(params_.size(), 0),
      copied_(params_.size(), 0) {
  Kernels* k = options.stage.kernels;
  if (k != nullptr && !k->host_addressable()) kernels_ = k;
  ZS_CHECK(!(state_on_device() && options.offload));
  // Flat buffers, allocated once and touched once (zeros) up front: the
  // stage's on the host, the model's on its device (Note [ZeRO-Offload]),
  // or all of them on the model's device (Note [Device kernels]).
  const torch::Device device = internal::model_device(params_);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(
      state_on_device() ? device : torch::Device(torch::kCPU));
  const int64_t padded = static_cast<int64_t>(layout_.padded_numel);
  // Note [Offload copies]: the float32 weights the device copies from are
  // page-locked with pin_memory, so that copy runs asynchronously.
  const bool pin = options.offload && options.pin_memory && device.is_cuda();
  // Note [Partitioned master] (zero/stage.h): the stage keeps the owned
  // master; the model's bf16 weights are the one full copy.
  if (!master_apart_)
    flat_params_ = torch::zeros({padded}, f32.pinned_memory(pin));
  // Note [Stage 2 buckets] (zero/stage2.h): no full gradient; each
  // parameter's gradient stays autograd's own tensor until the stage takes
  // it into a bucket.
  if (!by_param_) flat_grads_ = torch::zeros({padded}, f32);
  const bool bf16 = dtype_ == Precision::kBf16;
  const auto on_device = torch::TensorOptions().device(device);
  if (bf16 || options.offload)
    model_params_ = torch::zeros(
        {padded}, on_device.dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
  if ((dtype_ != Precision::kFp32 || options.offload) && !by_param_)
    model_grads_ = torch::zeros(
        {padded}, on_device.dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
  // A model off the host, or one posing as such in tests.
  const bool via_host =
      (!device.is_cpu() || (options.offload && options.offload_staging_on_cpu)) &&
      !state_on_device();
  if (via_host) {
    const auto host = torch::TensorOptions().pinned_memory(
        options.pin_memory && device.is_cuda());
    if (bf16)  // rounded on the host, then copied
      host_params_ = torch::empty({padded}, host.dtype(torch::kBFloat16));
    if (model_grads_.defined())
      host_grads_ = torch::empty({padded}, host.dtype(model_grads_.dtype()));
    // Note [Offload copies]: a stream of LibTorch's pool for the copies.
    if (device.is_cuda())
      copy_stream_ = c10::impl::VirtualGuardImpl(device.type())
                         .getStreamFromGlobalPool(device);
  }
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor& p = params_[i];
      const int64_t off = static_cast<int64_t>(layout_.offsets[i]);
      const int64_t n = static_cast<int64_t>(layout_.numels[i]);
      torch::Tensor to = (master_apart_ ? model_params_ : flat_params_)
                             .narrow(0, off, n);
      if (p.is_meta()) {
        torch::Tensor host = torch::empty({n}, torch::kFloat32);
        internal::read_from_source(options.source, options.names.at(i), 0, n,
                                   dtype_, host.data_ptr<float>());
        to.copy_(host);
      } else {
        to.view(p.sizes()).copy_(p);
      }
      const torch::Tensor& weights =
          model_params_.defined() ? model_params_ : flat_params_;
      internal::bind_parameter(p, weights.narrow(0, off, n).view(p.sizes()));
      // A defined .grad makes autograd accumulate in place (+=) into it.
      // Note [Stage 2 buckets]: none, autograd makes each one.
      if (by_param_) continue;
      const torch::Tensor& grads = folds_grads() ? model_grads_ : flat_grads_;
      p.mutable_grad() = grads.narrow(0, off, n).view(p.sizes());
    }
  }
  // Once per run: rank 0's values (Note [Partitioned master]: its bf16
  // weights, their bits carried as float32 words, two to a word).
  float* initial = master_apart_
                       ? static_cast<float*>(model_params_.data_ptr())
                       : flat_params_.data_ptr<float>();
  const size_t words = master_apart_ ? layout_.padded_numel / 2
                                     : layout_.padded_numel;
  if (state_on_device()) {  // through the host
    std::vector<float> host(words);
    kernels_->download(host.data(), initial, words);
    broadcast_initial_parameters(*comm, host.data(), words);
    kernels_->upload(initial, host.data(), words);
  } else {
    broadcast_initial_parameters(*comm, initial, words);
  }
  params_written();
  FlatBuffers buffers;
  if (master_apart_)
    buffers.weights = this;
  else
    buffers.params = flat_params_.data_ptr<float>();
  if (!by_param_) {
    buffers.grads = flat_grads_.data_ptr<float>();
    if (!master_apart_)
      buffers.exchange = [this] { return exchange_buffers(); };
  }
  stage_ = make_stage(options.stage, std::move(buffers), comm);
  if (by_param_) {
    sink_ = dynamic_cast<ParamGradSink*>(stage_.get());
    ZS_CHECK(sink_ != nullptr);
  }
  // Note [Offload copies]: each gradient leaves the device as it completes.
  // Note [Stage 2 buckets]: each gradient goes into its bucket then.
  install_grad_ready_hooks(params_,
                           /*binding_wants=*/host_grads_.defined() || by_param_);
}

bool FlatBinding::exchange_buffers() {
  c10::StorageImpl* params = flat_params_.storage().unsafeGetStorageImpl();
  c10::StorageImpl* grads = flat_grads_.storage().unsafeGetStorageImpl();
  // Only like for like: the same bytes, device and allocator (the float32
  // master page-locked for offload's copies is not traded for pageable
  // gradients).
  if (params->nbytes() != grads->nbytes() ||
      params->device() != grads->device() ||
      params->allocator() != grads->allocator())
    return false;
  at::DataPtr was_grads = grads->set_data_ptr(at::DataPtr());
  at::DataPtr was_params = params->set_data_ptr(std::move(was_grads));
  grads->set_data_ptr(std::move(was_params));
  return true;
}

void FlatBinding::begin_backward() {
  std::fill(folded_.begin(), folded_.end(), 0);
  std::fill(copied_.begin(), copied_.end(), 0);
  // A backward that threw may have left gradients behind.
  if (by_param_)
    for (torch::Tensor& p : params_) p.mutable_grad().reset();
}

void FlatBinding::end_backward() {
  if (by_param_) {
    // Whatever autograd completed after the last hook (nothing, normally).
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].grad().defined()) give_grad(i);
    return;
  }
  if (!folds_grads()) return;
  // Note [Offload copies]: the gradients no hook copied, one wait, then
  // every fold on the host.
  if (host_grads_.defined()) {
    for (size_t i = 0; i < params_.size(); ++i) copy_grad_to_host(i);
    wait_for_copies();
  }
  for (size_t i = 0; i < params_.size(); ++i) fold_grad(i);
}

void FlatBinding::copy_grad_to_host(size_t i) {
  if (copied_[i]) return;
  copied_[i] = 1;
  const int64_t off = static_cast<int64_t>(layout_.offsets[i]);
  const int64_t n = static_cast<int64_t>(layout_.numels[i]);
  torch::Tensor grad = model_grads_.narrow(0, off, n);
  torch::Tensor host = host_grads_.narrow(0, off, n);
  if (!copy_stream_) {  // the CPU: synchronous
    host.copy_(grad);
    grad.zero_();
    return;
  }
  const c10::Device device = model_grads_.device();
  // After what autograd queued on its stream, which wrote the gradient.
  c10::Event written(device.type());
  written.record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  copy_stream_->wait(written);
  const c10::StreamGuard on_copy_stream(*copy_stream_);
  host.copy_(grad, /*non_blocking=*/true);
  grad.zero_();
}

void FlatBinding::wait_for_copies() {
  if (!copy_stream_) return;
  copy_stream_->synchronize();
  weights_in_flight_ = false;
}

// Note [Stage 2 buckets]: parameter i's gradient, as autograd made it (the
// model's dtype, on its device), added into the zeroed slices the stage
// gives for it, then dropped; the same fold as fold_grad()'s.
void FlatBinding::give_grad(size_t i) {
  torch::Tensor& p = params_[i];
  torch::Tensor g = p.grad().detach().reshape({-1});
  p.mutable_grad().reset();
  if (state_on_device()) {
    // bf16 to float32 is exact: the sums of accumulate_bf16.
    g = g.to(torch::kFloat32).contiguous();
    const float* g32 = g.data_ptr<float>();
    const Precision grad_p =
        dtype_ == Precision::kBf16 ? Precision::kFp32 : dtype_;
    sink_->take_grad(i, [&](const GradSlice& s) {
      kernels_->accumulate(s.dst, g32 + s.param_offset, s.numel, grad_p,
                           Precision::kFp32);
    });
    return;
  }
  // On the host (a model off it: one copy, waited for).
  if (!g.is_cpu()) g = g.to(torch::kCPU);
  g = g.contiguous();
  sink_->take_grad(i, [&](const GradSlice& s) {
    if (dtype_ == Precision::kBf16)
      accumulate_bf16(
          s.dst,
          reinterpret_cast<const uint16_t*>(g.data_ptr()) + s.param_offset,
          s.numel, Precision::kFp32);
    else
      accumulate(s.dst, g.data_ptr<float>() + s.param_offset, s.numel,
                 dtype_, Precision::kFp32);
  });
}

void FlatBinding::on_grad_ready(size_t i) {
  if (by_param_) {
    give_grad(i);
    return;
  }
  if (!folds_grads()) {
    stage_->on_grad_ready(i);
    return;
  }
  if (host_grads_.defined()) copy_grad_to_host(i);
  // overlap_comm: the stage reduces from the fold now, so the copy must
  // have landed (a wait per parameter on a device).
  if (stage_->wants_grad_ready()) {
    if (host_grads_.defined()) wait_for_copies();
    fold_grad(i);
    stage_->on_grad_ready(i);
  }
}

const void* FlatBinding::grad_on_host(size_t i) {
  const torch::Tensor& g =
      host_grads_.defined() ? host_grads_ : model_grads_;
  return static_cast<const char*>(g.data_ptr()) +
         layout_.offsets[i] * g.element_size();
}

void FlatBinding::fold_grad(size_t i) {
  if (folded_[i]) return;
  folded_[i] = 1;
  const size_t off = layout_.offsets[i], n = layout_.numels[i];
  if (state_on_device()) {
    // bf16 to float32 is exact, and round_to(bf16) of a bf16 value is
    // itself: the same sums as accumulate_bf16.
    float* acc = flat_grads_.data_ptr<float>() + off;
    torch::Tensor g = model_grads_.narrow(0, static_cast<int64_t>(off),
                                          static_cast<int64_t>(n));
    const torch::Tensor g32 = g.to(torch::kFloat32);
    kernels_->accumulate(acc, g32.data_ptr<float>(), n,
                         dtype_ == Precision::kBf16 ? Precision::kFp32 : dtype_,
                         fold_accum_);
    g.zero_();
    return;
  }
  float* acc = flat_grads_.data_ptr<float>() + off;
  const void* g = grad_on_host(i);
  if (dtype_ == Precision::kBf16)
    accumulate_bf16(acc, static_cast<const uint16_t*>(g), n, fold_accum_);
  else
    accumulate(acc, static_cast<const float*>(g), n, dtype_, fold_accum_);
  // Clear this backward's gradient where autograd writes the next one (a
  // model off the host: zeroed on the device when it was copied).
  if (!host_grads_.defined())
    std::memset(const_cast<void*>(g), 0, n * model_grads_.element_size());
}

// Note [Partitioned master]: the weights from the stage's gathered master.
void FlatBinding::publish(size_t offset, const float* values, size_t n) {
  torch::Tensor to = model_params_.narrow(0, static_cast<int64_t>(offset),
                                          static_cast<int64_t>(n));
  if (state_on_device()) {  // LibTorch's rounding, on the device
    to.copy_(torch::from_blob(const_cast<float*>(values),
                              {static_cast<int64_t>(n)},
                              to.options().dtype(torch::kFloat32)));
    return;
  }
  to_bf16(values, reinterpret_cast<uint16_t*>(to.data_ptr()), n);
}

void FlatBinding::read(size_t offset, float* out, size_t n) {
  const torch::Tensor from = model_params_.narrow(
      0, static_cast<int64_t>(offset), static_cast<int64_t>(n));
  if (state_on_device()) {
    torch::from_blob(out, {static_cast<int64_t>(n)},
                     from.options().dtype(torch::kFloat32))
        .copy_(from);
    return;
  }
  const auto* bits = reinterpret_cast<const uint16_t*>(from.data_ptr());
  for (size_t i = 0; i < n; ++i) out[i] = from_bf16_bits(bits[i]);
}

void FlatBinding::params_written() {
  if (!model_params_.defined()) return;  // the model computes with the master
  if (master_apart_) return;  // the stage published them
  if (state_on_device()) {  // bf16 weights: LibTorch's rounding, on the device
    model_params_.copy_(flat_params_);
    return;
  }
  // The previous copy may still read host_params_.
  settle_weights();
  const torch::Tensor* from = &flat_params_;
  if (dtype_ == Precision::kBf16) {
    torch::Tensor& host = host_params_.defined() ? host_params_ : model_params_;
    to_bf16(flat_params_.data_ptr<float>(),
            reinterpret_cast<uint16_t*>(host.data_ptr()),
            layout_.padded_numel);
    if (!host_params_.defined()) return;  // rounded in place on the host
    from = &host_params_;
  }
  if (!copy_stream_) {  // the CPU: synchronous
    model_params_.copy_(*from);
    return;
  }
  // Note [Offload copies]: on the copy stream, after the kernels queued so
  // far (which may still read the old weights); the stream the model
  // computes on waits for the copy, the host does not.
  const c10::Device device = model_params_.device();
  const c10::Stream compute =
      c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  c10::Event queued(device.type());
  queued.record(compute);
  copy_stream_->wait(queued);
  {
    const c10::StreamGuard on_copy_stream(*copy_stream_);
    model_params_.copy_(*from, /*non_blocking=*/true);
  }
  c10::Event copied(device.type());
  copied.record(*copy_stream_);
  compute.wait(copied);
  weights_in_flight_ = true;
}

void FlatBinding::settle_weights() {
  if (!weights_in_flight_) return;
  weights_in_flight_ = false;
  copy_stream_->synchronize();
}

torch::Tensor FlatBinding::full_parameters() {
  if (master_apart_) {  // a collective
    torch::Tensor all = torch::empty(
        {static_cast<int64_t>(layout_.padded_numel)}, torch::kFloat32);
    dynamic_cast<FlatStage&>(*stage_).gather_master(all.data_ptr<float>());
    return all.narrow(0, 0, static_cast<int64_t>(layout_.numel)).clone();
  }
  torch::Tensor out =
      torch::empty({static_cast<int64_t>(layout_.numel)}, torch::kFloat32);
  out.copy_(flat_params_.narrow(0, 0, static_cast<int64_t>(layout_.numel)));
  return out;
}

torch::Tensor FlatBinding::flat_parameters() const {
  if (master_apart_)
    throw UsageError(
        "flat_parameters() is not available at ZeRO stages 1-2 under bf16: "
        "the float32 master is partitioned across the ranks (Note "
        "[Partitioned master] in zero/stage.h). Fix: use full_parameters() "
        "(a collective: call it on every rank) or owned_parameters()");
  return flat_params_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

torch::Tensor FlatBinding::flat_gradients() const {
  if (by_param_)
    throw UsageError(
        "flat_gradients() is not available at ZeRO stage 2: it keeps no "
        "full gradient; each backward's gradient is reduce-scattered into "
        "the rank's partition as autograd produces it (Note [Stage 2 "
        "buckets] in zero/stage2.h). Fix: zero_optimization."
        "reduce_once_per_step keeps the full gradient over the window, or "
        "use stage 1");
  return flat_grads_.narrow(0, 0, static_cast<int64_t>(layout_.numel));
}

MemoryStats FlatBinding::memory() const {
  MemoryStats m = stage_->memory();
  auto bytes = [](const torch::Tensor& t) -> size_t {
    return t.defined() ? t.storage().nbytes() : 0;
  };
  // Mixed precision and offload: the model's own copies (on its device)
  // and their host staging, beside the stage's float32, held from
  // construction on.
  const size_t params = bytes(model_params_) + bytes(host_params_);
  const size_t grads = bytes(model_grads_) + bytes(host_grads_);
  m.param_bytes += params;
  m.grad_bytes += grads;
  m.peak_bytes += params + grads;
  return m;
}

}  // namespace zerostep
