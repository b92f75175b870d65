// External weights: what save_weights_external writes, in formats other
// tools read. Torch-free (over engine/safetensors.h).
//
// Note [External weights]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The input is the file Engine::export_full_model writes: every trainable
// parameter, float32, under TinyGpt's named_parameters() names. A LoRA
// model trains only its adapters ("<module>_lora.lora_a" [r, in] and
// ".lora_b" [out, r], scale alpha / r), which is PEFT's LoRA exactly
// (lora_A.weight, lora_B.weight, lora_alpha / r): write_peft_adapter
// renames each to "base_model.model.<module>.lora_A.weight" (as peft's
// save_pretrained names them) into adapter_model.safetensors and writes
// adapter_config.json (peft_type LORA, r, lora_alpha, target_modules, ...).
// A model trained in full is written as model.safetensors under the
// model's own parameter names (zerostep's TinyGpt is the framework) with
// a config.json giving its shape. The files are what a user downloads
// (Note [Signed downloads] in downloads.h); tinker_meta.json beside them is
// the server's own and is not offered.
//
// models/ writes PEFT adapters for the Hugging Face decoders the same way
// (issue 39); swapping this writer for that one changes no file format.
//
// Thread safety: free functions.
#ifndef ZEROSTEP_TOOLS_TINKER_EXPORT_WEIGHTS_H_
#define ZEROSTEP_TOOLS_TINKER_EXPORT_WEIGHTS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/safetensors.h"

namespace zerostep {
namespace tinker {

// A LoRA model's adapters as PEFT describes them.
struct AdapterSpec {
  int64_t rank = 0;
  double alpha = 0.0;  // 0: rank (scale 1)
  bool attn = true, mlp = true, unembed = true;
  std::string base_model;
};

// PEFT's tensor name for a TinyGpt adapter parameter ("block0.qkv_lora.
// lora_a" -> "base_model.model.block0.qkv.lora_A.weight"); empty if `name`
// is not an adapter's.
std::string peft_name(const std::string& name);

// The module names PEFT's target_modules lists for `spec`.
std::vector<std::string> peft_target_modules(const AdapterSpec& spec);

// Writes <dir>/adapter_model.safetensors and <dir>/adapter_config.json
// from `trainable` (Note [External weights]). UsageError if a tensor is
// not an adapter's or there is none; IoError if a file cannot be written.
void write_peft_adapter(const SafetensorsFile& trainable,
                        const AdapterSpec& spec, const std::string& dir);

// Writes <dir>/model.safetensors (the tensors as given) and
// <dir>/config.json (`config`). IoError if a file cannot be written.
void write_full_model(const SafetensorsFile& params,
                      const nlohmann::json& config, const std::string& dir);

// The files of an external weights folder a user may download: every
// regular file but tinker_meta.json, sorted.
std::vector<std::string> external_weight_files(const std::string& dir);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_EXPORT_WEIGHTS_H_
