// LoRA adapters (Hu et al., 2021) for linear layers: y = base(x) +
// (alpha / rank) * x A^T B^T, with A [rank, in] and B [out, rank].
//
// A is drawn from N(0, 1/in) by a generator seeded from `seed` alone, and B
// starts at zero, so a freshly adapted model computes exactly what its base
// computes, and adding adapters never consumes torch's global random
// stream (the base weights of a seeded model are the same with or without
// adapters).
//
// Parameter names: "lora_a", "lora_b". freeze_all_but_lora() uses them.
//
// Thread safety: as torch::nn::Module.
#ifndef ZEROSTEP_MODELS_LORA_H_
#define ZEROSTEP_MODELS_LORA_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace zerostep {

struct LoraOptions {
  int64_t rank = 0;        // 0 = no adapters
  double alpha = 0.0;      // scaling numerator; 0 = rank (scale 1)
  uint64_t seed = 0;       // initialisation of every A
  bool attn = true;        // adapters on attention projections
  bool mlp = true;         // adapters on the MLP layers
  bool unembed = true;     // adapter on the LM head
};

class LoraAdapterImpl : public torch::nn::Module {
 public:
  // `stream` distinguishes the adapters of one model (A differs per layer
  // for the same seed).
  LoraAdapterImpl(int64_t in_features, int64_t out_features,
                  const LoraOptions& options, uint64_t stream);
  // The adapter's contribution, added to the base layer's output.
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor a_, b_;
  double scale_;
};
TORCH_MODULE(LoraAdapter);

// An adapter's initial A, [rank, in_features], drawn from N(0, 1/in) by a
// generator seeded from (seed, stream) alone: what LoraAdapter starts from,
// and the PEFT-named adapters of models/hf_decoder.h too.
torch::Tensor lora_initial_a(int64_t rank, int64_t in_features, uint64_t seed,
                             uint64_t stream);

// Whether a parameter name is a LoRA adapter's: "...lora_a" and
// "...lora_b" (LoraAdapter), "...lora_A.weight" and "...lora_B.weight"
// (PEFT's names, models/hf_decoder.h).
bool is_lora_parameter_name(const std::string& name);

// base(x) + adapter(x), or base(x) when `adapter` is empty.
torch::Tensor lora_linear(torch::nn::Linear& base, LoraAdapter& adapter,
                          const torch::Tensor& x);

// Sets requires_grad = false on every parameter whose name is not a LoRA
// adapter's (is_lora_parameter_name). Returns the number of parameters left
// trainable.
int64_t freeze_all_but_lora(torch::nn::Module& model);

}  // namespace zerostep

#endif  // ZEROSTEP_MODELS_LORA_H_
