#include "tools/tinker/access.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

const std::string kKey = "tml-access-test-000000000000001";

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LoopbackTest, OnlyAddressesOfThisMachinesLoopback) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "localhost"})
    EXPECT_TRUE(is_loopback_host(h)) << h;
  for (const char* h : {"0.0.0.0", "::", "10.0.0.7", "192.168.1.20",
                        "::ffff:10.0.0.1", "fe80::1"})
    EXPECT_FALSE(is_loopback_host(h)) << h;
}

TEST(AccessFlagsTest, ReadsEachFlagAndLeavesOthers) {
  AccessFlags f;
  for (const char* a :
       {"--api-keys=/k", "--api-keys-reload-s=0.5", "--tenant-max-models=3",
        "--tenant-max-bytes=2G", "--max-connections=10",
        "--max-connections-per-client=3",
        "--max-body-bytes=1M", "--header-timeout-s=2", "--read-timeout-s=3",
        "--idle-timeout-s=4", "--allow-unauthenticated"})
    EXPECT_TRUE(parse_access_flag(a, &f)) << a;
  EXPECT_FALSE(parse_access_flag("--port=1", &f));
  EXPECT_EQ(f.api_keys_file, "/k");
  EXPECT_EQ(f.api_keys_reload_s, 0.5);
  EXPECT_EQ(f.quotas.max_models, 3);
  EXPECT_EQ(f.quotas.max_bytes, 2ULL << 30);
  EXPECT_EQ(f.limits.max_connections, 10);
  EXPECT_EQ(f.limits.max_connections_per_client, 3);
  EXPECT_EQ(f.limits.max_body_bytes, 1u << 20);
  EXPECT_EQ(f.limits.header_timeout_s, 2.0);
  EXPECT_EQ(f.limits.read_timeout_s, 3.0);
  EXPECT_EQ(f.limits.idle_timeout_s, 4.0);
  EXPECT_TRUE(f.allow_unauthenticated);
  EXPECT_EQ(error_of([&] { parse_access_flag("--max-connections=0", &f); }),
            "--max-connections=0: must be an integer from 1 to 1048576. Fix: "
            "write e.g. --max-connections=256");
  EXPECT_NE(error_of([&] { parse_access_flag("--max-body-bytes=1X", &f); })
                .find("--max-body-bytes=1X: not a byte count"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_access_flag("--api-keys=", &f); }), "");
}

class MakeAccessTest : public ::testing::Test {
 protected:
  std::string keys_file() {
    const std::string path = ::testing::TempDir() + "/access_test_keys";
    std::ofstream(path) << kKey << " alice max_models=2\n";
    chmod(path.c_str(), 0600);
    return path;
  }
  std::function<void(const std::string&)> logger() {
    return [this](const std::string& l) { log_.push_back(l); };
  }
  std::vector<std::string> log_;
};

TEST_F(MakeAccessTest, ABroadHostWithoutKeysIsRefusedNamingTheFlags) {
  AccessFlags f;
  for (const char* host : {"0.0.0.0", "::", "10.0.0.7"}) {
    const std::string err =
        error_of([&] { make_access(f, host, nullptr, logger()); });
    EXPECT_EQ(err.rfind("--host=" + std::string(host) +
                            " serves beyond this machine, and no API keys "
                            "are set",
                        0),
              0u)
        << err;
    EXPECT_NE(err.find("Fix: give --api-keys=FILE (or ZEROSTEP_API_KEYS), or "
                       "pass --allow-unauthenticated"),
              std::string::npos)
        << err;
  }
  // Loopback needs no keys; every request is tenant "default".
  Access local = make_access(f, "127.0.0.1", "", logger());
  EXPECT_FALSE(local.http.authenticate);
  EXPECT_EQ(local.http.anonymous.tenant, "default");
  EXPECT_TRUE(log_.empty());
}

TEST_F(MakeAccessTest, AllowUnauthenticatedIsLoggedAsAWarning) {
  AccessFlags f;
  f.allow_unauthenticated = true;
  f.quotas.max_models = 5;
  Access a = make_access(f, "0.0.0.0", nullptr, logger());
  EXPECT_FALSE(a.http.authenticate);
  EXPECT_EQ(a.http.anonymous.max_models, 5);
  ASSERT_EQ(log_.size(), 1u);
  EXPECT_EQ(log_[0].rfind("WARNING: serving --host=0.0.0.0 without API keys "
                          "(--allow-unauthenticated)",
                          0),
            0u)
      << log_[0];
}

TEST_F(MakeAccessTest, KeysFromTheFileOrTheEnvironmentNotBoth) {
  AccessFlags f;
  f.api_keys_file = keys_file();
  f.quotas.max_bytes = 100;
  Access a = make_access(f, "0.0.0.0", nullptr, logger());
  ASSERT_TRUE(a.http.authenticate);
  const auto alice = a.http.authenticate(kKey);
  ASSERT_TRUE(alice);
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_EQ(alice->max_models, 2);
  EXPECT_EQ(alice->max_bytes, 100u);
  EXPECT_FALSE(a.http.authenticate("tml-access-test-000000000000002"));
  EXPECT_EQ(a.summary, "keys (1 from --api-keys " + f.api_keys_file + ")");
  EXPECT_NE(error_of([&] { make_access(f, "::1", kKey.c_str(), logger()); })
                .find("--api-keys and ZEROSTEP_API_KEYS are both set"),
            std::string::npos);
  f.allow_unauthenticated = true;
  EXPECT_NE(error_of([&] { make_access(f, "::1", nullptr, logger()); })
                .find("--allow-unauthenticated with --api-keys"),
            std::string::npos);
  AccessFlags e;
  Access from_env =
      make_access(e, "0.0.0.0", (kKey + " bob").c_str(), logger());
  EXPECT_EQ(from_env.http.authenticate(kKey)->tenant, "bob");
  for (const std::string& line : log_)
    EXPECT_EQ(line.find(kKey), std::string::npos) << line;
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
