// The ds_config keys zerostep knows, in one table: every DeepSpeed key it
// reads, every one it accepts without acting on it (listed in
// Config::ignored_keys), and every one it refuses because acting as if it
// were absent would change training. The section parsers (config/*.cc)
// dispatch on the names they read and ask this table about every other name
// (ProblemReporter::unimplemented), and docs/config.md's key table is this
// table printed (keys_test checks that the two agree), so a decision is made
// once, here.
//
// Note [Key decisions]
// ~~~~~~~~~~~~~~~~~~~~
// A key zerostep does not implement is harmless when ignoring it leaves
// training as zerostep runs it: logging, profiling, monitoring, checkpoint
// I/O, and performance or memory knobs whose numbers are the same either way.
// A key that changes training (elasticity, curriculum learning, quantization,
// a gradient pre-divide factor, ...) is accepted only at its no-op value
// (disabled, false, 1.0, ...), and listed as ignored; any other value is a
// ConfigError naming the key, the value, the rule and the fix, never
// silently dropped. The decision per key and its reason are in kDeepSpeedKeys
// (keys.cc); DeepSpeed's behaviour they describe is that of its
// deepspeed/runtime config classes (docs/config.md names the version).
//
// Thread safety: constant tables and pure functions.
#ifndef ZEROSTEP_CONFIG_KEYS_H_
#define ZEROSTEP_CONFIG_KEYS_H_

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace zerostep {
namespace config_keys {

// How zerostep treats one DeepSpeed key (Note [Key decisions]).
enum class Treatment {
  kRead,         // implemented; its section's parser reads it.
  kIgnored,      // harmless whatever its value: accepted, listed as ignored.
  kIgnoredWhen,  // harmless at the values `harmless` accepts; any other
                 // value is rejected.
  kRejected,     // rejected whatever its value.
};

struct DeepSpeedKey {
  // Dotted path: "prescale_gradients", "zero_optimization.sub_group_size".
  // Keys of "bfloat16" are those of "bf16".
  const char* path;
  Treatment treatment;
  // kIgnoredWhen: true when `v` leaves training unchanged; null otherwise.
  bool (*harmless)(const nlohmann::ordered_json& v);
  // kIgnoredWhen: the harmless values in words ("false", "1", "null or
  // \"fp32\"", ...); null otherwise.
  const char* harmless_when;
  // What the key does in DeepSpeed, and so why zerostep can read it, ignore
  // it, or must refuse it (docs/config.md's "why" column).
  const char* why;
  // kIgnoredWhen, kRejected: the rule and the fix of the rejection. A null
  // rule is "changes training; zerostep does not implement it (<why>)".
  const char* rule;
  const char* fix;
  // Another name of the same DeepSpeed setting (its pydantic field or the
  // name that replaced a deprecated one); null when none. Two names of one
  // setting with different values are an error.
  const char* alias_of;
};

// Every DeepSpeed key zerostep knows, section by section, in docs order.
// The scheduler's parameters are in the scheduler tables below instead.
extern const std::vector<DeepSpeedKey> kDeepSpeedKeys;

// The row for `path` ("bfloat16.x" finds "bf16.x"), or null.
const DeepSpeedKey* find_key(const std::string& path);

// The names of the rows directly under `section` ("" for the top level,
// "zero_optimization", "optimizer.params", ...), for "did you mean".
std::vector<std::string> names_under(const std::string& section);

// The setting a key names: its alias_of, or `path` itself.
std::string setting_of(const std::string& path);

// A name another framework uses for a ds_config key (Hugging Face
// TrainingArguments, Accelerate, Megatron-LM, ...), looked up by its dotted
// path in any letter case: the ds_config key to write instead, or "".
std::string synonym(const std::string& path);

// The key table as docs/config.md prints it: one Markdown row per key,
// "| `path` | decision | why |", in table order.
std::string markdown_table();

// The names of the keys the section parsers read. Derived from
// kDeepSpeedKeys (kRead rows).
extern const std::vector<std::string> kTopSupported;
extern const std::vector<std::string> kZeroSupported;
extern const std::vector<std::string> kOptimizerKeys;
extern const std::vector<std::string> kOptimizerParams;
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

// --- "auto" ---
// Note [Trainer values] (config/trainer_values.h): the keys whose "auto"
// Hugging Face's DeepSpeed integration fills from the trainer, with its
// rule and the TrainerValues field that gives the value.
struct AutoRule {
  // Dotted path ("optimizer.params.lr"); "bf16.enabled" also stands for
  // "bfloat16.enabled".
  const char* path;
  // How the integration computes the value ("learning_rate",
  // "hidden_size × hidden_size", ...), in its TrainingArguments' names; it
  // reads after "fills it with".
  const char* rule;
  // The TrainerValues field(s) it comes from, as written after
  // "TrainerValues::" ("learning_rate", "adam_beta1 and adam_beta2"); ""
  // when the value needs none.
  const char* field;
  // The integration's fill_only: a value written in the file (not "auto")
  // is never compared with the trainer's.
  bool fill_only;
};

// Every such key, in the order the integration fills them.
extern const std::vector<AutoRule> kAutoRules;

// The rule for `path` ("bfloat16.enabled" finds "bf16.enabled"), or null.
const AutoRule* find_auto_rule(const std::string& path);

// The "auto" table as docs/config.md prints it: one Markdown row per rule,
// "| `path` | rule | TrainerValues field | must match |", in table order.
std::string auto_markdown_table();

}  // namespace config_keys
}  // namespace zerostep

#endif  // ZEROSTEP_CONFIG_KEYS_H_
