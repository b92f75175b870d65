// The base models this trainer server serves: byte-level TinyGpt presets.
// Torch-free.
//
// Thread safety: immutable values.
#ifndef ZEROSTEP_TOOLS_TINKER_BASE_MODEL_H_
#define ZEROSTEP_TOOLS_TINKER_BASE_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

namespace zerostep {
namespace tinker {

// A built-in base model: a byte-level TinyGpt preset.
struct BaseModel {
  std::string name;          // e.g. "zerostep/tiny-gpt"
  int64_t vocab_size = 256;  // byte-level tokens
  int64_t max_context = 64;  // tokens per datum
  int64_t d_model = 32;
  int64_t n_head = 2;
  int64_t n_layer = 2;
};
const std::vector<BaseModel>& base_models();

// The base model called `name`; UsageError naming the served ones if none
// is.
const BaseModel& find_base_model(const std::string& name);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_BASE_MODEL_H_
