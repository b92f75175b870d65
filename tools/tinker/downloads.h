// Download URLs for external weights: what get_external_weights_urls
// returns and what the server serves back. Torch-free.
//
// Note [Signed downloads]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The SDK (0.38.0) asks GET training_runs/<run>/checkpoints/
// external_weights/<name>/external_weights_urls for "signed download URLs,
// one per file" with their expiry, and its CLI (tinker checkpoint
// download) fetches each with a plain GET and no API key. So a URL must
// carry its own authority: it names the tenant, the run, the checkpoint
// and the file, an expiry time, and an HMAC-SHA256 of all of them under a
// secret the server draws at start (so URLs die with the process):
//   <base>/api/v1/downloads/<tenant>/<run>/external_weights/<name>/<file>
//       ?expires=<unix seconds>&signature=<64 hex digits>
// (path parts %-escaped). The HTTP front passes such a GET without a key
// (http.h); the Service checks the signature in constant time and the
// expiry before it touches the disk, and then resolves the file through
// locate_checkpoint() for the URL's tenant (Note [One tenant check] in
// tenancy.h), so a URL reaches exactly the file it was signed for, and a
// forged, altered or expired one gets 403 without learning whether the
// file exists.
//
// Thread safety: DownloadSigner is immutable after construction.
#ifndef ZEROSTEP_TOOLS_TINKER_DOWNLOADS_H_
#define ZEROSTEP_TOOLS_TINKER_DOWNLOADS_H_

#include <cstdint>
#include <optional>
#include <string>

namespace zerostep {
namespace tinker {

// The path prefix (after /api/v1/) of download URLs.
inline constexpr char kDownloadsPrefix[] = "downloads/";

// How long a signed URL is valid (the SDK's CLI re-signs when fewer than
// 5 minutes are left).
inline constexpr int64_t kDownloadUrlTtlS = 3600;

// What a download URL names.
struct DownloadTarget {
  std::string tenant;
  std::string run;   // the model (training run) id
  std::string name;  // the external weights' name
  std::string file;  // a file name in the checkpoint's folder
  int64_t expires_unix = 0;
};

class DownloadSigner {
 public:
  // A signer with a fresh random secret (OpenSSL RAND_bytes).
  DownloadSigner();
  // A signer with a given secret (tests).
  explicit DownloadSigner(std::string secret);

  // The URL of `t` under `base` ("http://host:port", no trailing '/').
  std::string url(const std::string& base, const DownloadTarget& t) const;

  // The target a request's path after /api/v1/ (`ep`, %-escapes decoded)
  // and its raw query names, if its signature is this signer's and it has
  // not expired at `now_unix`; nullopt otherwise (malformed, forged,
  // altered or expired alike).
  std::optional<DownloadTarget> verify(const std::string& ep,
                                       const std::string& query,
                                       int64_t now_unix) const;

 private:
  std::string signature(const DownloadTarget& t) const;  // 64 hex digits
  std::string secret_;
};

// %-escapes every byte of `s` but [A-Za-z0-9._-] (a URL path segment).
std::string url_escape(const std::string& s);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_DOWNLOADS_H_
