#include "tools/tinker/tenancy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace zerostep {
namespace tinker {
namespace {

namespace fs = std::filesystem;

TEST(TenantNameTest, LettersDigitsAndPunctuationUpTo64) {
  for (const char* ok : {"alice", "team-7", "a.b_c", "0", "default"})
    EXPECT_EQ(tenant_name_problem(ok), "") << ok;
  for (const char* bad :
       {"", "-a", ".a", "_a", "a/b", "a b", "a:b", "..", "tml-abc", "key-1"})
    EXPECT_NE(tenant_name_problem(bad), "") << bad;
  EXPECT_EQ(tenant_name_problem(std::string(64, 'x')), "");
  EXPECT_NE(tenant_name_problem(std::string(65, 'x')), "");
}

TEST(LocateCheckpointTest, EveryTenantsPathLiesInTheCallersFolder) {
  const std::string path = "tinker://session-ab-1:train:0/weights/step-5";
  const auto alice = locate_checkpoint("/s", "alice", path, "weights");
  const auto bob = locate_checkpoint("/s", "bob", path, "weights");
  ASSERT_TRUE(alice && bob);
  EXPECT_EQ(alice->model_id, "session-ab-1:train:0");
  EXPECT_EQ(alice->name, "step-5");
  EXPECT_EQ(alice->run, "/s/tenants/alice/session-ab-1_train_0");
  EXPECT_EQ(alice->dir, "/s/tenants/alice/session-ab-1_train_0/step-5");
  // The same path, read by another tenant: a folder of that tenant's.
  EXPECT_EQ(bob->dir, "/s/tenants/bob/session-ab-1_train_0/step-5");
  const auto sampler = locate_checkpoint(
      "/s", "alice", "tinker://m-1/sampler_weights/s1", "sampler_weights");
  ASSERT_TRUE(sampler);
  EXPECT_EQ(sampler->dir, "/s/tenants/alice/m-1/sampler_weights/s1");
  EXPECT_EQ(run_dir("/s", "alice", "m:1"), "/s/tenants/alice/m_1");
  // A path of another kind, or one that would leave the folder: none.
  for (const char* bad :
       {"tinker://m-1/sampler_weights/s1", "tinker://../weights/x",
        "tinker://m/weights/../x", "tinker://m/weights/latest",
        "file:///etc/passwd"})
    EXPECT_FALSE(locate_checkpoint("/s", "alice", bad, "weights")) << bad;
}

TEST(OverBytesQuotaTest, RefusesWhatCouldGoOverAndSaysByHowMuch) {
  Caller c;
  c.tenant = "carol";
  EXPECT_EQ(over_bytes_quota(c, "save", 1 << 30, 1 << 30), "");  // no limit
  c.max_bytes = 100;
  EXPECT_EQ(over_bytes_quota(c, "save", 60, 40), "");
  EXPECT_EQ(over_bytes_quota(c, "save_weights 'x'", 60, 41)
                .rfind("save_weights 'x': tenant 'carol' holds 60 bytes in "
                       "the state directory and this needs up to 41 bytes "
                       "more, over its quota of 100 bytes (max_bytes",
                       0),
            0u);
  c.max_bytes = 3ULL << 30;
  EXPECT_NE(over_bytes_quota(c, "s", 3ULL << 30, 1).find(
                "holds 3221225472 bytes (3072.0 MiB)"),
            std::string::npos);
}

TEST(TreeBytesTest, SumsRegularFilesBelowAFolder) {
  const std::string root = ::testing::TempDir() + "/tree_bytes_test";
  fs::remove_all(root);
  fs::create_directories(root + "/a/b");
  std::ofstream(root + "/a/x") << std::string(100, 'x');
  std::ofstream(root + "/a/b/y") << std::string(23, 'y');
  // A link is not followed (it could point anywhere on the machine).
  std::ofstream(::testing::TempDir() + "/tree_bytes_outside")
      << std::string(5000, 'z');
  fs::create_symlink(::testing::TempDir() + "/tree_bytes_outside",
                     root + "/a/link");
  EXPECT_EQ(tree_bytes(root), 123u);
  EXPECT_EQ(tree_bytes(root + "/a/b"), 23u);
  EXPECT_EQ(tree_bytes(root + "/missing"), 0u);
}

TEST(PreTenantRunFoldersTest, FindsRunFoldersAtTheTop) {
  const std::string root = ::testing::TempDir() + "/pre_tenant_test";
  fs::remove_all(root);
  for (const char* d : {"session-ab-1_train_0", "model-ab-3", "tenants",
                        "other"})
    fs::create_directories(root + "/" + d);
  std::ofstream(root + "/session-file") << "x";
  EXPECT_EQ(pre_tenant_run_folders(root),
            (std::vector<std::string>{"model-ab-3", "session-ab-1_train_0"}));
  EXPECT_TRUE(pre_tenant_run_folders(root + "/missing").empty());
}

TEST(TenantIdsTest, AnotherTenantsIdReadsAsAMissingOne) {
  TenantIds ids;
  EXPECT_TRUE(ids.claim("s-1", "alice"));
  EXPECT_TRUE(ids.claim("s-2", "bob"));
  EXPECT_FALSE(ids.claim("s-1", "bob"));    // owned: nothing changes
  EXPECT_FALSE(ids.claim("s-1", "alice"));  // once
  EXPECT_TRUE(ids.owns("alice", "s-1"));
  EXPECT_FALSE(ids.owns("bob", "s-1"));
  EXPECT_FALSE(ids.owns("bob", "s-9"));
  EXPECT_TRUE(ids.taken("s-2"));
  EXPECT_FALSE(ids.taken("s-9"));
  EXPECT_EQ(ids.ids_of("alice"), std::vector<std::string>{"s-1"});
  EXPECT_TRUE(ids.ids_of("carol").empty());
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
