// The "optimizer" section of a ds_config:
//   { "type": "AdamW", "params": { "lr": 0.001, "betas": [0.9, 0.999], ... } }
// DeepSpeed's names: "Adam" (decoupled weight decay unless
// params.adam_w_mode is false), "AdamW", "SGD", in any letter case.
// OptimizerConfig is part of Config (config/config.h); OptimizerSection is
// parse_config's reader for the section. docs/config.md describes each key.
//
// Thread safety: OptimizerConfig is a value; an OptimizerSection belongs to
// one parse.
#ifndef ZEROSTEP_CONFIG_OPTIMIZER_H_
#define ZEROSTEP_CONFIG_OPTIMIZER_H_

#include <string>

#include "config/problems.h"

namespace zerostep {

enum class OptimizerType { kAdam, kAdamW, kSGD };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;  // "optimizer.type"
  double lr = 1e-3;                            // params.lr
  double beta1 = 0.9;                          // params.betas[0]
  double beta2 = 0.999;                        // params.betas[1]
  double eps = 1e-8;                           // params.eps
  double weight_decay = 0.0;                   // params.weight_decay
  double momentum = 0.0;                       // params.momentum (SGD)
  // params.bias_correction (Adam, AdamW): false divides neither moment by
  // (1 - beta^t), as DeepSpeed's FusedAdam and CPU Adam do then.
  bool bias_correction = true;
};

const char* to_string(OptimizerType t);

// Reads the "optimizer" section into *out (which keeps its values where the
// section does not set them). Problems, in document order: unknown section
// keys, then a missing, non-string or unknown type, then each param
// (wrong JSON type, out of range, a param of the other optimizer family,
// unknown names with did you mean). adam_w_mode for a type other than
// "Adam" is ignored; bias_correction must be a boolean (null, which
// DeepSpeed's kernels read as false, is rejected); DeepSpeed's other params
// (torch_adam, amsgrad, ...) are decided by the key table (config/keys.h).
// A null params keeps every default, as in DeepSpeed.
class OptimizerSection {
 public:
  // `*out` and `*report` must outlive the section.
  OptimizerSection(OptimizerConfig* out, ProblemReporter* report)
      : out_(out), report_(report) {}

  void parse(const ConfigJson& v);

 private:
  // "applies to <types> only": a param of the other optimizer family.
  void not_for_type(const std::string& key, const ConfigJson& v,
                    const std::string& types);
  void parse_betas(const std::string& key, const ConfigJson& v);

  OptimizerConfig* out_;
  ProblemReporter* report_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_OPTIMIZER_H_
