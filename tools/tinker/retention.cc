#include "tools/tinker/retention.h"

#include <chrono>
#include <ctime>

#include "common/errors.h"
#include "tools/tinker/request_fields.h"

namespace zerostep {
namespace tinker {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::optional<int64_t> expiry_from_ttl(const nlohmann::json& args,
                                       const char* key, int64_t now_unix,
                                       const std::string& what) {
  if (!args.is_object() || !args.contains(key) || args[key].is_null())
    return std::nullopt;
  const int64_t ttl = get_or<int64_t>(args, key, 0);
  if (ttl < kTtlMinS || ttl > kTtlMaxS)
    throw UsageError(what + ": " + key + " = " + std::to_string(ttl) +
                     " must be from " + std::to_string(kTtlMinS) +
                     " (1 hour) to " + std::to_string(kTtlMaxS) +
                     " (10 years), or None for no expiry. Nothing was "
                     "changed");
  return now_unix + ttl;
}

bool expired(const nlohmann::json& meta, int64_t now_unix) {
  if (!meta.is_object() || !meta.contains("expires_at")) return false;
  const nlohmann::json& e = meta["expires_at"];
  return e.is_number_integer() && e.get<int64_t>() <= now_unix;
}

std::string iso8601(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace tinker
}  // namespace zerostep
