#include "tools/tinker/downloads.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cctype>
#include <vector>

#include "common/errors.h"
#include "tools/tinker/checkpoint_paths.h"
#include "tools/tinker/tenancy.h"

namespace zerostep {
namespace tinker {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next - at));
    if (next == std::string::npos) return out;
    at = next + 1;
  }
}

}  // namespace

std::string url_escape(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

DownloadSigner::DownloadSigner() : secret_(32, '\0') {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret_.data()),
                 static_cast<int>(secret_.size())) != 1)
    throw InternalError("OpenSSL RAND_bytes failed to draw the download "
                        "signing secret");
}

DownloadSigner::DownloadSigner(std::string secret)
    : secret_(std::move(secret)) {}

std::string DownloadSigner::signature(const DownloadTarget& t) const {
  // Length-prefixed fields: no two targets share a message.
  std::string msg;
  for (const std::string& f :
       {t.tenant, t.run, t.name, t.file, std::to_string(t.expires_unix)})
    msg += std::to_string(f.size()) + ":" + f + ";";
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac,
           &n) == nullptr ||
      n != 32)
    throw InternalError("HMAC-SHA256 (OpenSSL) failed");
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) {
    hex.push_back(kHex[mac[i] >> 4]);
    hex.push_back(kHex[mac[i] & 15]);
  }
  return hex;
}

std::string DownloadSigner::url(const std::string& base,
                                const DownloadTarget& t) const {
  return base + "/api/v1/" + kDownloadsPrefix + url_escape(t.tenant) + "/" +
         url_escape(t.run) + "/external_weights/" + url_escape(t.name) + "/" +
         url_escape(t.file) + "?expires=" + std::to_string(t.expires_unix) +
         "&signature=" + signature(t);
}

std::optional<DownloadTarget> DownloadSigner::verify(const std::string& ep,
                                                     const std::string& query,
                                                     int64_t now_unix) const {
  const std::string prefix = kDownloadsPrefix;
  if (ep.rfind(prefix, 0) != 0) return std::nullopt;
  const std::vector<std::string> parts = split(ep.substr(prefix.size()), '/');
  if (parts.size() != 5 || parts[2] != "external_weights") return std::nullopt;
  DownloadTarget t;
  t.tenant = parts[0];
  t.run = parts[1];
  t.name = parts[3];
  t.file = parts[4];
  if (!tenant_name_problem(t.tenant).empty() || !safe_checkpoint_name(t.name) ||
      !safe_checkpoint_name(t.file) || t.run.empty())
    return std::nullopt;
  std::string expires, sig;
  for (const std::string& kv : split(query, '&')) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    if (kv.compare(0, eq, "expires") == 0) expires = kv.substr(eq + 1);
    if (kv.compare(0, eq, "signature") == 0) sig = kv.substr(eq + 1);
  }
  if (expires.empty() || expires.size() > 18 ||
      expires.find_first_not_of("0123456789") != std::string::npos ||
      sig.size() != 64)
    return std::nullopt;
  t.expires_unix = std::stoll(expires);
  const std::string want = signature(t);
  if (CRYPTO_memcmp(want.data(), sig.data(), 64) != 0) return std::nullopt;
  if (t.expires_unix <= now_unix) return std::nullopt;
  return t;
}

}  // namespace tinker
}  // namespace zerostep
