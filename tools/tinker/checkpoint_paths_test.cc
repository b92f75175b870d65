#include "tools/tinker/checkpoint_paths.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace zerostep {
namespace tinker {
namespace {

namespace fs = std::filesystem;

TEST(ParseTinkerPath, AcceptsACheckpointOfAModel) {
  std::string id, name;
  ASSERT_TRUE(parse_tinker_path("tinker://session-ab12-1:train:0/weights/w1",
                                &id, &name));
  EXPECT_EQ(id, "session-ab12-1:train:0");
  EXPECT_EQ(name, "w1");
}

// Issue 15: tinker://../weights/x named <state_dir>/../x.
TEST(ParseTinkerPath, RejectsPathsLeavingTheStateDir) {
  for (const char* bad :
       {"tinker://../weights/x", "tinker://./weights/x",
        "tinker://.../weights/x", "tinker:///weights/x",
        "tinker:///etc/weights/x", "tinker://m/weights/..",
        "tinker://m/weights/../x", "tinker://m/weights/x/y",
        "tinker://m/other/x", "/abs/m/weights/x", "m/weights/x"}) {
    std::string id = "unset", name = "unset";
    EXPECT_FALSE(parse_tinker_path(bad, &id, &name)) << bad;
    EXPECT_EQ(id, "unset");
  }
}

TEST(ParseSamplerPath, AcceptsSamplerWeightsOnly) {
  std::string id, name;
  ASSERT_TRUE(parse_sampler_path(
      "tinker://session-ab12-1:train:0/sampler_weights/s1", &id, &name));
  EXPECT_EQ(id, "session-ab12-1:train:0");
  EXPECT_EQ(name, "s1");
  for (const char* bad :
       {"tinker://m/weights/s1", "tinker://../sampler_weights/x",
        "tinker://m/sampler_weights/..", "tinker://m/sampler_weights/a/b"}) {
    std::string i = "unset", n = "unset";
    EXPECT_FALSE(parse_sampler_path(bad, &i, &n)) << bad;
    EXPECT_EQ(i, "unset");
  }
  EXPECT_FALSE(parse_tinker_path("tinker://m/sampler_weights/s1", &id, &name));
}

TEST(ModelFolder, NeverASeparator) {
  EXPECT_EQ(model_folder("s-1:train:0"), "s-1_train_0");
  EXPECT_EQ(model_folder("a\\b/c"), "a_b_c");
}

class WithinDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/checkpoint_paths_test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    fs::create_directories(base_ + "/state/model");
    fs::create_directories(base_ + "/outside/ckpt");
  }
  void TearDown() override { fs::remove_all(base_); }
  std::string base_;
};

TEST_F(WithinDir, InsideAndNotYetExisting) {
  EXPECT_TRUE(within_dir(base_ + "/state", base_ + "/state/model/w1"));
  EXPECT_TRUE(within_dir(base_ + "/state/", base_ + "/state/new/w1"));
}

TEST_F(WithinDir, DotDotAndPrefixSiblingsAreOutside) {
  EXPECT_FALSE(within_dir(base_ + "/state", base_ + "/state/../outside/ckpt"));
  EXPECT_FALSE(within_dir(base_ + "/state", base_ + "/state2/x"));
}

TEST_F(WithinDir, SymlinkOutIsOutside) {
  fs::create_directory_symlink(base_ + "/outside", base_ + "/state/model/link");
  EXPECT_FALSE(within_dir(base_ + "/state", base_ + "/state/model/link/ckpt"));
}

TEST(ScrubPath, ReplacesEveryOccurrence) {
  EXPECT_EQ(scrub_path("cannot open '/s/m/w/rank_0.bin' (/s/m/w)", "/s/m/w",
                       "tinker://m/weights/w"),
            "cannot open 'tinker://m/weights/w/rank_0.bin' "
            "(tinker://m/weights/w)");
}

TEST(DefaultStateDir, StableAndUnderXdgStateHome) {
  const char* old = getenv("XDG_STATE_HOME");
  const std::string saved = old ? old : "";
  const char* old_home = getenv("HOME");
  const std::string saved_home = old_home ? old_home : "";
  setenv("XDG_STATE_HOME", "/var/lib/u", 1);
  EXPECT_EQ(default_state_dir(), "/var/lib/u/zerostep/trainer_server");
  EXPECT_EQ(default_state_dir(), default_state_dir());  // no pid, no clock
  unsetenv("XDG_STATE_HOME");
  setenv("HOME", "/home/u", 1);
  EXPECT_EQ(default_state_dir(),
            "/home/u/.local/state/zerostep/trainer_server");
  if (old) setenv("XDG_STATE_HOME", saved.c_str(), 1);
  if (old_home) setenv("HOME", saved_home.c_str(), 1);
}

}  // namespace
}  // namespace tinker
}  // namespace zerostep
