// The batch keys of a ds_config: train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps (GAS), with
//   train_batch_size = train_micro_batch_size_per_gpu × GAS × world_size
// (any two determine the third; a mismatch is an error; "auto" is rejected
// with the number to write where it can be derived), and the accumulation
// mode: managed_gradient_accumulation, gradient_accumulation_scaling.
//
// GradAccumScaling is part of Config (config/config.h); BatchSection is
// parse_config's reader for these keys. docs/config.md describes each key.
//
// Thread safety: GradAccumScaling is a value and the functions are
// reentrant; a BatchSection belongs to one parse.
#ifndef ZEROSTEP_CONFIG_BATCH_H_
#define ZEROSTEP_CONFIG_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "config/problems.h"

namespace zerostep {

// How gradients accumulated over a window are scaled (see DESIGN.md §1).
enum class GradAccumScaling {
  kConfigured,    // backward(loss, scale_wrt_gas=true) divides by the
                  // configured gradient_accumulation_steps (DeepSpeed).
  kPerStepCount,  // step() divides the accumulated gradient by the number of
                  // backward() calls in the window.
  kNone,          // gradients are summed over the window.
};

const char* to_string(GradAccumScaling s);
// The mode named `name` ("configured", "per_step_count", "none"; any letter
// case), or nullopt.
std::optional<GradAccumScaling> grad_accum_scaling_from_string(
    const std::string& name);

// The three batch keys once resolved.
struct BatchSizes {
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
};

// Reads the batch keys as parse_config meets them in the document, and
// resolves the batch sizes once the whole document has been read (the fix
// for an "auto" batch key needs the others). Problems go to the reporter in
// that order: each key's own problems as it is read, then the arithmetic's.
class BatchSection {
 public:
  // `*report` must outlive the section.
  explicit BatchSection(ProblemReporter* report) : report_(report) {}

  // One of train_batch_size, train_micro_batch_size_per_gpu,
  // gradient_accumulation_steps: must be a positive whole number; null is
  // as absent (DeepSpeed's default, None).
  void parse_size(const std::string& key, const ConfigJson& v);
  // managed_gradient_accumulation: a JSON boolean (null, which DeepSpeed
  // reads as false, is rejected).
  void parse_managed(const ConfigJson& v);
  // gradient_accumulation_scaling: a mode name (did you mean for a typo).
  void parse_scaling(const ConfigJson& v);

  // After every key was read, while the document they came from is still
  // alive (the section keeps pointers to its values): fills in the fix of each
  // "auto" batch key and returns nullopt, or checks the relation for
  // `world_size` ranks and returns the three sizes, or returns nullopt after
  // reporting why not. Reports nothing more when a batch key was rejected (the
  // arithmetic would only mislead) or when world_size < 1 (parse_config reports
  // that).
  std::optional<BatchSizes> resolve(int world_size);

  // managed_gradient_accumulation as read; true when absent or rejected.
  bool managed_gradient_accumulation() const { return managed_; }
  // gradient_accumulation_scaling as read; kConfigured when absent or
  // rejected.
  GradAccumScaling scaling() const { return scaling_; }

 private:
  // A batch key as read: `value` is set only when present and valid.
  struct Key {
    const ConfigJson* raw = nullptr;
    std::optional<int64_t> value;
    bool bad = false;                // present but rejected
    size_t auto_problem = SIZE_MAX;  // index of its "auto" problem, if any
  };

  ProblemReporter* report_;
  Key keys_[3];  // train_batch_size, micro, gas
  bool managed_ = true;
  GradAccumScaling scaling_ = GradAccumScaling::kConfigured;
};

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_BATCH_H_
