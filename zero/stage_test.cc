#include "zero/stage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "common/errors.h"
#include "sim/sim_world.h"
#include "zero/far_kernels.h"
#include "zero/staging_comm.h"

namespace zerostep {
namespace {

struct RankState {
  std::vector<float> params, grads;
};

// Runs `windows` windows of `backwards` accumulated random gradients through
// a stage on a simulated world; returns every rank's final parameters.
std::vector<std::vector<float>> train(int stage, int world, int windows,
                                      int backwards, double clip = 0.0,
                                      int64_t reduce_bucket = 500000000,
                                      int64_t allgather_bucket = 500000000,
                                      FarKernels* far = nullptr,
                                      bool overlap = false) {
  const std::vector<size_t> numels = {13, 50, 7};
  FlatLayout layout = FlatLayout::make(numels, world);
  StageOptions opts;
  opts.stage = stage;
  opts.layout = layout;
  opts.optimizer.kind = OptimizerKind::kAdamW;
  opts.optimizer.lr = 0.01;
  opts.optimizer.weight_decay = 0.1;
  opts.reduce_bucket_size = reduce_bucket;
  opts.allgather_bucket_size = allgather_bucket;
  opts.overlap_comm = overlap;
  opts.kernels = far;
  SimWorld sim({world, 5});
  std::vector<RankState> ranks(world);
  sim.run([&](int r) {
    RankState& s = ranks[r];
    s.params.assign(layout.padded_numel, 0.0f);
    s.grads.assign(layout.padded_numel, 0.0f);
    for (size_t i = 0; i < layout.numel; ++i) s.params[i] = 0.01f * i;
    // The device path: buffers in the kernels' memory, collectives staged.
    std::optional<StagingCommunicator> staged;
    if (far) staged.emplace(&sim.comm(r), far);
    Communicator* comm = far ? &*staged : &sim.comm(r);
    auto st = make_stage(opts, {s.params.data(), s.grads.data()}, comm);
    std::mt19937 rng(1000 + r);
    std::normal_distribution<float> nd;
    for (int k = 0; k < windows; ++k) {
      for (int b = 0; b < backwards; ++b) {
        st->begin_backward(b + 1, k);
        for (size_t i = 0; i < layout.numel; ++i) s.grads[i] += nd(rng);
        if (overlap)
          for (size_t p = 0; p < numels.size(); ++p) st->on_grad_ready(p);
        st->end_backward();
      }
      st->reduce_window(backwards, k, phase::kStep);
      st->finalize(backwards, clip);
      st->apply_update(opts.optimizer);
      st->zero_grad();
    }
  });
  std::vector<std::vector<float>> out;
  for (auto& s : ranks) out.push_back(s.params);
  return out;
}

TEST(StageTest, ReplicasStayIdenticalAndPaddingStaysZero) {
  for (int stage : {0, 1, 2}) {
    auto params = train(stage, 3, 4, 2);
    FlatLayout layout = FlatLayout::make({13, 50, 7}, 3);
    for (int r = 1; r < 3; ++r) EXPECT_EQ(params[r], params[0]) << stage;
    for (size_t i = layout.numel; i < layout.padded_numel; ++i)
      EXPECT_EQ(params[0][i], 0.0f) << "stage " << stage << " padding " << i;
  }
}

// Bitwise: both stages reduce each element in rank order (Note [Reduction
// order]) and apply the same elementwise optimizer, so partitioning the
// optimizer must not change a single bit.
TEST(StageTest, Stage1EqualsStage0Bitwise) {
  for (int world : {1, 2, 3, 4}) {
    auto p0 = train(0, world, 3, 3);
    auto p1 = train(1, world, 3, 3);
    ASSERT_EQ(p0[0].size(), p1[0].size());
    EXPECT_EQ(0, std::memcmp(p0[0].data(), p1[0].data(), p0[0].size() * 4))
        << "world " << world;
  }
}

// Stage 2 sums each backward's gradient over ranks and then over backwards;
// stages 0/1 sum over backwards locally, then over ranks. Different float
// order, so a tolerance: a few ulps of the update.
TEST(StageTest, Stage2AgreesWithStage0) {
  for (int world : {1, 2, 3, 4}) {
    auto p0 = train(0, world, 3, 3);
    auto p2 = train(2, world, 3, 3);
    for (size_t i = 0; i < p0[0].size(); ++i)
      ASSERT_NEAR(p0[0][i], p2[0][i], 1e-5) << "world " << world << " " << i;
  }
}

// Bitwise: buckets only cut the same elementwise work into pieces.
TEST(StageTest, Stage2BucketSizesDoNotChangeABit) {
  for (int world : {1, 2, 3}) {
    auto one = train(2, world, 2, 2);
    auto many = train(2, world, 2, 2, 0.0, /*reduce_bucket=*/16 * world,
                      /*allgather_bucket=*/16 * world);
    auto pieces = train(2, world, 2, 2, 0.0, /*reduce_bucket=*/64 * world,
                        /*allgather_bucket=*/16 * world);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(one[r], many[r]) << "world " << world;
      EXPECT_EQ(one[r], pieces[r]) << "world " << world;
    }
  }
}

// Note [Device kernels]: the same stage code on memory that is not the
// host's (FarKernels), every collective staged through host copies, gives
// the host run's bits, and waits for the device once per step for the norm
// plus once per staged collective.
TEST(StageTest, DeviceKernelsGiveTheHostBitsAndOneNormPerStep) {
  for (int stage : {0, 1, 2}) {
    for (int world : {1, 3}) {
      for (bool overlap : {false, true}) {
        if (overlap && stage != 2) continue;
        const int windows = 3, backwards = 2;
        const auto host = train(stage, world, windows, backwards, 0.5, 32, 32,
                                nullptr, overlap);
        FarKernels far;
        const auto dev = train(stage, world, windows, backwards, 0.5, 32, 32,
                               &far, overlap);
        const std::string what = "stage " + std::to_string(stage) + " world " +
                                 std::to_string(world) +
                                 (overlap ? " overlap" : "");
        for (int r = 0; r < world; ++r) EXPECT_EQ(host[r], dev[r]) << what;
        EXPECT_EQ(far.norms.load(), int64_t{windows} * world) << what;
        EXPECT_GT(far.downloads.load(), 0) << what;
      }
    }
  }
}

// A host-memory backend refuses a device buffer, naming the fix.
TEST(StageTest, HostBackendsRefuseDeviceBuffers) {
  SimWorld sim({2, 5});
  std::vector<std::string> errors(2);
  sim.run([&](int r) {
    float x[4] = {1, 2, 3, 4};
    Buffer b = Buffer::of(x, 4);
    b.device = true;
    try {
      sim.comm(r).all_reduce(b, {});
    } catch (const UsageError& e) {
      errors[r] = e.what();
    }
  });
  for (const std::string& e : errors)
    EXPECT_NE(e.find("StagingCommunicator"), std::string::npos) << e;
}

TEST(StageTest, Stage2OwnsOneChunkOfEveryBucket) {
  FlatLayout layout = FlatLayout::make({200}, 2);  // padded to 224
  SimWorld sim({2, 5});
  std::vector<std::vector<Span>> owned(2);
  sim.run([&](int r) {
    std::vector<float> p(layout.padded_numel), g(layout.padded_numel);
    StageOptions o;
    o.layout = layout;
    o.stage = 2;
    o.reduce_bucket_size = 64;  // 32 per rank
    owned[r] = make_stage(o, {p.data(), g.data()}, &sim.comm(r))->owned_spans();
  });
  ASSERT_EQ(owned[0].size(), 4u);  // 224 / 64 buckets, the last one 32
  EXPECT_EQ(owned[0][0].offset, 0u);
  EXPECT_EQ(owned[1][0].offset, 32u);
  EXPECT_EQ(owned[1][3].offset, 192u + 16u);
  EXPECT_EQ(owned[1][3].numel, 16u);
  size_t total = 0;
  for (int r = 0; r < 2; ++r)
    for (const Span& s : owned[r]) total += s.numel;
  EXPECT_EQ(total, layout.padded_numel);
}

TEST(StageTest, ClippingGivesTheSameResultOnBothStages) {
  auto p0 = train(0, 2, 2, 2, /*clip=*/0.5);
  auto p1 = train(1, 2, 2, 2, /*clip=*/0.5);
  auto p2 = train(2, 2, 2, 2, /*clip=*/0.5, /*reduce_bucket=*/64);
  auto unclipped = train(0, 2, 2, 2);
  for (size_t i = 0; i < p0[0].size(); ++i) {
    EXPECT_NEAR(p0[0][i], p1[0][i], 1e-6) << i;
    EXPECT_NEAR(p0[0][i], p2[0][i], 1e-5) << i;
  }
  EXPECT_NE(p0[0], unclipped[0]);
}

TEST(StageTest, DisagreeingWindowIsAnErrorOnEveryRankAndReducesNothing) {
  for (int stage : {0, 1, 2}) {
    FlatLayout layout = FlatLayout::make({40}, 2);
    StageOptions opts;
    opts.stage = stage;
    opts.layout = layout;
    SimWorld sim({2, 5});
    std::vector<RankState> ranks(2);
    auto errors = sim.run_collect([&](int r) {
      RankState& s = ranks[r];
      s.params.assign(layout.padded_numel, 1.0f);
      s.grads.assign(layout.padded_numel, static_cast<float>(r + 1));
      auto st =
          make_stage(opts, {s.params.data(), s.grads.data()}, &sim.comm(r));
      st->reduce_window(/*window_backwards=*/r == 0 ? 4 : 5, 0, phase::kStep);
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(errors[r]) << "rank " << r;
      try {
        std::rethrow_exception(errors[r]);
      } catch (const UsageError& e) {
        std::string what = e.what();
        EXPECT_NE(what.find("rank 0 ran 4 backward() calls and steps"), std::string::npos)
            << what;
        EXPECT_NE(what.find("rank 1 ran 5 backward() calls and steps"), std::string::npos)
            << what;
      }
      EXPECT_EQ(ranks[r].grads[0], static_cast<float>(r + 1));
      EXPECT_EQ(ranks[r].params[0], 1.0f);
    }
  }
}

// Stage 2 reduces in backward: a rank that runs one backward more than the
// others meets their step()'s agreement with its backward's and everyone
// stops with the same error instead of mismatching collectives.
TEST(StageTest, Stage2ExtraBackwardMeetsTheOthersStepWithAClearError) {
  FlatLayout layout = FlatLayout::make({40}, 2);
  StageOptions opts;
  opts.stage = 2;
  opts.layout = layout;
  SimWorld sim({2, 5});
  auto errors = sim.run_collect([&](int r) {
    std::vector<float> p(layout.padded_numel, 1.0f), g(layout.padded_numel);
    auto st = make_stage(opts, {p.data(), g.data()}, &sim.comm(r));
    const int n = r == 0 ? 2 : 3;
    for (int b = 1; b <= n; ++b) {
      st->begin_backward(b, 0);
      st->end_backward();
    }
    st->reduce_window(n, 0, phase::kStep);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const UsageError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("rank 0 ran 2 backward() calls and steps"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("rank 1 starts backward() number 3"),
                std::string::npos)
          << what;
    }
  }
}

TEST(StageTest, Stage1HoldsOneWorldthOfTheOptimizerState) {
  FlatLayout layout = FlatLayout::make({1000}, 4);
  SimWorld sim({4, 5});
  std::vector<MemoryStats> mem(4);
  std::vector<MemoryStats> mem0(4);
  sim.run([&](int r) {
    std::vector<float> p(layout.padded_numel), g(layout.padded_numel);
    StageOptions o;
    o.layout = layout;
    o.stage = 1;
    mem[r] = make_stage(o, {p.data(), g.data()}, &sim.comm(r))->memory();
    o.stage = 0;
    mem0[r] = make_stage(o, {p.data(), g.data()}, &sim.comm(r))->memory();
  });
  EXPECT_EQ(mem[0].optimizer_state_bytes * 4, mem0[0].optimizer_state_bytes);
  // Note [Transactional update]: stage 1 keeps a copy of its moments (8
  // bytes per owned element) to undo a failed update; stage 0 needs none.
  EXPECT_EQ(mem[0].rollback_bytes, mem[0].optimizer_state_bytes);
  EXPECT_EQ(mem0[0].rollback_bytes, 0u);
  EXPECT_EQ(mem[0].peak_bytes, mem[0].param_bytes + mem[0].grad_bytes +
                                   mem[0].optimizer_state_bytes +
                                   mem[0].rollback_bytes);
}

TEST(StageTest, UnsupportedStageIsAClearError) {
  SimWorld sim({1, 5});
  std::vector<float> p(16), g(16);
  StageOptions o;
  o.layout = FlatLayout::make({16}, 1);
  o.stage = 4;
  try {
    make_stage(o, {p.data(), g.data()}, &sim.comm(0));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.stage = 4"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace zerostep
