#include "engine/zero3_block.h"

namespace zerostep {
namespace {
thread_local internal::Zero3Hooks* thread_hooks = nullptr;
}  // namespace

namespace internal {
Zero3Hooks* set_thread_zero3_hooks(Zero3Hooks* hooks) {
  Zero3Hooks* previous = thread_hooks;
  thread_hooks = hooks;
  return previous;
}
}  // namespace internal

torch::Tensor zero3_block(
    torch::nn::Module& block, const torch::Tensor& input,
    const std::function<torch::Tensor(const torch::Tensor&)>& body) {
  internal::Zero3Hooks* hooks = thread_hooks;
  if (hooks == nullptr || !hooks->enter(block)) return body(input);
  torch::Tensor output;
  try {
    output = body(input);
  } catch (...) {
    hooks->abandon(block);
    throw;
  }
  return hooks->exit(block, output);
}

}  // namespace zerostep
