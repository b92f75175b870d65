// Checkpoint retention: the TTLs of saved checkpoints (save_weights,
// save_weights_for_sampler, save_weights_external take ttl_seconds;
// RestClient.set_checkpoint_ttl_from_tinker_path changes it) and the
// times the REST answers carry. Torch-free.
//
// Note [Checkpoint expiry]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint's tinker_meta.json may hold "expires_at" (Unix seconds, the
// wall clock); none means it never expires. The SDK (0.38.0) documents the
// range: 1 hour (3600 s) to 10 years, or None for no expiry. An expired
// checkpoint is gone for every request at once: loads, sampling clients,
// listings, deletes, TTL changes and downloads answer it as a checkpoint
// that does not exist (CheckpointStore and SamplerStore ask expired() on
// rank 0 before using one), and rank 0 removes its folder when it meets it
// and in a sweep of the state directory at most once a minute, so its
// bytes stop counting against the tenant's max_bytes.
//
// Thread safety: free functions over values.
#ifndef ZEROSTEP_TOOLS_TINKER_RETENTION_H_
#define ZEROSTEP_TOOLS_TINKER_RETENTION_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace zerostep {
namespace tinker {

inline constexpr int64_t kTtlMinS = 3600;                   // 1 hour
inline constexpr int64_t kTtlMaxS = int64_t{3650} * 86400;  // 10 years

// The wall clock, in Unix seconds.
int64_t unix_now();

// args[key] (the SDK's ttl_seconds) as an expiry time from `now_unix`:
// nullopt when absent or null (never expires). UsageError naming `what`,
// the value and the range when it is not an integer in [kTtlMinS,
// kTtlMaxS].
std::optional<int64_t> expiry_from_ttl(const nlohmann::json& args,
                                       const char* key, int64_t now_unix,
                                       const std::string& what);

// Whether the checkpoint whose tinker_meta.json is `meta` has expired at
// `now_unix` (Note [Checkpoint expiry]).
bool expired(const nlohmann::json& meta, int64_t now_unix);

// "2026-12-01T10:00:00Z" (the SDK's datetime).
std::string iso8601(int64_t unix_seconds);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_RETENTION_H_
