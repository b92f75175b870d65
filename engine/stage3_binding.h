// Stage3Binding: ZeRO stage 3's binding (engine/param_binding.h).
//
// Groups follow Note [Stage 3 grouping rule] (zero/grouping.h) over the
// model's Zero3Blocks (blocks/zero3_block.h). Each group gets one full
// parameter storage and one full gradient storage that its parameters and
// their .grad view for the binding's lifetime. A non-persistent group's
// storages hold memory only while the group is in use: a slot of the
// binding's pools (Note [Stage 3 buffer pool] in zero/stage3.h), moved in
// when the stage materializes the group and taken back, leaving zero
// bytes, when it releases it (the views stay valid objects, and tensors
// autograd saved from them see the data again once the group is gathered
// for backward, in whichever slot). The binding is the Zero3Hooks of the
// model's blocks: a block's forward gathers its group before the body and
// releases it after, and an identity autograd node behind the block's output
// gathers the group again before the block's backward runs.
//
// bf16: the model views bf16 storages; the stage gathers into and reduces
// from float32 ones, converted in params_written / grads_ready.
//
// A model on a device (Note [Stage 3 on a device] in zero/stage3.h): every
// storage and pool slot is on that device (its LibTorch allocator), the
// conversions are LibTorch ops there, and the stage gets the device's
// kernels.
//
// Thread safety: none (engine/param_binding.h); the blocks point at this
// binding until it is destroyed.
#ifndef ZEROSTEP_ENGINE_STAGE3_BINDING_H_
#define ZEROSTEP_ENGINE_STAGE3_BINDING_H_

#include <map>
#include <memory>
#include <vector>

#include "blocks/zero3_block.h"
#include "engine/param_binding.h"
#include "zero/stage3.h"

namespace zerostep {

class Stage3Binding final : public ParamBinding,
                            private internal::Zero3Hooks,
                            private GroupStorage {
 public:
  Stage3Binding(std::shared_ptr<torch::nn::Module> model,
                std::vector<torch::Tensor> params,
                const BindingOptions& options, Communicator* comm,
                FailureLatch* latch);
  ~Stage3Binding() override;

  Stage& stage() override { return *stage3_; }
  const Stage& stage() const override { return *stage3_; }
  void begin_backward() override {}
  void end_backward() override {}
  void params_written() override {}
  torch::Tensor full_parameters() override;
  torch::Tensor flat_parameters() const override;
  torch::Tensor flat_gradients() const override;
  MemoryStats memory() const override;
  void reset_peak_memory() override { stage3_->reset_peak(); }

 private:
  void on_grad_ready(size_t param_index) override {
    stage3_->on_grad_ready(param_index);
  }
  [[noreturn]] void require_flat(const char* what) const;

  // internal::Zero3Hooks.
  bool enter(torch::nn::Module& block) override;
  torch::Tensor exit(torch::nn::Module& block,
                     const torch::Tensor& output) override;
  void abandon(torch::nn::Module& block) override;

  // GroupStorage (zero/stage3.h).
  float* materialize_params(size_t group, size_t slot) override;
  void release_params(size_t group, size_t slot) override;
  float* materialize_grads(size_t group, size_t slot) override;
  void release_grads(size_t group, size_t slot) override;

  // Note [Stage 3 buffer pool]: slot_bytes-sized memory, each slot either
  // here (idle) or moved into the storage of the group using it (then
  // empty here).
  struct Pool {
    size_t slot_bytes = 0;
    size_t allocated = 0;  // slots ever allocated (all resident)
    std::vector<at::DataPtr> slots;
    // Moves slot `slot` (== slots.size(): a new one) into t's storage,
    // sized to t; zeroes it when asked. Returns its data.
    void* attach(size_t slot, torch::Tensor& t, bool zero);
    // Moves t's memory back into slot `slot`; t's storage holds 0 bytes.
    void detach(size_t slot, torch::Tensor& t);
  };
  void params_written(size_t group) override;
  void grads_ready(size_t group) override;

  std::shared_ptr<torch::nn::Module> model_;
  std::vector<torch::Tensor> params_;
  Precision dtype_;
  size_t numel_;
  FailureLatch* latch_;
  // Note [Stage 3 on a device] (zero/stage3.h): the device's kernels, when
  // the storages are off the host (Stage3Options::group_kernels, else
  // kernels); nullptr on the host.
  Kernels* kernels_ = nullptr;
  std::vector<torch::Tensor> group_params_;  // bf16 when training in bf16
  std::vector<torch::Tensor> group_grads_;   // bf16 when training in bf16
  // bf16 only: the float32 storages the stage gathers into and reduces
  // from.
  std::vector<torch::Tensor> group_params32_;
  std::vector<torch::Tensor> group_grads32_;
  std::vector<bool> persistent_;  // per group
  std::vector<bool> own_grads_;   // per group: gradients in its own storage
  // Model dtype and (bf16 only) float32 slots.
  Pool params_pool_, grads_pool_, params32_pool_, grads32_pool_;
  std::map<const torch::nn::Module*, size_t> block_group_;
  std::vector<torch::nn::Module*> blocks_;  // hooks point at this binding
  std::unique_ptr<Stage3> stage3_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_STAGE3_BINDING_H_
