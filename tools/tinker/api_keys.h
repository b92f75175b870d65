// ApiKeys: the trainer server's API keys, each with its tenant
// (tenancy.h) and quotas, read from a file (--api-keys=FILE) or from the
// environment (ZEROSTEP_API_KEYS), checked in constant time, and read again
// when the file changes, without a restart.
//
// The text: one key per line (or per comma-separated entry of
// ZEROSTEP_API_KEYS); '#' starts a comment; blank lines are skipped.
//
//   KEY [TENANT] [max_models=N|unlimited] [max_bytes=N[K|M|G|T]|unlimited]
//
//   tml-3f9c0d...   alice                 # two keys of one tenant: a
//   tml-77aa21...   alice   max_models=4  # rotation in progress
//   tml-b0c4e5...   bob     max_bytes=20G
//   tml-9d1e6f...                         # a tenant of its own
//
// KEY: "tml-" (the prefix the SDK requires) and at least 20 more
// characters, printable ASCII without spaces, '#' or ','. TENANT: a tenant
// name (tenant_name_problem()); without one, the key is a tenant of its
// own named "key-" and the first 12 hex digits of the key's SHA-256 (so
// rotating such a key starts a new tenant: name tenants whose checkpoints
// must outlive a key). max_models and max_bytes set the tenant's quotas,
// overriding the server's defaults; lines of one tenant must not set them
// differently.
//
// Secrets: no key is kept, printed or quoted. Keys are held as SHA-256
// digests; a presented key is hashed and compared with every digest by
// CRYPTO_memcmp, all of them every time, so the time taken depends on the
// presented key's length and the number of keys, never on how much of a
// key is right. Errors about the text name the line and the field, never
// its content.
//
// Thread safety: authenticate() and the accessors may be called from any
// number of threads; a reload swaps the whole key set at once, so a
// request is checked against the old set or the new one, never a mix.
#ifndef ZEROSTEP_TOOLS_TINKER_API_KEYS_H_
#define ZEROSTEP_TOOLS_TINKER_API_KEYS_H_

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {

// A parsed key text (immutable).
class KeySet {
 public:
  // Parses `text`; `where` names its source in errors ("--api-keys FILE",
  // "ZEROSTEP_API_KEYS") and `unit` its parts ("line", "entry").
  // UsageError listing every problem, each with its line and field.
  static KeySet parse(const std::string& text, const std::string& where,
                      const std::string& unit);

  // The caller `key` acts for, quotas filled from `defaults` where its
  // tenant sets none; nullopt for a key that is not in the set.
  std::optional<Caller> find(const std::string& key,
                             const Caller& defaults) const;

  size_t size() const { return keys_.size(); }
  // "alice (2 keys), bob (1 key)": for the log.
  std::string describe() const;

 private:
  struct Tenant {
    std::string name;
    int keys = 0;
    // Set: the text gave it (nullopt inside: "unlimited").
    std::optional<std::optional<int64_t>> max_models;
    std::optional<std::optional<uint64_t>> max_bytes;
  };
  struct Key {
    std::array<unsigned char, 32> digest;
    size_t tenant;  // index into tenants_
  };
  std::vector<Tenant> tenants_;
  std::vector<Key> keys_;
};

// SHA-256 of `text` (OpenSSL).
std::array<unsigned char, 32> sha256(const std::string& text);

class ApiKeys {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    // The keys file; empty: `text` holds the keys (ZEROSTEP_API_KEYS) and
    // is never reloaded.
    std::string file;
    std::string text;
    // The file is read again at most this often (seconds; 0: before every
    // authentication) and parsed when its bytes changed. Default 2 s.
    double reload_s = 2.0;
    // Quotas of tenants whose lines set none (the server's flags).
    Caller defaults;
    // Where reload lines and problems go (default: nowhere). Never given
    // a key.
    std::function<void(const std::string&)> log;
  };

  // Reads and parses the keys: UsageError if the file cannot be read, is
  // larger than 1 MiB, has a problem, or holds no key. Logs the tenants and
  // their key counts, and a warning when other users can read the file.
  explicit ApiKeys(Options options);

  // The caller for a presented key, or nullopt (a missing, unknown or
  // revoked key). First reads the file again if reload_s has passed since
  // the last read: a changed file that parses replaces the keys (logged
  // with the tenants and key counts; an empty one revokes every key); one
  // that does not parse, or cannot be read, leaves them as they were and
  // is logged once per change.
  std::optional<Caller> authenticate(const std::string& key);

  // Keys in the current set.
  size_t size() const;

 private:
  void maybe_reload();  // requires mu_

  Options options_;
  mutable std::mutex mu_;
  std::shared_ptr<const KeySet> keys_;  // GUARDED_BY(mu_)
  std::string last_text_;               // GUARDED_BY(mu_): last read
  std::string last_problem_;            // GUARDED_BY(mu_): last logged
  Clock::time_point next_read_;         // GUARDED_BY(mu_)
};

// The keys file's text, or UsageError naming it (missing, unreadable,
// larger than 1 MiB).
std::string read_keys_file(const std::string& path);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_API_KEYS_H_
