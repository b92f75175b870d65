#include "tools/tinker/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/cli.h"
#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

constexpr size_t kMinKeyChars = 24;  // "tml-" and 20 more
constexpr size_t kMaxKeyChars = 512;
constexpr uint64_t kMaxFileBytes = 1 << 20;

// Fields separated by blanks, after '#' removed.
std::vector<std::string> fields_of(const std::string& line) {
  std::istringstream in(line.substr(0, line.find('#')));
  std::vector<std::string> out;
  for (std::string f; in >> f;) out.push_back(f);
  return out;
}

// Empty if `key` may be a key; else the rule it breaks (never quoting it).
std::string key_problem(const std::string& key) {
  if (key.rfind("tml-", 0) != 0)
    return "does not start with 'tml-' (the SDK sends no other key)";
  if (key.size() < kMinKeyChars)
    return "is shorter than " + std::to_string(kMinKeyChars) +
           " characters. Fix: make one with: echo tml-$(openssl rand -hex "
           "24)";
  if (key.size() > kMaxKeyChars)
    return "is longer than " + std::to_string(kMaxKeyChars) + " characters";
  for (char c : key)
    if (c <= ' ' || c > '~' || c == ',')
      return "holds a character other than printable ASCII (no spaces, "
             "'#' or ',')";
  return "";
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

}  // namespace

std::array<unsigned char, 32> sha256(const std::string& text) {
  std::array<unsigned char, 32> out{};
  unsigned int n = 0;
  if (EVP_Digest(text.data(), text.size(), out.data(), &n, EVP_sha256(),
                 nullptr) != 1 ||
      n != out.size())
    throw InternalError("SHA-256 (OpenSSL EVP_Digest) failed");
  return out;
}

KeySet KeySet::parse(const std::string& text, const std::string& where,
                     const std::string& unit) {
  KeySet set;
  std::vector<std::string> problems;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::vector<std::string> f = fields_of(line);
    if (f.empty()) continue;
    const std::string at = unit + " " + std::to_string(number) + ": ";
    const size_t before = problems.size();
    const std::string kp = key_problem(f[0]);
    if (!kp.empty()) problems.push_back(at + "the key (field 1) " + kp);
    std::string tenant;
    std::optional<std::optional<int64_t>> max_models;
    std::optional<std::optional<uint64_t>> max_bytes;
    for (size_t i = 1; i < f.size(); ++i) {
      const std::string field = "field " + std::to_string(i + 1);
      const size_t eq = f[i].find('=');
      if (eq == std::string::npos) {
        if (i != 1) {
          problems.push_back(at + field +
                             " is neither the tenant (field 2) nor a "
                             "setting (max_models=N, max_bytes=N)");
          continue;
        }
        const std::string tp = tenant_name_problem(f[i]);
        if (!tp.empty())
          problems.push_back(at + "the tenant (field 2): " + tp);
        else
          tenant = f[i];
        continue;
      }
      const std::string name = f[i].substr(0, eq), value = f[i].substr(eq + 1);
      if (name == "max_models") {
        int64_t n = 0;
        if (value == "unlimited")
          max_models = std::optional<int64_t>();
        else if (read_int(value, &n) == NumberText::kOk && n >= 0)
          max_models = std::optional<int64_t>(n);
        else
          problems.push_back(at + "max_models=" + elide(value, 32) +
                             ": must be an integer >= 0 or 'unlimited'");
      } else if (name == "max_bytes") {
        uint64_t n = 0;
        if (value == "unlimited")
          max_bytes = std::optional<uint64_t>();
        else if (read_bytes(value, &n) == NumberText::kOk)
          max_bytes = std::optional<uint64_t>(n);
        else
          problems.push_back(at + "max_bytes=" + elide(value, 32) +
                             ": must be a byte count (digits, optionally "
                             "with K, M, G or T) or 'unlimited'");
      } else {
        problems.push_back(at + field +
                           " is not a setting this server knows (max_models, "
                           "max_bytes)");
      }
    }
    if (problems.size() != before) continue;
    const std::array<unsigned char, 32> digest = sha256(f[0]);
    bool duplicate = false;
    for (const Key& k : set.keys_)
      duplicate |= CRYPTO_memcmp(k.digest.data(), digest.data(), 32) == 0;
    if (duplicate) {
      problems.push_back(at + "the key (field 1) is on an earlier " + unit +
                         " too");
      continue;
    }
    if (tenant.empty()) tenant = "key-" + hex(digest.data(), 6);
    size_t t = 0;
    while (t < set.tenants_.size() && set.tenants_[t].name != tenant) ++t;
    if (t == set.tenants_.size()) set.tenants_.push_back({tenant});
    Tenant& to = set.tenants_[t];
    // A setting a tenant's lines give must be the same on each of them.
    auto settle = [&](const char* name, auto& mine, const auto& given) {
      if (!given) return;
      if (mine && *mine != *given)
        problems.push_back(at + name + " of tenant '" + tenant +
                           "' differs from an earlier " + unit +
                           "'s. Fix: give it once, or the same on every " +
                           unit);
      mine = given;
    };
    settle("max_models", to.max_models, max_models);
    settle("max_bytes", to.max_bytes, max_bytes);
    ++to.keys;
    set.keys_.push_back({digest, t});
  }
  if (!problems.empty()) {
    std::string m = where + ": " + std::to_string(problems.size()) +
                    (problems.size() == 1 ? " problem" : " problems") +
                    " (no key is shown):";
    for (const std::string& p : problems) m += "\n  " + p;
    throw UsageError(m);
  }
  return set;
}

std::optional<Caller> KeySet::find(const std::string& key,
                                   const Caller& defaults) const {
  if (key.empty() || key.size() > kMaxKeyChars) return std::nullopt;
  const std::array<unsigned char, 32> digest = sha256(key);
  // Every digest is compared, whatever matched (see the header).
  size_t found = keys_.size();
  for (size_t i = 0; i < keys_.size(); ++i) {
    const size_t equal =
        static_cast<size_t>(CRYPTO_memcmp(keys_[i].digest.data(),
                                          digest.data(), digest.size()) == 0);
    found = equal * i + (1 - equal) * found;
  }
  if (found == keys_.size()) return std::nullopt;
  const Tenant& t = tenants_[keys_[found].tenant];
  Caller c = defaults;
  c.tenant = t.name;
  if (t.max_models) c.max_models = *t.max_models;
  if (t.max_bytes) c.max_bytes = *t.max_bytes;
  return c;
}

std::string KeySet::describe() const {
  std::string out;
  for (const Tenant& t : tenants_)
    out += (out.empty() ? "" : ", ") + t.name + " (" + std::to_string(t.keys) +
           (t.keys == 1 ? " key)" : " keys)");
  return out.empty() ? "no keys: every request is refused" : out;
}

std::string read_keys_file(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw UsageError("--api-keys: cannot read '" + path +
                     "': " + std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) > kMaxFileBytes)
    throw UsageError("--api-keys: '" + path + "' is larger than 1 MiB");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof())
    throw UsageError("--api-keys: cannot read '" + path + "'");
  return text.str();
}

ApiKeys::ApiKeys(Options options) : options_(std::move(options)) {
  const std::string where = options_.file.empty()
                                ? std::string("ZEROSTEP_API_KEYS")
                                : "--api-keys " + options_.file;
  std::string text = options_.text;
  if (!options_.file.empty()) {
    text = read_keys_file(options_.file);
    struct stat st {};
    if (options_.log && stat(options_.file.c_str(), &st) == 0 &&
        (st.st_mode & 077) != 0) {
      char mode[8];
      std::snprintf(mode, sizeof(mode), "%04o",
                    static_cast<unsigned>(st.st_mode & 07777));
      options_.log("--api-keys " + options_.file +
                   " can be read by other users (mode " + mode +
                   "). Fix: chmod 600 " + options_.file);
    }
  } else {
    for (char& c : text)
      if (c == ',') c = '\n';
  }
  auto keys = std::make_shared<const KeySet>(KeySet::parse(
      text, where, options_.file.empty() ? "entry" : "line"));
  if (keys->size() == 0)
    throw UsageError(where +
                     " holds no key. Fix: one key per line, e.g. "
                     "tml-<at least 20 characters> <tenant>");
  if (options_.log) options_.log(where + ": " + keys->describe());
  keys_ = std::move(keys);
  last_text_ = std::move(text);
  next_read_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(
                                      options_.reload_s));
}

size_t ApiKeys::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keys_->size();
}

void ApiKeys::maybe_reload() {
  if (options_.file.empty()) return;
  const Clock::time_point now = Clock::now();
  if (now < next_read_) return;
  next_read_ = now + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.reload_s));
  const std::string where = "--api-keys " + options_.file;
  std::string text;
  try {
    text = read_keys_file(options_.file);
  } catch (const UsageError& e) {
    if (options_.log && last_problem_ != e.what())
      options_.log(std::string(e.what()) + "; keeping the " +
                   std::to_string(keys_->size()) + " keys read before");
    last_problem_ = e.what();
    return;
  }
  if (text == last_text_) return;
  try {
    auto keys =
        std::make_shared<const KeySet>(KeySet::parse(text, where, "line"));
    keys_ = std::move(keys);
    last_text_ = std::move(text);
    last_problem_.clear();
    if (options_.log) options_.log(where + " changed: " + keys_->describe());
  } catch (const UsageError& e) {
    if (options_.log && last_problem_ != e.what())
      options_.log(std::string(e.what()) + "\n  keeping the " +
                   std::to_string(keys_->size()) + " keys read before");
    last_problem_ = e.what();
  }
}

std::optional<Caller> ApiKeys::authenticate(const std::string& key) {
  std::shared_ptr<const KeySet> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    maybe_reload();
    keys = keys_;
  }
  return keys->find(key, options_.defaults);
}

}  // namespace tinker
}  // namespace zerostep
