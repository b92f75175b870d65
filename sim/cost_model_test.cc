#include "sim/cost_model.h"

#include <gtest/gtest.h>

namespace zerostep {
namespace {

// Round numbers so every expectation below is written out by hand.
CostModel model() {
  CostModel m;
  m.alpha_s = 1e-6;
  m.gamma_s_per_byte = 1e-12;
  m.ranks_per_node = 4;
  m.intra_node_bytes_per_s = 100e9;  // β = 1e-11 s/B
  m.inter_node_bytes_per_s = 10e9;   // β = 1e-10 s/B
  m.flops_per_s = 1e12;
  m.memory_bytes_per_s = 1e9;
  return m;
}

TEST(CostModelTest, RingFormulasInsideANode) {
  const CostModel m = model();
  const double n = 1e6;  // bytes
  // p = 4: (p-1) = 3, (p-1)/p = 0.75.
  EXPECT_DOUBLE_EQ(m.collective_seconds(CollectiveKind::kAllReduce, n, 4),
                   2 * 3 * 1e-6 + 2 * 0.75 * n * 1e-11 + 0.75 * n * 1e-12);
  EXPECT_DOUBLE_EQ(m.collective_seconds(CollectiveKind::kReduceScatter, n, 4),
                   3 * 1e-6 + 0.75 * n * 1e-11 + 0.75 * n * 1e-12);
  EXPECT_DOUBLE_EQ(m.collective_seconds(CollectiveKind::kAllGather, n, 4),
                   3 * 1e-6 + 0.75 * n * 1e-11);
  EXPECT_DOUBLE_EQ(m.collective_seconds(CollectiveKind::kBroadcast, n, 4),
                   2 * (1e-6 + n * 1e-11));
  EXPECT_DOUBLE_EQ(m.collective_seconds(CollectiveKind::kBarrier, 0, 4),
                   2 * 1e-6);
}

TEST(CostModelTest, AllReduceIsReduceScatterPlusAllGather) {
  const CostModel m = model();
  for (int p : {2, 3, 8, 1000}) {
    const double n = 4096.0 * p;
    EXPECT_NEAR(m.collective_seconds(CollectiveKind::kAllReduce, n, p),
                m.collective_seconds(CollectiveKind::kReduceScatter, n, p) +
                    m.collective_seconds(CollectiveKind::kAllGather, n, p),
                1e-18)
        << p;
  }
}

TEST(CostModelTest, ARingAcrossNodesRunsAtTheInterNodeBandwidth) {
  const CostModel m = model();
  const double n = 8e6;
  // p = 8 > 4 ranks per node: β = 1e-10; (p-1)/p = 7/8.
  EXPECT_DOUBLE_EQ(m.collective_seconds(CollectiveKind::kAllGather, n, 8),
                   7 * 1e-6 + 7.0 / 8.0 * n * 1e-10);
  EXPECT_DOUBLE_EQ(m.beta_s_per_byte(4), 1e-11);
  EXPECT_DOUBLE_EQ(m.beta_s_per_byte(5), 1e-10);
  // p = 5 needs ceil(log2 5) = 3 broadcast rounds.
  EXPECT_DOUBLE_EQ(m.collective_seconds(CollectiveKind::kBroadcast, 100, 5),
                   3 * (1e-6 + 100 * 1e-10));
}

TEST(CostModelTest, OneRankCostsNothing) {
  const CostModel m = model();
  for (CollectiveKind k :
       {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
        CollectiveKind::kAllGather, CollectiveKind::kBroadcast,
        CollectiveKind::kBarrier})
    EXPECT_EQ(m.collective_seconds(k, 1 << 20, 1), 0.0);
}

TEST(CostModelTest, ComputeFromFlopsAndTheOptimizerFromBytes) {
  const CostModel m = model();
  EXPECT_DOUBLE_EQ(m.forward_seconds(1e6, 100), 2 * 1e6 * 100 / 1e12);
  EXPECT_DOUBLE_EQ(m.backward_seconds(1e6, 100), 4 * 1e6 * 100 / 1e12);
  EXPECT_DOUBLE_EQ(m.optimizer_seconds(1e6), 28 * 1e6 / 1e9);
}

TEST(CostModelTest, DescribesEveryField) {
  const std::string s = model().to_string();
  for (const char* key :
       {"alpha_s=1e-06", "gamma_s_per_byte=1e-12", "ranks_per_node=4",
        "intra_node_bytes_per_s=1e+11", "inter_node_bytes_per_s=1e+10",
        "flops_per_s=1e+12", "memory_bytes_per_s=1e+09"})
    EXPECT_NE(s.find(key), std::string::npos) << key << " in " << s;
}

}  // namespace
}  // namespace zerostep
