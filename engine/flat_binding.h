// FlatBinding: ZeRO stages 0-2's binding (engine/param_binding.h).
//
// The model's trainable parameters move into one flat float32 buffer (each
// parameter becomes a view of it) and their .grad into another, so autograd
// accumulates straight into the buffer the stage reduces.
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
// Thread safety: none (engine/param_binding.h).
#ifndef ZEROSTEP_ENGINE_FLAT_BINDING_H_
#define ZEROSTEP_ENGINE_FLAT_BINDING_H_

#include <memory>
#include <vector>

#include "engine/param_binding.h"

namespace zerostep {

class FlatBinding final : public ParamBinding {
 public:
  FlatBinding(std::shared_ptr<torch::nn::Module> model,
              std::vector<torch::Tensor> params, const BindingOptions& options,
              Communicator* comm);

  Stage& stage() override { return *stage_; }
  const Stage& stage() const override { return *stage_; }
  void begin_backward() override;
  void end_backward() override;
  void params_written() override;
  torch::Tensor full_parameters() override;
  torch::Tensor flat_parameters() const override;
  torch::Tensor flat_gradients() const override;
  MemoryStats memory() const override;
  void reset_peak_memory() override {}

 private:
  void on_grad_ready(size_t param_index) override;
  // Mixed precision: adds parameter i's gradient of this backward into the
  // flat accumulation, once per backward.
  void fold_grad(size_t param_index);
  bool folds_grads() const { return dtype_ != Precision::kFp32; }

  std::shared_ptr<torch::nn::Module> model_;
  std::vector<torch::Tensor> params_;
  FlatLayout layout_;
  Precision dtype_;
  // The accumulation format of a fold: float32 at stage 2 (which reduces
  // every backward), grad_accum_dtype otherwise.
  Precision fold_accum_;
  torch::Tensor flat_params_;  // padded_numel float32 (bf16: the master)
  torch::Tensor flat_grads_;   // padded_numel float32
  // Mixed precision: the bf16 weights the model computes with, and the
  // one-backward gradients autograd writes (bf16, or float32 to be rounded
  // to fp16), both padded_numel.
  torch::Tensor model_params_;
  torch::Tensor model_grads_;
  std::vector<char> folded_;  // per parameter, in this backward
  std::unique_ptr<Stage> stage_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_FLAT_BINDING_H_
