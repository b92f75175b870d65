// The "scheduler" section of a ds_config: DeepSpeed's WarmupLR,
// WarmupDecayLR and WarmupCosineLR learning-rate schedules,
//   { "type": "WarmupLR", "params": { "warmup_num_steps": 1000, ... } }
// read by parse_lr_schedule() into an LrScheduleSpec. The schedule itself
// (the lr of each update) is engine/lr_schedule.h's LrSchedule, which has
// the formulas (Note [DeepSpeed's step index]).
//
// Parameter names and defaults are DeepSpeed's
// (deepspeed/runtime/lr_schedules.py): warmup_min_lr 0, warmup_num_steps
// 1000, warmup_type "log", warmup_min_ratio 0, cos_min_ratio 0.0001.
// warmup_max_lr: WarmupLR takes the optimizer's lr (base_lr) when it is
// absent, WarmupDecayLR takes 0.001. total_num_steps has no default
// (required by WarmupDecayLR and WarmupCosineLR). WarmupLR and WarmupDecayLR
// ignore the optimizer's lr when warmup_max_lr is given; WarmupCosineLR
// always scales it.
//
// Thread safety: LrScheduleSpec is a value; parse_lr_schedule is reentrant.
#ifndef ZEROSTEP_CONFIG_SCHEDULER_H_
#define ZEROSTEP_CONFIG_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {

// How the warmup rises ("scheduler.params.warmup_type").
enum class WarmupType {
  kLog,     // "log":    ln(i + 1) / ln(W)
  kLinear,  // "linear": i / W
};

struct LrScheduleSpec {
  enum class Type {
    kNone,  // no scheduler: the optimizer's lr, constant.
    kWarmupLR,
    kWarmupDecayLR,
    kWarmupCosineLR,
  };
  Type type = Type::kNone;  // "scheduler.type"
  // WarmupLR, WarmupDecayLR.
  double warmup_min_lr = 0.0;
  // nullopt: DeepSpeed's default for the type (WarmupLR: base_lr;
  // WarmupDecayLR: 0.001).
  std::optional<double> warmup_max_lr;
  // All three. Values below 2 act as 2 (DeepSpeed: max(2, warmup_num_steps)).
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR, WarmupCosineLR: required (>= 1); may be below
  // warmup_num_steps (DeepSpeed only warns).
  int64_t total_num_steps = 0;
  // WarmupCosineLR.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
};

// Reads DeepSpeed's "scheduler" section ({"type": ..., "params": {...}}) into
// *out (which starts from LrScheduleSpec's defaults). Every problem is
// appended to *problems (keys dotted, e.g. "scheduler.params.warmup_num_steps";
// values as JSON text) and *out is then unspecified. Rejected, each with its
// own message: a missing or unknown type (did you mean, for DeepSpeed's other
// schedules "not implemented"), a missing params object (DeepSpeed calls the
// constructor with **params), unknown param names (did you mean) and names
// that belong to another of the three types, "auto", wrong JSON types,
// out-of-range values, an unknown warmup_type (DeepSpeed would silently use
// "log"), a missing total_num_steps, last_batch_iteration other than -1.
// null keeps the default where DeepSpeed's is the same: warmup_type, and
// WarmupLR's warmup_max_lr (WarmupDecayLR's null, which DeepSpeed reads as
// optimizer.params.lr, is rejected).
// With ordered_json, problems come in document order. `filled` (may be
// null): the keys parse_config filled in for "auto", whose problems say so
// (ProblemReporter::set_filled).
void parse_lr_schedule(const nlohmann::json& section, LrScheduleSpec* out,
                       std::vector<ConfigProblem>* problems);
void parse_lr_schedule(
    const nlohmann::ordered_json& section, LrScheduleSpec* out,
    std::vector<ConfigProblem>* problems,
    const std::map<std::string, std::string>* filled = nullptr);

// DeepSpeed's names: "WarmupLR", ...; "none" for kNone. "log", "linear".
const char* to_string(LrScheduleSpec::Type t);
const char* to_string(WarmupType t);

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_SCHEDULER_H_
