// The mixed-precision sections of a ds_config: "fp16", "bf16" (alias
// "bfloat16") and "data_types" (grad_accum_dtype, param_dtype). ("amp" and
// "torch_autocast" are decided by the key table, config/keys.h.)
// precision/precision.h Note [Precision model], engine/loss_scaler.h Note
// [Loss scale schedule]. PrecisionConfig is part of Config (config/config.h);
// PrecisionSection is parse_config's reader for these sections. docs/config.md
// describes each key.
//
// Thread safety: PrecisionConfig is a value; a PrecisionSection belongs to
// one parse.
#ifndef ZEROSTEP_CONFIG_PRECISION_H_
#define ZEROSTEP_CONFIG_PRECISION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/zero_defaults.h"
#include "config/problems.h"
#include "precision/precision.h"

namespace zerostep {

struct PrecisionConfig {
  // kBf16: bf16.enabled; kFp16: fp16.enabled; both at once is an error.
  Precision dtype = Precision::kFp32;
  // data_types.grad_accum_dtype: the window's accumulation format; fp32 or
  // the training dtype.
  Precision grad_accum_dtype = Precision::kFp32;
  // fp16 only.
  double loss_scale = 0.0;           // 0 = dynamic
  // dynamic start: 2^power
  int initial_scale_power = zero_defaults::kInitialScalePower;
  // clean iterations before doubling
  int64_t loss_scale_window = zero_defaults::kLossScaleWindow;
  // overflows absorbed before halving
  int64_t hysteresis = zero_defaults::kHysteresis;
  bool consecutive_hysteresis = false;
  double min_loss_scale = zero_defaults::kMinLossScale;
};

// Reads the sections into *out as parse_config meets them, and checks
// grad_accum_dtype and param_dtype against the training dtype once the
// whole document has been read. Problems in document order, then check()'s.
// A section with "enabled": false (or without "enabled"), and a null
// "bf16", is listed as ignored.
class PrecisionSection {
 public:
  // `*out` and `*report` must outlive the section.
  PrecisionSection(PrecisionConfig* out, ProblemReporter* report)
      : out_(out), report_(report) {}

  void parse_fp16(const ConfigJson& v);
  // `section` is "bf16" or "bfloat16".
  void parse_bf16(const std::string& section, const ConfigJson& v);
  void parse_data_types(const ConfigJson& v);

  // After the whole document: grad_accum_dtype must be fp32 or the training
  // dtype; param_dtype, when given, the training dtype.
  void check();

 private:
  // The section's "enabled" (false when absent), or nullopt when the section
  // is not an object or "enabled" is not a boolean (recorded).
  std::optional<bool> section_enabled(const std::string& key,
                                      const ConfigJson& v);
  // Sets the training dtype; a second section enabling one is a problem.
  void enable_precision(const std::string& key, Precision p);

  PrecisionConfig* out_;
  ProblemReporter* report_;
  std::string precision_key_;  // the section that enabled mixed precision
  // data_types.param_dtype as given (nullopt: absent or null).
  std::optional<Precision> param_dtype_;
  std::string param_dtype_dump_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_PRECISION_H_
