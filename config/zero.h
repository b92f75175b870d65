// The "zero_optimization" section of a ds_config: the ZeRO stage, its
// buckets and overlap, and offload_optimizer / offload_param (with
// DeepSpeed's old spelling cpu_offload = true for offload_optimizer.device =
// "cpu"). ZeroConfig is part of Config (config/config.h); ZeroSection is
// parse_config's reader for the section. docs/config.md describes each key.
//
// Thread safety: the structs are values; a ZeroSection belongs to one parse.
#ifndef ZEROSTEP_CONFIG_ZERO_H_
#define ZEROSTEP_CONFIG_ZERO_H_

#include <cstdint>
#include <string>

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
  int stage = 0;                              // zero_optimization.stage
  bool overlap_comm = false;                  // zero_optimization.overlap_comm
  int64_t reduce_bucket_size = 500000000;     // elements
  int64_t allgather_bucket_size = 500000000;  // elements
  bool contiguous_gradients = true;
  // Stage 3: parameters with fewer elements stay whole on every rank.
  int64_t stage3_param_persistence_threshold = 100000;
  // Optimizer state offload (stages 1-3) and parameter offload (stage 3).
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
  // Elements per NVMe swap sub-group (DeepSpeed's default 1e9: one
  // sub-group per partition unless the partition is larger).
  int64_t sub_group_size = 1000000000;
};

const char* to_string(OffloadDevice d);

// Reads "zero_optimization" into *out as parse_config meets it, and checks
// the offload sections against the stage once the whole document has been
// read. Problems in document order, then check_offload()'s.
class ZeroSection {
 public:
  // `*out` and `*report` must outlive the section.
  ZeroSection(ZeroConfig* out, ProblemReporter* report)
      : out_(out), report_(report) {}

  void parse(const ConfigJson& v);

  // False when zero_optimization.stage was given and rejected: rules that
  // depend on the stage are then skipped (they would only mislead).
  bool stage_valid() const { return stage_valid_; }

  // After the whole document: optimizer offload needs stage 1, 2 or 3 and
  // parameter offload stage 3 (nothing when the stage was rejected).
  void check_offload();

 private:
  // zero_optimization.offload_optimizer or zero_optimization.offload_param.
  void parse_offload(const std::string& key, const ConfigJson& v);

  ZeroConfig* out_;
  ProblemReporter* report_;
  bool stage_valid_ = true;
  // The key that enabled optimizer offload (for messages).
  std::string optimizer_offload_key_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_ZERO_H_
