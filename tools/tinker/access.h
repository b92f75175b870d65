// Who may use the trainer server and how much: the flags for API keys,
// tenants' quotas and the HTTP limits, checked against the address the
// server listens on, and turned into HttpServer::Options. Torch-free; the
// server (tools/trainer_server.cc) and access_test share it.
//
//   --api-keys=FILE          keys file (api_keys.h); or ZEROSTEP_API_KEYS
//   --api-keys-reload-s=T    read FILE again at most every T s (2)
//   --allow-unauthenticated  serve a non-loopback --host without keys
//   --tenant-max-models=N    default quota of every tenant (no limit)
//   --tenant-max-bytes=B     default quota of every tenant (no limit)
//   --max-connections=N --max-connections-per-client=N --max-body-bytes=B
//   --header-timeout-s=T --read-timeout-s=T --idle-timeout-s=T
//                            HttpLimits (http.h)
//
// Rules (UsageError at start, naming the flag and the fix):
//   - a --host that is not a loopback address (0.0.0.0, ::, a LAN address,
//     a name that resolves beyond 127.0.0.0/8 and ::1) needs keys, or
//     --allow-unauthenticated, which is then logged as a warning;
//   - --allow-unauthenticated with keys, or both --api-keys and
//     ZEROSTEP_API_KEYS, is refused (one meaning each).
//
// Thread safety: free functions; Access is used from the threads the
// HttpServer runs (ApiKeys is thread-safe).
#ifndef ZEROSTEP_TOOLS_TINKER_ACCESS_H_
#define ZEROSTEP_TOOLS_TINKER_ACCESS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tools/tinker/api_keys.h"
#include "tools/tinker/http.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

struct AccessFlags {
  std::string api_keys_file;
  double api_keys_reload_s = 2.0;
  bool allow_unauthenticated = false;
  Caller quotas;  // the default quotas (tenant name unused)
  HttpLimits limits;
};

// Reads `arg` into `*f` if it is one of the flags above: true if it was,
// false if it is not one of them. UsageError for a bad value.
bool parse_access_flag(const std::string& arg, AccessFlags* f);

// The flags' part of --help.
std::string access_flags_usage();

// Whether every address `host` names is a loopback one (127.0.0.0/8, ::1,
// "localhost"). A name that cannot be resolved is not.
bool is_loopback_host(const std::string& host);

// What the server runs with: the keys (null without keys) and the HTTP
// front's options, which hold a pointer into `keys`.
struct Access {
  std::unique_ptr<ApiKeys> keys;
  HttpServer::Options http;
  // "keys (3 keys, tenants ...)" or "none (every request is tenant
  // 'default')", for the start line.
  std::string summary;
};

// Checks the rules above for `host`, reads the keys from the flag's file
// or `env_keys` (ZEROSTEP_API_KEYS; null or empty: unset), and builds the
// HTTP options. `log` gets the keys' lines and warnings (never a key).
Access make_access(const AccessFlags& flags, const std::string& host,
                   const char* env_keys,
                   std::function<void(const std::string&)> log);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_ACCESS_H_
