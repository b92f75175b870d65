#include "offload/libtorch_reference.h"

namespace zerostep {

double max_rel_diff_from_libtorch(const TorchOptimizerFactory& make_theirs,
                                  const OptimizerStepFn& ours, int steps) {
  const int64_t n = kLibTorchReferenceNumel;
  torch::manual_seed(7);
  torch::Tensor theirs = torch::randn({n}).set_requires_grad(true);
  std::vector<float> mine(theirs.data_ptr<float>(),
                          theirs.data_ptr<float>() + n);
  std::unique_ptr<torch::optim::Optimizer> opt = make_theirs({theirs});
  for (int step = 0; step < steps; ++step) {
    torch::Tensor g = torch::randn({n}) * (1.0 + step % 5);
    theirs.mutable_grad() = g.clone();
    opt->step();
    ours(mine.data(), g.data_ptr<float>(), step + 1);
  }
  const torch::Tensor a = torch::from_blob(mine.data(), {n}).clone();
  const torch::Tensor b = theirs.detach();
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

}  // namespace zerostep
