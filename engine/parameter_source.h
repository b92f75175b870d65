// ParameterSource: where the values of a model's trainable parameters come
// from when no rank should hold the whole model at once (stage 3's
// partitioned load, in the spirit of DeepSpeed's zero.Init): each rank asks
// for the element ranges it owns and nothing else.
//
// Implementations: HfCheckpointSource (engine/hf_checkpoint.h) over a
// Hugging Face folder's safetensors files.
//
// Thread safety: read() is const; an implementation says whether several
// threads (the ranks of a simulated world) may call it at once.
#ifndef ZEROSTEP_ENGINE_PARAMETER_SOURCE_H_
#define ZEROSTEP_ENGINE_PARAMETER_SOURCE_H_

#include <cstdint>
#include <string>

namespace zerostep {

// Values of the trainable parameters, read range by range, so that no rank
// needs a whole model in memory (stage 3's partitioned load).
class ParameterSource {
 public:
  virtual ~ParameterSource() = default;
  // Elements [offset, offset + numel) of the parameter named `name` (as the
  // model's named_parameters() names it), flattened row-major, as float32,
  // into out.
  // IoError when the file cannot be read; UsageError when the name is
  // unknown or the range exceeds the tensor.
  virtual void read(const std::string& name, int64_t offset, int64_t numel,
                    float* out) const = 0;
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_PARAMETER_SOURCE_H_
