// Zero3Block: how a model tells a ZeRO stage 3 engine where its blocks are.
//
// LibTorch's C++ modules have no forward hooks, so a block cooperates: it
// derives from Zero3Block and runs its forward through zero3_block():
//
//   class MyBlockImpl : public torch::nn::Module, public zerostep::Zero3Block {
//     torch::Tensor forward(torch::Tensor x) {
//       return zerostep::zero3_block(*this, x, [&](const torch::Tensor& x) {
//         return fc2(torch::relu(fc1(x)));
//       });
//     }
//   };
//
// With a stage 3 Engine owning the block, zero3_block gathers the
// block's parameters before `body`, releases them after it, and arranges for
// them to be gathered again just before the block's backward (Note [Stage 3
// groups] in zero/stage3.h). Without one (any other stage, no engine,
// inference) it just calls `body`. Parameters outside every block stay whole
// on every rank, so any module trains correctly; blocks are what bring the
// memory down to about 1/W of the model plus one block.
//
// This package is a leaf below models/ and engine/: a model depends on it,
// never on the engine.
//
// Thread safety: a block remembers the engine that owns it (set when a
// stage 3 Engine is constructed over the model, cleared when it is
// destroyed), so the forward may run on any thread. A model belongs to one
// Engine at a time.
#ifndef ZEROSTEP_BLOCKS_ZERO3_BLOCK_H_
#define ZEROSTEP_BLOCKS_ZERO3_BLOCK_H_

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace zerostep {

namespace internal {
class Zero3Hooks;
}  // namespace internal

// A base for modules whose parameters form one stage 3 group.
class Zero3Block {
 public:
  virtual ~Zero3Block() = default;

  // For the Engine: the hooks of the stage 3 engine that owns this block,
  // or nullptr.
  internal::Zero3Hooks* zero3_hooks() const { return zero3_hooks_; }
  void set_zero3_hooks(internal::Zero3Hooks* hooks) { zero3_hooks_ = hooks; }

 private:
  internal::Zero3Hooks* zero3_hooks_ = nullptr;
};

// The trainable parameters of `model` (requires_grad), in registration
// order: what an Engine trains, and the order of every flat buffer.
std::vector<torch::Tensor> trainable_parameters(const torch::nn::Module& model);

// Where the blocks of `model` are: the Zero3Block modules in
// named_modules() order, and for each trainable parameter (in
// trainable_parameters() order) the index of the innermost block holding
// it, or -1 (Note [Stage 3 grouping rule] in zero/grouping.h).
struct Zero3BlockMap {
  std::vector<torch::nn::Module*> blocks;
  std::vector<int> block_of_param;
};
Zero3BlockMap map_zero3_blocks(const torch::nn::Module& model);

torch::Tensor zero3_block(
    torch::nn::Module& block, const torch::Tensor& input,
    const std::function<torch::Tensor(const torch::Tensor&)>& body);

namespace internal {

// What a stage 3 engine does around a block (implemented by the engine's
// stage 3 binding, engine/stage3_binding.h).
class Zero3Hooks {
 public:
  virtual ~Zero3Hooks() = default;
  // Returns false if `block` holds no group of the engine (all its
  // parameters are persistent or frozen).
  virtual bool enter(torch::nn::Module& block) = 0;
  virtual torch::Tensor exit(torch::nn::Module& block,
                             const torch::Tensor& output) = 0;
  virtual void abandon(torch::nn::Module& block) = 0;  // body threw
};

}  // namespace internal
}  // namespace zerostep

#endif  // ZEROSTEP_BLOCKS_ZERO3_BLOCK_H_
