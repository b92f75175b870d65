#include "tools/tinker/api_keys.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

const std::string kAlice1 = "tml-alice-0000000000000000000001";
const std::string kAlice2 = "tml-alice-0000000000000000000002";
const std::string kBob = "tml-bob-000000000000000000000001";
const std::string kLone = "tml-lone-00000000000000000000001";

std::string error_of(const std::string& text) {
  try {
    KeySet::parse(text, "--api-keys k.txt", "line");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Sha256Test, MatchesTheStandardVector) {
  const auto d = sha256("abc");
  char hex[65];
  for (int i = 0; i < 32; ++i) std::snprintf(hex + 2 * i, 3, "%02x", d[i]);
  EXPECT_EQ(std::string(hex),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(KeySetTest, EachKeyActsForItsTenantWithItsQuotas) {
  const KeySet set = KeySet::parse(
      "# keys of the team\n"
      "\n" +
          kAlice1 + "  alice\n" + kAlice2 + "  alice  max_models=4  # new\n" +
          kBob + "  bob max_bytes=20G max_models=unlimited\n" + kLone + "\n",
      "--api-keys k.txt", "line");
  EXPECT_EQ(set.size(), 4u);
  Caller defaults;
  defaults.max_models = 2;
  defaults.max_bytes = 1000;
  const auto a1 = set.find(kAlice1, defaults), a2 = set.find(kAlice2, defaults);
  ASSERT_TRUE(a1 && a2);
  EXPECT_EQ(a1->tenant, "alice");
  EXPECT_EQ(a2->tenant, "alice");
  // A tenant's setting holds for every key of it.
  EXPECT_EQ(a1->max_models, 4);
  EXPECT_EQ(a1->max_bytes, 1000u);
  const auto b = set.find(kBob, defaults);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->tenant, "bob");
  EXPECT_EQ(b->max_models, std::nullopt);  // unlimited overrides the default
  EXPECT_EQ(b->max_bytes, 20ULL << 30);
  // A key without a tenant is one of its own, named by its digest.
  const auto lone = set.find(kLone, defaults);
  ASSERT_TRUE(lone);
  const auto d = sha256(kLone);
  char hex[13];
  for (int i = 0; i < 6; ++i) std::snprintf(hex + 2 * i, 3, "%02x", d[i]);
  EXPECT_EQ(lone->tenant, "key-" + std::string(hex));
  EXPECT_EQ(lone->max_models, 2);
  EXPECT_EQ(set.describe(), "alice (2 keys), bob (1 key), " + lone->tenant +
                                " (1 key)");
}

TEST(KeySetTest, AnyOtherKeyIsRefused) {
  const KeySet set =
      KeySet::parse(kAlice1 + " alice\n", "--api-keys k.txt", "line");
  for (const std::string& k :
       {std::string(""), kAlice2, kAlice1 + "x", kAlice1.substr(1),
        kAlice1.substr(0, kAlice1.size() - 1), std::string("tml-"),
        std::string(600, 'a')})
    EXPECT_FALSE(set.find(k, Caller())) << k;
}

TEST(KeySetTest, EveryProblemIsReportedAtOnceAndNoKeyIsShown) {
  const std::string secret = "abc-secret-0000000000000000001";
  const std::string err = error_of(
      secret + " alice\n" +                      // no tml- prefix
      "tml-short\n" +                            // too short
      kAlice1 + " " + kBob + "\n" +              // a key in the tenant's place
      kAlice2 + " alice max_models=-1 max_bytes=1X speed=3 extra\n" +
      kBob + " bob max_models=2\n" +             //
      kLone + " bob max_models=3\n" +            // conflicting quota
      kBob + " other\n");                        // duplicate key
  EXPECT_EQ(err.rfind("--api-keys k.txt: 9 problems (no key is shown):", 0),
            0u)
      << err;
  for (const char* needle :
       {"line 1: the key (field 1) does not start with 'tml-'",
        "line 2: the key (field 1) is shorter than 24 characters",
        "line 3: the tenant (field 2): a tenant name does not start with "
        "'tml-'",
        "line 4: max_models=-1: must be an integer >= 0 or 'unlimited'",
        "line 4: max_bytes=1X: must be a byte count",
        "line 4: field 5 is not a setting this server knows",
        "line 4: field 6 is neither the tenant",
        "line 6: max_models of tenant 'bob' differs from an earlier line's",
        "line 7: the key (field 1) is on an earlier line too"})
    EXPECT_NE(err.find(needle), std::string::npos) << needle << "\n" << err;
  for (const std::string& key : {secret, kAlice1, kAlice2, kBob, kLone,
                                 std::string("tml-short")})
    EXPECT_EQ(err.find(key), std::string::npos) << key;
}

TEST(KeySetTest, BadTenantNamesAreRefused) {
  for (const char* name : {"-x", ".x", "a/b", "a:b", "key-x", "tml-x",
                           "\xc3\xa9t\xc3\xa9"}) {
    const std::string err = error_of(kAlice1 + " " + name + "\n");
    EXPECT_NE(err.find("line 1: the tenant (field 2): a tenant name"),
              std::string::npos)
        << name << ": " << err;
  }
  EXPECT_NE(error_of(kAlice1 + " " + std::string(65, 'a')).find("1 to 64"),
            std::string::npos);
  EXPECT_EQ(error_of(kAlice1 + " " + std::string(64, 'a')), "");
}

class ApiKeysFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/api_keys_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void write(const std::string& text, mode_t mode = 0600) {
    // Written whole under another name and renamed, as an editor does.
    std::ofstream(path_ + ".tmp") << text;
    chmod((path_ + ".tmp").c_str(), mode);
    ASSERT_EQ(std::rename((path_ + ".tmp").c_str(), path_.c_str()), 0);
  }
  ApiKeys::Options options() {
    ApiKeys::Options o;
    o.file = path_;
    o.reload_s = 0;  // read before every authentication
    o.log = [this](const std::string& line) { log_.push_back(line); };
    return o;
  }
  std::string log_text() const {
    std::string s;
    for (const auto& l : log_) s += l + "\n";
    return s;
  }

  std::string path_;
  std::vector<std::string> log_;
};

TEST_F(ApiKeysFileTest, ARotatedKeyTakesEffectAtTheNextRead) {
  write(kAlice1 + " alice\n");
  ApiKeys keys(options());
  ASSERT_TRUE(keys.authenticate(kAlice1));
  EXPECT_FALSE(keys.authenticate(kAlice2));
  // Rotation: the new key beside the old, then the old removed.
  write(kAlice1 + " alice\n" + kAlice2 + " alice\n");
  EXPECT_EQ(keys.authenticate(kAlice2)->tenant, "alice");
  EXPECT_EQ(keys.authenticate(kAlice1)->tenant, "alice");
  write(kAlice2 + " alice\n");
  EXPECT_FALSE(keys.authenticate(kAlice1));
  EXPECT_EQ(keys.authenticate(kAlice2)->tenant, "alice");
  // An empty file revokes every key.
  write("# nobody\n");
  EXPECT_FALSE(keys.authenticate(kAlice2));
  EXPECT_EQ(keys.size(), 0u);
  const std::string log = log_text();
  EXPECT_NE(log.find("changed: alice (2 keys)"), std::string::npos) << log;
  EXPECT_NE(log.find("changed: no keys: every request is refused"),
            std::string::npos)
      << log;
}

TEST_F(ApiKeysFileTest, ABrokenChangeKeepsTheKeysAndIsLoggedOnce) {
  write(kAlice1 + " alice\n");
  ApiKeys keys(options());
  write(kAlice1 + " alice\n" + kBob + " bob max_models=x\n");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(keys.authenticate(kAlice1)->tenant,
                                        "alice");
  EXPECT_FALSE(keys.authenticate(kBob));
  std::remove(path_.c_str());
  EXPECT_TRUE(keys.authenticate(kAlice1));  // a deleted file revokes nothing
  const std::string log = log_text();
  size_t n = 0;
  for (size_t at = log.find("max_models=x"); at != std::string::npos;
       at = log.find("max_models=x", at + 1))
    ++n;
  EXPECT_EQ(n, 1u) << log;
  EXPECT_NE(log.find("keeping the 1 keys read before"), std::string::npos)
      << log;
  EXPECT_NE(log.find("cannot read"), std::string::npos) << log;
  for (const std::string& key : {kAlice1, kBob})
    EXPECT_EQ(log.find(key), std::string::npos) << log;
}

TEST_F(ApiKeysFileTest, AFileOthersCanReadIsLogged) {
  write(kAlice1 + " alice\n", 0644);
  ApiKeys keys(options());
  EXPECT_NE(log_text().find("can be read by other users (mode 0644). Fix: "
                            "chmod 600"),
            std::string::npos)
      << log_text();
}

TEST_F(ApiKeysFileTest, AStartWithoutUsableKeysIsRefused) {
  auto start_error = [&] {
    try {
      ApiKeys keys(options());
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(start_error().find("cannot read"), std::string::npos);
  write("# nothing yet\n");
  EXPECT_NE(start_error().find("holds no key"), std::string::npos);
  write("tml-bad\n");
  EXPECT_NE(start_error().find("line 1: the key (field 1) is shorter"),
            std::string::npos);
}

TEST(ApiKeysEnvTest, EntriesAreSeparatedByCommasOrLines) {
  ApiKeys::Options o;
  o.text = kAlice1 + " alice," + kBob + " bob\n" + kLone;
  ApiKeys keys(o);
  EXPECT_EQ(keys.size(), 3u);
  EXPECT_EQ(keys.authenticate(kBob)->tenant, "bob");
  try {
    ApiKeys::Options bad;
    bad.text = kAlice1 + ",tml-x";
    ApiKeys k(bad);
    ADD_FAILURE() << "a short key was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "ZEROSTEP_API_KEYS: 1 problem (no key is shown):\n  entry "
                  "2: the key (field 1) is shorter"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
