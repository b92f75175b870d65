// HfCheckpointSource: the tensors of a Hugging Face model folder, read
// range by range from its safetensors files (a ParameterSource,
// engine/parameter_source.h). Torch-free.
//
// A folder holds either model.safetensors, or model.safetensors.index.json
// whose "weight_map" names, for every tensor, the shard file holding it
// (transformers' save_pretrained writes one or the other). Construction
// reads and checks the headers only (Note [Safetensors layout] in
// engine/safetensors.h); read() then reads exactly the bytes of the range
// asked for, with pread(2), and widens them to float32: F32 as stored,
// BF16 and F16 exactly (every bf16 and fp16 value is a float32 value).
//
// Names are the file's names. The models of models/hf_decoder.h name
// their parameters as transformers does (model.layers.0.self_attn.q_proj.
// weight, ...), so no mapping is needed between the two.
//
// Thread safety: read() may be called from several threads at once (the
// ranks of a simulated world): it only preads from descriptors opened at
// construction. The files must not change while the source exists.
#ifndef ZEROSTEP_ENGINE_HF_CHECKPOINT_H_
#define ZEROSTEP_ENGINE_HF_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/parameter_source.h"
#include "engine/safetensors.h"

namespace zerostep {

// The file names transformers uses.
inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfWeightsIndexFile =
    "model.safetensors.index.json";

// Where one tensor of the folder lies.
struct HfTensorInfo {
  std::string file;             // the shard's path
  std::string dtype;            // safetensors dtype: "F32", "BF16", ...
  std::vector<int64_t> shape;   // empty: a scalar
  uint64_t file_offset = 0;     // its first byte in the file
  int64_t numel() const;
};

class HfCheckpointSource final : public ParameterSource {
 public:
  // Opens `dir`: its model.safetensors.index.json when there is one, else
  // its model.safetensors. IoError naming the path when neither exists, a
  // file cannot be read, a header breaks the format's rules, the index is
  // not {"weight_map": {name: file}} with plain file names in `dir`, or it
  // names a tensor its file lacks.
  explicit HfCheckpointSource(const std::string& dir);
  ~HfCheckpointSource() override;
  HfCheckpointSource(const HfCheckpointSource&) = delete;
  HfCheckpointSource& operator=(const HfCheckpointSource&) = delete;

  // ParameterSource. Besides its errors: UsageError when the tensor is not
  // F32, BF16 or F16, or offset or numel is negative.
  void read(const std::string& name, int64_t offset, int64_t numel,
            float* out) const override;

  const std::string& dir() const { return dir_; }
  bool contains(const std::string& name) const {
    return tensors_.count(name) != 0;
  }
  // UsageError naming the folder when there is no such tensor.
  const HfTensorInfo& tensor(const std::string& name) const;
  // Every tensor, by name.
  const std::map<std::string, HfTensorInfo>& tensors() const {
    return tensors_;
  }

 private:
  std::string dir_;
  std::map<std::string, HfTensorInfo> tensors_;
  std::map<std::string, int> fds_;  // file path -> open descriptor
};

// Whether the dtype is one read() widens to float32 (F32, BF16, F16).
bool hf_float_dtype(const std::string& dtype);

// The whole safetensors file at `path`, read and decoded (for small files:
// LoRA adapters, test data; a model's weights go through
// HfCheckpointSource). IoError naming `path` when it cannot be read or
// breaks a rule of Note [Safetensors layout].
SafetensorsFile read_safetensors_file(const std::string& path);

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_HF_CHECKPOINT_H_
