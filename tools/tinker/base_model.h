// The base models this trainer server serves: the byte-level TinyGpt
// presets, and the Hugging Face folders given with --model=NAME=DIR
// (Llama 3, Qwen2, Qwen3: models/hf_decoder.h). Torch-free.
//
// Thread safety: serve_hf_base_models() is called once at start-up, before
// any other thread looks a base model up; after that, immutable values.
#ifndef ZEROSTEP_TOOLS_TINKER_BASE_MODEL_H_
#define ZEROSTEP_TOOLS_TINKER_BASE_MODEL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zerostep {
namespace tinker {

// A base model: a byte-level TinyGpt preset, or a Hugging Face folder.
struct BaseModel {
  std::string name;          // e.g. "zerostep/tiny-gpt"
  int64_t vocab_size = 256;  // byte-level tokens
  int64_t max_context = 64;  // tokens per datum (HF: max_position_embeddings)
  int64_t d_model = 32;      // HF: hidden_size (the largest LoRA rank)
  int64_t n_head = 2;
  int64_t n_layer = 2;
  // The folder (config.json, safetensors, tokenizer.json) of a Hugging
  // Face model; empty for a TinyGpt preset.
  std::string hf_dir;
  // "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", or
  // "zerostep-tiny-gpt".
  std::string arch = "zerostep-tiny-gpt";
  // The tokens that end every sample: the folder's eos_token_id (config.json
  // and generation_config.json, an id or a list); none for the presets.
  std::vector<int64_t> eos_token_ids;

  bool is_hf() const { return !hf_dir.empty(); }
};

// The presets, then the folders serve_hf_base_models() added.
const std::vector<BaseModel>& base_models();

// The base model called `name`; UsageError naming the served ones if none
// is.
const BaseModel& find_base_model(const std::string& name);

// The folder `dir` as the base model `name`: its config.json read by
// models/hf_config.h's rules, its EOS ids. UsageError naming the folder and
// the problem (no config.json, an architecture or key not served, an
// eos_token_id that is not an id or a list of ids).
BaseModel hf_base_model(const std::string& name, const std::string& dir);

// "NAME=DIR" (the --model flag's value) split at its first '='. UsageError
// naming the value and the rule when NAME or DIR is empty.
std::pair<std::string, std::string> split_model_flag(const std::string& value);

// Adds `models` to base_models(). UsageError (nothing added) when a name is
// served already or given twice. Call once, before serving.
void serve_hf_base_models(const std::vector<BaseModel>& models);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_BASE_MODEL_H_
