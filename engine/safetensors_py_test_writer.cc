// Writes what engine/safetensors_py_test.py checks, into the folder given
// as the only argument: f32.safetensors and bf16.safetensors, exports of
// the mlp after one step at stage 3 on two simulated ranks, and
// expected.json, which holds for each trainable parameter (registration
// order) its name, shape and values as bit patterns: float32 from
// full_parameters(), bf16 as LibTorch rounds them (independent of
// engine/safetensors.cc's rounding).
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "config/config.h"
#include "engine/engine.h"
#include "engine/engine_test_util.h"

int main(int argc, char** argv) {
  using namespace zerostep;
  if (argc != 2) {
    std::cerr << "usage: safetensors_py_test_writer DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  MlpWorld w(2, parse_config("{\"train_micro_batch_size_per_gpu\": 2, "
                             "\"zero_optimization\": {\"stage\": 3, "
                             "\"stage3_param_persistence_threshold\": 0}}",
                             2));
  w.make_engines();
  ExportOptions bf16;
  bf16.dtype = ExportOptions::Dtype::kBF16;
  w.world->run([&](int r) {
    w.engines[r]->backward(w.loss(r, 0));
    w.engines[r]->step();
    w.engines[r]->export_full_model(dir + "/f32.safetensors");
    w.engines[r]->export_full_model(dir + "/bf16.safetensors", bf16);
  });
  const torch::Tensor f32 = w.full_parameters()[0].contiguous();
  const torch::Tensor rounded = f32.to(torch::kBFloat16).contiguous();
  const float* values = f32.data_ptr<float>();
  const c10::BFloat16* halves = rounded.data_ptr<c10::BFloat16>();
  nlohmann::json tensors = nlohmann::json::array();
  int64_t at = 0;
  for (const auto& item : w.models[0]->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    nlohmann::json f32_bits = nlohmann::json::array();
    nlohmann::json bf16_bits = nlohmann::json::array();
    for (int64_t k = 0; k < item.value().numel(); ++k, ++at) {
      uint32_t bits;
      std::memcpy(&bits, values + at, sizeof bits);
      f32_bits.push_back(bits);
      bf16_bits.push_back(halves[at].x);
    }
    tensors.push_back({{"name", item.key()},
                       {"shape", item.value().sizes().vec()},
                       {"f32_bits", f32_bits},
                       {"bf16_bits", bf16_bits}});
  }
  if (at != f32.numel()) {
    std::cerr << "safetensors_py_test_writer: " << at << " of " << f32.numel()
              << " values named\n";
    return 1;
  }
  std::ofstream(dir + "/expected.json") << tensors.dump() << "\n";
  return 0;
}
