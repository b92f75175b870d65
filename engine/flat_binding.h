// FlatBinding: ZeRO stages 0-2's binding (engine/param_binding.h).
//
// The model's trainable parameters move into one flat float32 buffer (each
// parameter becomes a view of it) and, at stages 0-1, their .grad into
// another, so autograd accumulates straight into the buffer the stage
// reduces. Stage 2 keeps no full gradient (Note [Stage 2 buckets] in
// zero/stage2.h): .grad stays autograd's own tensor, which the binding
// hands to the stage's buckets (give_grad) as soon as autograd completes it
// and then drops; the one-backward buffers of mixed precision and offload
// below are not made either, the fold happens in that hand-over.
//
// Mixed precision: the model computes with bf16 weights (a second flat
// buffer, the float32 master rounded after each update) and autograd writes
// each backward's gradient into a one-backward buffer (bf16, or float32 to
// be rounded to fp16), which fold_grad() adds into the float32
// accumulation once per parameter per backward: as soon as the parameter's
// gradient is complete when the stage hooks gradients (overlap_comm),
// otherwise after the autograd pass. Stage 2 reduces every backward's
// gradient (the flat buffer is zero before each fold) and accumulates its
// partitions itself in grad_accum_dtype, so the fold there is float32.
//
// Note [ZeRO-Offload]
// ~~~~~~~~~~~~~~~~~~~
// With BindingOptions::offload (offload_optimizer.device "cpu" or "nvme",
// stages 1-2) the model's weights and one-backward gradients are flat
// buffers of their own on the model's device (a CUDA device, or the CPU),
// and everything the stage touches stays on the host: the float32 master,
// the accumulated gradient, the optimizer state (on NVMe with "nvme"). So
// a model on a GPU trains with the ZeRO state in host memory:
//   - after each backward (or, with overlap_comm, as each parameter's
//     gradient completes) its gradient is copied to the host and folded
//     into the float32 accumulation, the same fold mixed precision uses,
//     and the device copy is zeroed;
//   - after each update (params_written) the master is copied back to the
//     device, rounded to bf16 first when the model computes in bf16.
// A float32 fold is acc += g, the addition autograd makes when it
// accumulates into .grad, so a run with offload is bitwise equal to the
// same run without it (the harness's offload_bitwise_equal). On a CPU model
// the device buffers are host memory too: the tests here run this path,
// copies included. Cost there: one more copy of the weights and gradients.
// Host synchronisation: once per backward for the gradients (once per
// parameter with overlap_comm), which the host folds; none for the weights
// going back (Note [Offload copies]).
//
// Note [Offload copies]
// ~~~~~~~~~~~~~~~~~~~~~
// A model off the host (a CUDA device) sends each parameter's gradient to
// the host as soon as autograd has finished it (the grad-ready hook), not
// after backward: the copy into host_grads_ (page-locked with
// offload_optimizer.pin_memory, which a copy needs to run asynchronously)
// and the clearing of the device gradient are queued on a copy stream of
// their own, after an event on the stream autograd wrote the gradient on,
// so they overlap the rest of backward. end_backward() queues the
// parameters no hook saw (no gradient this backward), waits for the copy
// stream once, and folds every gradient into the float32 accumulation on
// the host, in parameter order. With overlap_comm the stage reduces a
// bucket from the hook, which needs the folded gradient: the hook waits for
// its copy and folds at once (a wait per parameter). The next backward
// writes the device gradients only after end_backward's wait, so the
// clears are ordered before it. Each parameter is copied once per backward
// (copied_); the folds are the same additions in the same order as before,
// so the bits do not change. The weights go back to the device in
// params_written() on the same copy stream, asynchronously: after an event
// on the stream the model computes on (kernels queued earlier may still
// read the old weights), from page-locked memory (the float32 master is
// page-locked with pin_memory; the bf16 rounding goes to host_params_,
// page-locked with it), and that stream waits for the copy's event, so
// the next forward's kernels run after it while the host goes on. The
// host buffer the copy reads is not written again until the copy is done:
// the next params_written() and will_write_params() (the engine calls it
// before an update or a load) wait for the copy stream first, and so does
// end_backward's wait.
// A CPU model has no streams: with BindingOptions::offload_staging_on_cpu
// (tests) it takes the same path with synchronous copies, so the tests here
// run everything of it but the stream and the event.
//
// On the device (StageOptions::kernels not host-addressable, no offload:
// Note [Device kernels] in zero/kernels.h) every flat buffer is on the
// model's device: the float32 master and gradient, bf16 weights and the
// one-backward gradients of mixed precision. The folds and the bf16
// rounding of the weights are device operations (the kernels' accumulate,
// LibTorch's conversion, both round to nearest even), and nothing waits
// for the device per backward; the stage's collectives get device buffers.
//
// Thread safety: none (engine/param_binding.h).
#ifndef ZEROSTEP_ENGINE_FLAT_BINDING_H_
#define ZEROSTEP_ENGINE_FLAT_BINDING_H_

#include <memory>
#include <optional>
#include <vector>

#include "engine/param_binding.h"

namespace zerostep {

class FlatBinding final : public ParamBinding, private WeightsSink {
 public:
  FlatBinding(std::shared_ptr<torch::nn::Module> model,
              std::vector<torch::Tensor> params, const BindingOptions& options,
              Communicator* comm);

  Stage& stage() override { return *stage_; }
  const Stage& stage() const override { return *stage_; }
  void begin_backward() override;
  void end_backward() override;
  void params_written() override;
  void will_write_params() override { settle_weights(); }
  torch::Tensor full_parameters() override;
  torch::Tensor flat_parameters() const override;
  torch::Tensor flat_gradients() const override;
  MemoryStats memory() const override;
  void reset_peak_memory() override {}

 private:
  void on_grad_ready(size_t param_index) override;
  // Mixed precision and offload: adds parameter i's gradient of this
  // backward into the flat accumulation, once per backward, and clears it.
  void fold_grad(size_t param_index);
  bool folds_grads() const { return model_grads_.defined(); }
  // The flat buffers are on the model's device, worked on by kernels_.
  bool state_on_device() const { return kernels_ != nullptr; }
  // WeightsSink (Note [Partitioned master] in zero/stage.h): the model's
  // bf16 weights, written from and read as float32.
  void publish(size_t offset, const float* values, size_t n) override;
  void read(size_t offset, float* out, size_t n) override;
  // Note [Stage 2 buckets] (zero/stage2.h): hands parameter i's gradient,
  // autograd's own tensor, to the stage's buckets and drops it.
  void give_grad(size_t param_index);
  // Where the fold reads parameter i's gradient: model_grads_ itself when
  // it is host memory, else host_grads_ after copying it there.
  const void* grad_on_host(size_t param_index);
  // Note [Offload copies]: queues parameter i's gradient copy to
  // host_grads_ and the clearing of the device gradient, once per backward.
  void copy_grad_to_host(size_t param_index);
  // FlatBuffers::exchange (Note [Transactional update] in zero/stage.h):
  // trades the memory of flat_params_ and flat_grads_, so that every view
  // of one (the model's parameters, their .grad) sees the other's; false
  // when the two storages differ in size, device or allocator.
  bool exchange_buffers();
  // Waits for every copy queued so far (nothing to wait for on the CPU).
  void wait_for_copies();
  // Note [Offload copies]: waits for the weights copy params_written()
  // queued, if it may still read the host buffers.
  void settle_weights();

  std::shared_ptr<torch::nn::Module> model_;
  std::vector<torch::Tensor> params_;
  FlatLayout layout_;
  Precision dtype_;
  // The accumulation format of a fold: float32 at stage 2 (which reduces
  // every backward), grad_accum_dtype otherwise.
  Precision fold_accum_;
  // Note [Stage 2 buckets]: the stage takes each parameter's gradient
  // (partitions_gradients()); no flat gradient buffer, no one-backward
  // buffers, and sink_ is the stage.
  bool by_param_;
  ParamGradSink* sink_ = nullptr;
  // Note [Partitioned master]: no flat_params_; model_params_ (bf16) are
  // the only full copy, which the stage publishes to (partitions_master()).
  bool master_apart_;
  // padded_numel float32 (bf16: the master); undefined if master_apart_
  torch::Tensor flat_params_;
  torch::Tensor flat_grads_;   // padded_numel float32; undefined if by_param_
  // Mixed precision and offload: the weights the model computes with (bf16,
  // or float32 with offload; undefined when they are flat_params_ itself),
  // and the one-backward gradients autograd writes (bf16, or float32 to be
  // rounded to fp16 or folded as they are), both padded_numel on the
  // model's device.
  torch::Tensor model_params_;
  torch::Tensor model_grads_;
  // A model off the host: the host side of the copies (model dtypes).
  torch::Tensor host_params_;
  torch::Tensor host_grads_;
  std::vector<char> folded_;  // per parameter, in this backward
  std::vector<char> copied_;  // per parameter: copy queued this backward
  // Note [Offload copies]: the copy stream of a CUDA model's offload, and
  // whether a weights copy queued on it may still read the host buffers.
  std::optional<c10::Stream> copy_stream_;
  bool weights_in_flight_ = false;
  // Note [Device kernels]: the stage's kernels when they are a device's
  // (nullptr on the host).
  Kernels* kernels_ = nullptr;
  std::unique_ptr<Stage> stage_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_FLAT_BINDING_H_
