// The ds_config key names zerostep knows, section by section: the keys it
// reads, the DeepSpeed keys it accepts without acting on them (listed in
// Config::ignored_keys), and the DeepSpeed keys it always rejects with a
// message of their own. The section parsers (config/*.cc) dispatch on the
// names they read and use these tables for "did you mean" suggestions
// (config_text::closest) and for the ignore-or-reject decision, so a key
// added to a parser must be added here too.
//
// Thread safety: constant tables.
#ifndef ZEROSTEP_CONFIG_KEYS_H_
#define ZEROSTEP_CONFIG_KEYS_H_

#include <string>
#include <vector>

namespace zerostep {
namespace config_keys {

// --- top level ---
extern const std::vector<std::string> kTopSupported;
// DeepSpeed keys accepted and not acted on.
extern const std::vector<std::string> kTopIgnored;
// DeepSpeed keys that zerostep knows and always rejects (with a message of
// their own, never "unknown key").
extern const std::vector<std::string> kTopRejected;

// --- zero_optimization ---
extern const std::vector<std::string> kZeroSupported;
extern const std::vector<std::string> kZeroIgnored;
// zero_optimization.offload_optimizer / offload_param: every key DeepSpeed
// knows (those zerostep does not read are ignored).
extern const std::vector<std::string> kOffloadKeys;

// --- optimizer ---
extern const std::vector<std::string> kOptimizerKeys;
extern const std::vector<std::string> kOptimizerParams;
extern const std::vector<std::string> kOptimizerParamsIgnored;

// --- fp16, bf16 (alias bfloat16), data_types ---
extern const std::vector<std::string> kFp16Keys;
extern const std::vector<std::string> kBf16Keys;
extern const std::vector<std::string> kDataTypesKeys;

// --- scheduler ---
// The keys of the section itself.
extern const std::vector<std::string> kSchedulerKeys;
// The parameter names each schedule's constructor takes (besides the
// optimizer). last_batch_iteration is taken by all three and handled on its
// own.
extern const std::vector<std::string> kWarmupLRParams;
extern const std::vector<std::string> kWarmupDecayLRParams;
extern const std::vector<std::string> kWarmupCosineLRParams;
// Every parameter name of the three, last_batch_iteration included.
extern const std::vector<std::string> kSchedulerParams;

}  // namespace config_keys
}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_KEYS_H_
