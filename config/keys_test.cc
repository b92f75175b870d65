#include "config/keys.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace zerostep {
namespace {

using namespace config_keys;  // NOLINT: the tables are the subject.

// A name listed twice would be harmless, but one listed both as read and as
// ignored (or rejected) would be decided by dispatch order, not by the table.
void expect_disjoint(const std::vector<const std::vector<std::string>*>& lists,
                     const char* what) {
  std::set<std::string> seen;
  for (const std::vector<std::string>* list : lists) {
    for (const std::string& key : *list) {
      EXPECT_TRUE(seen.insert(key).second) << what << ": " << key;
    }
  }
}

TEST(ConfigKeysTest, EachSectionListsEachKeyOnce) {
  expect_disjoint({&kTopSupported, &kTopIgnored, &kTopRejected}, "top level");
  expect_disjoint({&kZeroSupported, &kZeroIgnored}, "zero_optimization");
  expect_disjoint({&kOffloadKeys}, "offload");
  expect_disjoint({&kOptimizerKeys}, "optimizer");
  expect_disjoint({&kOptimizerParams, &kOptimizerParamsIgnored},
                  "optimizer.params");
  expect_disjoint({&kFp16Keys}, "fp16");
  expect_disjoint({&kBf16Keys}, "bf16");
  expect_disjoint({&kDataTypesKeys}, "data_types");
  expect_disjoint({&kSchedulerKeys}, "scheduler");
  expect_disjoint({&kSchedulerParams}, "scheduler.params");
}

TEST(ConfigKeysTest, EverySchedulesParamsAreSchedulerParams) {
  const std::set<std::string> all(kSchedulerParams.begin(),
                                  kSchedulerParams.end());
  std::set<std::string> union_of_types = {"last_batch_iteration"};
  for (const std::vector<std::string>* params :
       {&kWarmupLRParams, &kWarmupDecayLRParams, &kWarmupCosineLRParams}) {
    for (const std::string& p : *params) {
      EXPECT_EQ(all.count(p), 1u) << p;
      union_of_types.insert(p);
    }
  }
  EXPECT_EQ(union_of_types, all);
}

}  // namespace
}  // namespace zerostep
