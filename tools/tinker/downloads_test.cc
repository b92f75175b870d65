#include "tools/tinker/downloads.h"

#include <gtest/gtest.h>

#include <string>

namespace zerostep {
namespace tinker {
namespace {

// The path after /api/v1/ and the query of a URL `url` of base "http://h".
std::pair<std::string, std::string> split_url(const std::string& url) {
  const std::string prefix = "http://h/api/v1/";
  const size_t q = url.find('?');
  return {url.substr(prefix.size(), q - prefix.size()), url.substr(q + 1)};
}

// The HTTP front decodes %-escapes in the path before the Service sees it.
std::string decoded(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

const DownloadTarget kTarget{"alice", "session-a-1:train:0", "final",
                             "adapter_model.safetensors", 2000};

TEST(DownloadSigner, ASignedUrlVerifiesUntilItExpires) {
  const DownloadSigner signer(std::string(32, 'k'));
  const std::string url = signer.url("http://h", kTarget);
  EXPECT_EQ(url.find("http://h/api/v1/downloads/alice/session-a-1%3Atrain%3A0/"
                     "external_weights/final/adapter_model.safetensors"
                     "?expires=2000&signature="),
            0u)
      << url;
  const auto [path, query] = split_url(url);
  const auto t = signer.verify(decoded(path), query, 1999);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->tenant, "alice");
  EXPECT_EQ(t->run, "session-a-1:train:0");
  EXPECT_EQ(t->name, "final");
  EXPECT_EQ(t->file, "adapter_model.safetensors");
  EXPECT_FALSE(signer.verify(decoded(path), query, 2000).has_value());
}

TEST(DownloadSigner, AnyChangeOrAnotherSecretFails) {
  const DownloadSigner signer(std::string(32, 'k'));
  const auto [path, query] = split_url(signer.url("http://h", kTarget));
  const std::string p = decoded(path);
  // Another tenant, file or expiry with the same signature.
  std::string other = p;
  other.replace(other.find("alice"), 5, "bobby");
  EXPECT_FALSE(signer.verify(other, query, 0).has_value());
  other = p;
  other.replace(other.find("adapter_model"), 13, "adapter_confi");
  EXPECT_FALSE(signer.verify(other, query, 0).has_value());
  std::string q = query;
  q.replace(q.find("2000"), 4, "9000");
  EXPECT_FALSE(signer.verify(p, q, 0).has_value());
  // The signature's last digit flipped; a server with another secret.
  q = query;
  q.back() = q.back() == '0' ? '1' : '0';
  EXPECT_FALSE(signer.verify(p, q, 0).has_value());
  EXPECT_FALSE(DownloadSigner(std::string(32, 'j')).verify(p, query, 0));
  // Malformed: no signature, a path that leaves its folder.
  EXPECT_FALSE(signer.verify(p, "expires=2000", 0).has_value());
  EXPECT_FALSE(signer.verify("downloads/alice/r/external_weights/../x", query, 0)
                   .has_value());
  // Two random secrets differ.
  EXPECT_NE(DownloadSigner().url("http://h", kTarget),
            DownloadSigner().url("http://h", kTarget));
}

TEST(UrlEscape, KeepsOnlyTheUnreservedBytes) {
  EXPECT_EQ(url_escape("a-b_c.9"), "a-b_c.9");
  EXPECT_EQ(url_escape("s:1/ x"), "s%3A1%2F%20x");
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
