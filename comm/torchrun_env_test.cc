#include "comm/torchrun_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/errors.h"

namespace zerostep {
namespace {

constexpr const char* kVars[] = {"RANK",
                                 "WORLD_SIZE",
                                 "MASTER_ADDR",
                                 "MASTER_PORT",
                                 "LOCAL_RANK",
                                 "LOCAL_WORLD_SIZE",
                                 "TORCHELASTIC_USE_AGENT_STORE",
                                 "TORCHELASTIC_RUN_ID",
                                 "TORCHELASTIC_RESTART_COUNT"};

class TorchrunEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("MASTER_ADDR", "10.77.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
  }
  static std::string error() {
    try {
      read_torchrun_env();
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(no UsageError)";
  }
};

TEST_F(TorchrunEnvTest, ReadsTheLaunchersVariables) {
  TorchrunEnv e = read_torchrun_env();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.master_addr, "10.77.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.local_rank, 3);  // RANK when LOCAL_RANK is not set
  EXPECT_EQ(e.local_world_size, 0);
  EXPECT_TRUE(e.rank0_hosts_store);
  EXPECT_EQ(e.key_prefix, "zerostep/");
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  e = read_torchrun_env();
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
}

// torchrun's agent hosts the store at MASTER_PORT and tells the workers so;
// each restart of the job gets keys of its own in that store.
TEST_F(TorchrunEnvTest, UnderTorchrunsAgentRankZeroOnlyConnects) {
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  setenv("TORCHELASTIC_RUN_ID", "job7", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  const TorchrunEnv e = read_torchrun_env();
  EXPECT_FALSE(e.rank0_hosts_store);
  EXPECT_EQ(e.key_prefix, "zerostep/job7/2/");
  setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
  EXPECT_TRUE(read_torchrun_env().rank0_hosts_store);
}

TEST_F(TorchrunEnvTest, NamesTheVariableThatIsMissingOrWrong) {
  unsetenv("MASTER_ADDR");
  EXPECT_EQ(error().rfind("environment variable MASTER_ADDR is not set", 0), 0u)
      << error();
  SetUp();
  unsetenv("WORLD_SIZE");
  EXPECT_EQ(error().rfind("environment variable WORLD_SIZE is not set", 0), 0u);
  SetUp();
  setenv("RANK", "4", 1);
  EXPECT_EQ(error().rfind("RANK=4 WORLD_SIZE=4: need RANK < WORLD_SIZE", 0), 0u)
      << error();
  SetUp();
  setenv("LOCAL_WORLD_SIZE", "5", 1);
  EXPECT_EQ(
      error().rfind("LOCAL_WORLD_SIZE=5: must be an integer from 1 to 4", 0),
      0u)
      << error();
  SetUp();
  setenv("LOCAL_RANK", "-1", 1);
  EXPECT_EQ(error().rfind("LOCAL_RANK=-1: must be an integer from 0", 0), 0u)
      << error();
}

}  // namespace
}  // namespace zerostep
