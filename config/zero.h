// The "zero_optimization" section of a ds_config: the ZeRO stage, its
// buckets and overlap, and offload_optimizer / offload_param, under every
// name DeepSpeed accepts: its stage3_-less field names and their stage3_
// aliases, the deprecated cpu_offload (offload_optimizer.device "cpu") and
// cpu_offload_param (offload_param.device "cpu"), and the deprecated
// "zero_optimization": true (stage 1; false is stage 0). ZeroConfig is part
// of Config (config/config.h); ZeroSection is parse_config's reader for the
// section. docs/config.md describes each key.
//
// Thread safety: the structs are values; a ZeroSection belongs to one parse.
#ifndef ZEROSTEP_CONFIG_ZERO_H_
#define ZEROSTEP_CONFIG_ZERO_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/zero_defaults.h"
#include "config/problems.h"

namespace zerostep {

enum class OffloadDevice { kNone, kCpu, kNvme };

// zero_optimization.offload_optimizer / offload_param (docs/config.md).
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;  // "none", "cpu", "nvme"
  std::string nvme_path;                        // required for "nvme"
  bool pin_memory = false;                      // accepted; see docs
  // In-memory sub-group buffers of the NVMe swapper (DeepSpeed: 4 for the
  // optimizer, 5 for parameters).
  int64_t buffer_count = 4;
};

struct ZeroConfig {
  int stage = 0;              // zero_optimization.stage
  bool overlap_comm = false;  // zero_optimization.overlap_comm
  // Elements per reduction bucket. DeepSpeed's 0 is stored as 1: it flushes
  // its bucket before a parameter that would overflow it, so 0 and 1 both
  // reduce one parameter at a time (zerostep's smallest bucket is
  // 16 × world_size elements; docs/config.md).
  int64_t reduce_bucket_size = zero_defaults::kBucketElements;
  int64_t allgather_bucket_size = zero_defaults::kBucketElements;  // elements
  bool contiguous_gradients = true;
  // Stage 3: parameters with fewer elements stay whole on every rank
  // (zero_optimization.stage3_param_persistence_threshold or its other
  // name, param_persistence_threshold).
  int64_t stage3_param_persistence_threshold =
      zero_defaults::kPersistenceThreshold;
  // Stage 3: the largest block group (elements) gathered ahead of its use
  // (zero_optimization.stage3_prefetch_bucket_size or its other name
  // prefetch_bucket_size; DeepSpeed's default 5e7; 0 turns it off; Note
  // [Stage 3 prefetch] in zero/stage3.h).
  int64_t stage3_prefetch_bucket_size = 50000000;
  // Stage 3: a block group stays gathered from its forward to its backward
  // when fewer elements than this run in between
  // (zero_optimization.stage3_max_reuse_distance or max_reuse_distance;
  // DeepSpeed's default 1e9; 0 releases after every forward; Note [Stage 3
  // reuse distance] in zero/stage3.h).
  int64_t stage3_max_reuse_distance = zero_defaults::kMaxReuseDistance;
  // Stage 3: a prefetch is issued only while the gathered block groups stay
  // within this many elements (zero_optimization.stage3_max_live_parameters
  // or max_live_parameters; DeepSpeed's default 1e9).
  int64_t stage3_max_live_parameters = 1000000000;
  // zerostep's own key zero_optimization.reduce_once_per_step: stages 2/3
  // accumulate a window's gradients unsharded and reduce-scatter them once,
  // in step() (Note [Reduce once per step] in zero/stage.h). Off by default
  // (DeepSpeed reduces after every backward); no effect at stages 0/1.
  bool reduce_once_per_step = false;
  // zerostep's own key zero_optimization.gather_once_per_step: at stage 3 a
  // block's parameters, once gathered, stay gathered until the step (Note
  // [Stage 3 gather once per step] in zero/stage3.h). Off by default
  // (DeepSpeed gathers for every forward); parameters are whole below
  // stage 3, so no effect there.
  bool gather_once_per_step = false;
  // Optimizer state offload (stages 1-3) and parameter offload (stage 3;
  // below stage 3 the section is ignored, as in DeepSpeed, and this keeps
  // its defaults).
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
  // Elements per NVMe swap sub-group (DeepSpeed's default 1e9: one
  // sub-group per partition unless the partition is larger). DeepSpeed's 0
  // is stored as 1: a DeepSpeed sub-group closes once it holds at least
  // this many elements, so 0 and 1 both mean one parameter per sub-group
  // there (one element per sub-group here; docs/config.md).
  int64_t sub_group_size = 1000000000;
};

const char* to_string(OffloadDevice d);

// Reads "zero_optimization" into *out as parse_config meets it, and checks
// the offload sections against the stage once the whole document has been
// read. Problems in document order, then the section's cross-key checks
// (two names of one setting, a deprecated name against the section that
// replaced it), then check_offload()'s.
class ZeroSection {
 public:
  // `*out` and `*report` must outlive the section.
  ZeroSection(ZeroConfig* out, ProblemReporter* report)
      : out_(out), report_(report) {}

  // The section's value: an object, or DeepSpeed's deprecated true/false.
  void parse(const ConfigJson& v);
  // The top-level "allgather_size", which DeepSpeed reads as
  // allgather_bucket_size only when "zero_optimization" is a boolean.
  void parse_allgather_size(const ConfigJson& v);

  // False when zero_optimization.stage was given and rejected: rules that
  // depend on the stage are then skipped (they would only mislead).
  bool stage_valid() const { return stage_valid_; }

  // After the whole document: optimizer offload needs stage 1, 2 or 3 and
  // parameter offload stage 3 (nothing when the stage was rejected).
  void check_offload();

 private:
  // zero_optimization.offload_optimizer or zero_optimization.offload_param
  // into *o. `ignored`: below stage 3 offload_param is checked (names,
  // types, devices) but not used, listed once as ignored. Returns the device
  // the section asks for (kNone for null), or nullopt when it was rejected.
  std::optional<OffloadDevice> parse_offload(const std::string& key,
                                             const ConfigJson& v,
                                             OffloadConfig* o, bool ignored);
  // A whole number >= 0 (stage 3's persistence threshold, prefetch size).
  void parse_count(const std::string& key, const ConfigJson& v,
                   const std::string& want, int64_t* out);
  // A bucket or sub-group size >= 0 (0 stored as 1; ZeroConfig).
  void parse_size_zero_as_one(const std::string& key, const ConfigJson& v,
                              const std::string& want, int64_t* out);
  void parse_allgather_bucket_size(const std::string& key, const ConfigJson& v);
  // A deprecated boolean (cpu_offload, cpu_offload_param) against the
  // section that replaced it: true means device "cpu", false no offload.
  void reconcile_legacy(const std::string& legacy_key, bool legacy,
                        const std::string& section_key,
                        std::optional<OffloadDevice> section_device,
                        bool section_given, OffloadConfig* o);

  ZeroConfig* out_;
  ProblemReporter* report_;
  bool stage_valid_ = true;
  // The key that enabled optimizer offload (for messages).
  std::string optimizer_offload_key_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_ZERO_H_
