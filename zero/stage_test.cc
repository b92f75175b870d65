#include "zero/stage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "common/errors.h"
#include "common/zero_defaults.h"
#include "sim/sim_world.h"
#include "zero/far_kernels.h"
#include "zero/stage1.h"
#include "zero/stage2.h"
#include "zero/staging_comm.h"

namespace zerostep {
namespace {

struct RankState {
  std::vector<float> params, grads;
};

// The flat buffers of a stage over s: no gradient buffer where the stage
// takes gradients parameter by parameter (Note [Stage 2 buckets]).
FlatBuffers buffers_for(const StageOptions& o, RankState& s) {
  return {s.params.data(),
          partitions_gradients(o) ? nullptr : s.grads.data()};
}

// One backward's gradient `g` (layout.numel elements) into the stage: into
// the flat gradient buffer, or parameter by parameter in `order` (default:
// reverse registration order, as autograd completes a chain of layers) into
// the slices a ParamGradSink gives. `ready` (stages 0-2 with overlap_comm)
// reports every parameter complete.
void give(Stage& st, const StageOptions& o, const std::vector<float>& g,
          RankState& s, bool ready, std::vector<size_t> order = {}) {
  const FlatLayout& layout = o.layout;
  auto* sink = dynamic_cast<ParamGradSink*>(&st);
  if (!partitions_gradients(o)) {
    for (size_t i = 0; i < layout.numel; ++i) s.grads[i] += g[i];
    if (ready)
      for (size_t p = 0; p < layout.numels.size(); ++p) st.on_grad_ready(p);
    return;
  }
  if (order.empty())
    for (size_t p = layout.numels.size(); p-- > 0;) order.push_back(p);
  for (size_t p : order)
    sink->take_grad(p, [&](const GradSlice& sl) {
      for (size_t i = 0; i < sl.numel; ++i)
        sl.dst[i] += g[layout.offsets[p] + sl.param_offset + i];
    });
}

// Stage `stage`'s own options (0-2) with the buckets and overlap a test
// sets; stage 1 takes none of them.
PerStageOptions stage_options(
    int stage, int64_t reduce_bucket = zero_defaults::kBucketElements,
    int64_t allgather_bucket = zero_defaults::kBucketElements,
    bool overlap = false) {
  switch (stage) {
    case 0: {
      Stage0Options s;
      s.reduce_bucket_size = reduce_bucket;
      s.overlap_comm = overlap;
      return s;
    }
    case 1: {
      Stage1Options s;
      s.reduce_bucket_size = reduce_bucket;
      return s;
    }
    default: {
      EXPECT_EQ(stage, 2);
      Stage2Options s;
      s.reduce_bucket_size = reduce_bucket;
      s.allgather_bucket_size = allgather_bucket;
      s.overlap_comm = overlap;
      return s;
    }
  }
}

// Runs `windows` windows of `backwards` accumulated random gradients through
// a stage on a simulated world; returns every rank's final parameters.
std::vector<std::vector<float>> train(
    int stage, int world, int windows, int backwards, double clip = 0.0,
    int64_t reduce_bucket = zero_defaults::kBucketElements,
    int64_t allgather_bucket = zero_defaults::kBucketElements,
    FarKernels* far = nullptr, bool overlap = false) {
  const std::vector<size_t> numels = {13, 50, 7};
  FlatLayout layout = FlatLayout::make(numels, world);
  StageOptions opts;
  opts.per_stage =
      stage_options(stage, reduce_bucket, allgather_bucket, overlap);
  opts.layout = layout;
  opts.optimizer.kind = OptimizerKind::kAdamW;
  opts.optimizer.lr = 0.01;
  opts.optimizer.weight_decay = 0.1;
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
    auto st = make_stage(opts, buffers_for(opts, s), comm);
    std::mt19937 rng(1000 + r);
    std::normal_distribution<float> nd;
    for (int k = 0; k < windows; ++k) {
      for (int b = 0; b < backwards; ++b) {
        st->begin_backward(b + 1, k);
        std::vector<float> g(layout.numel);
        for (float& x : g) x = nd(rng);
        give(*st, opts, g, s, overlap);
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

// Note [Stage 1 reduce buckets]: a model larger than one bucket is
// reduce-scattered piece by piece through a staging buffer of one bucket,
// with the same bits (clipped too: the norm is over the same partition),
// and the staging is in memory().
TEST(StageTest, Stage1ReduceBucketsChangeNoBit) {
  for (int world : {1, 2, 3, 4})
    for (double clip : {0.0, 0.5}) {
      auto one = train(1, world, 3, 3, clip);
      auto many = train(1, world, 3, 3, clip, /*reduce_bucket=*/16 * world);
      for (int r = 0; r < world; ++r)
        EXPECT_EQ(one[r], many[r]) << "world " << world << " clip " << clip;
    }
  const FlatLayout layout = FlatLayout::make({13, 50, 7, 100}, 3);
  ASSERT_GT(layout.partition_numel, 16u);
  EXPECT_EQ(internal::stage1_reduce_piece(layout, 500000000),
            layout.partition_numel);
  EXPECT_EQ(internal::stage1_reduce_piece(layout, 16 * 3), 16u);
  SimWorld sim({3, 5});
  std::vector<MemoryStats> one(3), many(3);
  sim.run([&](int r) {
    std::vector<float> p(layout.padded_numel), g(layout.padded_numel);
    StageOptions o;
    o.layout = layout;
    o.per_stage = Stage1Options{};
    one[r] = make_stage(o, {p.data(), g.data()}, &sim.comm(r))->memory();
    Stage1Options small;
    small.reduce_bucket_size = 16 * 3;
    o.per_stage = small;
    many[r] = make_stage(o, {p.data(), g.data()}, &sim.comm(r))->memory();
  });
  EXPECT_EQ(many[0].grad_bytes, one[0].grad_bytes + 16 * 3 * sizeof(float));
  EXPECT_EQ(many[0].peak_bytes, one[0].peak_bytes + 16 * 3 * sizeof(float));
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
    std::vector<float> p(layout.padded_numel);
    StageOptions o;
    o.layout = layout;
    o.per_stage = stage_options(2, /*reduce_bucket=*/64);  // 32 per rank
    owned[r] = make_stage(o, {p.data(), nullptr}, &sim.comm(r))->owned_spans();
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
    opts.per_stage = stage_options(stage);
    opts.layout = layout;
    SimWorld sim({2, 5});
    std::vector<RankState> ranks(2);
    auto errors = sim.run_collect([&](int r) {
      RankState& s = ranks[r];
      s.params.assign(layout.padded_numel, 1.0f);
      s.grads.assign(layout.padded_numel, static_cast<float>(r + 1));
      auto st = make_stage(opts, buffers_for(opts, s), &sim.comm(r));
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
  opts.per_stage = stage_options(2);
  opts.layout = layout;
  SimWorld sim({2, 5});
  auto errors = sim.run_collect([&](int r) {
    std::vector<float> p(layout.padded_numel, 1.0f);
    auto st = make_stage(opts, {p.data(), nullptr}, &sim.comm(r));
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

// A communicator over the simulator that claims to overlap its
// asynchronous collectives (as gloo does; the simulator completes them in
// the call) and counts the asynchronous reduce-scatters and their waits.
class AsyncCounter final : public Communicator {
 public:
  explicit AsyncCounter(Communicator* inner) : inner_(inner) {}
  int issued = 0;
  int waited = 0;
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return "counter"; }
  bool overlaps_async() const override { return true; }
  bool reduce_scatter_accumulates() const override {
    return inner_->reduce_scatter_accumulates();
  }
  void all_reduce(Buffer b, const AllReduceOptions& o) override {
    inner_->all_reduce(b, o);
  }
  void reduce_scatter(Buffer i, Buffer out,
                      const ReduceScatterOptions& o) override {
    inner_->reduce_scatter(i, out, o);
  }
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer i, Buffer out, const ReduceScatterOptions& o) override {
    ++issued;
    struct Counted final : Work {
      std::shared_ptr<Work> inner;
      int* waited;
      void wait() override {
        inner->wait();
        ++*waited;
      }
    };
    auto w = std::make_shared<Counted>();
    w->inner = inner_->reduce_scatter_async(i, out, o);
    w->waited = &waited;
    return w;
  }
  void all_gather(Buffer i, Buffer out, const AllGatherOptions& o) override {
    inner_->all_gather(i, out, o);
  }
  void broadcast(Buffer b, const BroadcastOptions& o) override {
    inner_->broadcast(b, o);
  }
  void barrier() override { inner_->barrier(); }

 private:
  Communicator* inner_;
};

// What one run of bucketed stage 2 left behind (rank 0), and every rank's
// parameters.
struct PooledRun {
  std::vector<std::vector<float>> params;
  MemoryStats memory;
  size_t slots = 0;
  int async_issued = 0, async_waited = 0;
};

// `windows` windows of 2 backwards of random gradients through stage 2
// over 40 parameters of 1-37 elements, handed over in `order` (empty:
// reverse registration order), with buckets of 32 x W elements;
// `full_buffer`: the stage reduces a full gradient buffer after each
// backward instead (collectives_outside_backward), the algorithm stage 2
// ran before Note [Stage 2 buckets].
PooledRun run_pooled(int world, const std::vector<size_t>& order,
                     bool overlap, bool full_buffer, int windows = 2) {
  std::vector<size_t> numels;
  for (size_t i = 0; i < 40; ++i) numels.push_back(1 + (i * 7) % 37);
  const FlatLayout layout = FlatLayout::make(numels, world);
  Stage2Options own;
  own.reduce_bucket_size = 32 * world;
  own.overlap_comm = overlap;
  own.collectives_outside_backward = full_buffer;
  StageOptions opts;
  opts.per_stage = own;
  opts.layout = layout;
  opts.optimizer.kind = OptimizerKind::kAdamW;
  opts.optimizer.lr = 0.01;
  SimWorld sim({world, 5});
  PooledRun out;
  out.params.resize(world);
  sim.run([&](int r) {
    RankState s;
    s.params.assign(layout.padded_numel, 0.0f);
    s.grads.assign(layout.padded_numel, 0.0f);
    for (size_t i = 0; i < layout.numel; ++i) s.params[i] = 0.001f * i;
    AsyncCounter comm(&sim.comm(r));
    auto st = make_stage(opts, buffers_for(opts, s), &comm);
    std::mt19937 rng(77 + r);
    std::normal_distribution<float> nd;
    for (int k = 0; k < windows; ++k) {
      for (int b = 0; b < 2; ++b) {
        st->begin_backward(b + 1, k);
        std::vector<float> g(layout.numel);
        for (float& x : g) x = nd(rng);
        give(*st, opts, g, s, overlap, order);
        st->end_backward();
      }
      st->reduce_window(2, k, phase::kStep);
      st->finalize(2, 0.0);
      st->apply_update(opts.optimizer);
      st->zero_grad();
    }
    out.params[r] = s.params;
    if (r != 0) return;
    out.memory = st->memory();
    if (auto* s2 = dynamic_cast<Stage2*>(st.get())) out.slots = s2->bucket_slots();
    out.async_issued = comm.issued;
    out.async_waited = comm.waited;
  });
  return out;
}

// Note [Stage 2 buckets]: no full gradient at rest or in backward; the
// partition, two bucket slots and their scratch chunks are all the
// gradient memory, and the bits are those of reducing a full gradient
// buffer (the algorithm before the note), with and without overlap_comm.
TEST(StageTest, Stage2HoldsNoFullGradientAndKeepsTheBits) {
  for (int world : {1, 2, 3, 4}) {
    for (bool overlap : {false, true}) {
      const std::string at = "world " + std::to_string(world) +
                             (overlap ? " overlap" : "");
      const PooledRun full = run_pooled(world, {}, overlap, true);
      const PooledRun pooled = run_pooled(world, {}, overlap, false);
      for (int r = 0; r < world; ++r)
        EXPECT_EQ(0, std::memcmp(full.params[r].data(),
                                 pooled.params[r].data(),
                                 full.params[r].size() * sizeof(float)))
            << at << " rank " << r;
      std::vector<size_t> numels;
      for (size_t i = 0; i < 40; ++i) numels.push_back(1 + (i * 7) % 37);
      const FlatLayout layout = FlatLayout::make(numels, world);
      const size_t owned = layout.padded_numel / world;
      const size_t bucket = 32 * static_cast<size_t>(world);
      EXPECT_EQ(pooled.slots, 2u) << at;
      EXPECT_EQ(pooled.memory.grad_bytes,
                (owned + 2 * (bucket + bucket / world)) * sizeof(float))
          << at;
      EXPECT_EQ(full.memory.grad_bytes,
                (layout.padded_numel + 2 * owned) * sizeof(float))
          << at;
      EXPECT_LT(pooled.memory.grad_bytes, full.memory.grad_bytes) << at;
      // At one rank a bucket's scratch chunk is the bucket itself.
      if (world > 1) {
        EXPECT_LT(pooled.memory.grad_bytes,
                  layout.padded_numel * sizeof(float))
            << at;
      }
      // Rollback (Note [Transactional update]): the owned chunks and the
      // moments' commit scratch, a chunk of each.
      EXPECT_EQ(pooled.memory.rollback_bytes,
                (owned + 2 * std::min(owned, FlatOptimizer::kCommitChunk)) *
                    sizeof(float))
          << at;
      if (overlap && world > 1) {
        // Every bucket in flight, every one waited for.
        EXPECT_GT(pooled.async_issued, 0) << at;
        EXPECT_EQ(pooled.async_issued, pooled.async_waited) << at;
      }
    }
  }
}

// A model whose parameters complete out of order keeps more buckets open at
// once: the pool grows (and memory() says so), the bits do not move.
TEST(StageTest, Stage2PoolGrowsForParametersOutOfOrderWithTheSameBits) {
  std::vector<size_t> order(40);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  for (int world : {1, 3}) {
    const PooledRun chain = run_pooled(world, {}, false, false);
    const PooledRun shuffled = run_pooled(world, order, false, false);
    EXPECT_EQ(chain.params, shuffled.params) << world;
    EXPECT_EQ(chain.slots, 2u) << world;
    EXPECT_GT(shuffled.slots, 2u) << world;
    EXPECT_EQ(shuffled.memory.grad_bytes - chain.memory.grad_bytes,
              (shuffled.slots - 2) * (32 * world + 32) * sizeof(float))
        << world;
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
    o.per_stage = Stage1Options{};
    mem[r] = make_stage(o, {p.data(), g.data()}, &sim.comm(r))->memory();
    o.per_stage = Stage0Options{};
    mem0[r] = make_stage(o, {p.data(), g.data()}, &sim.comm(r))->memory();
  });
  EXPECT_EQ(mem[0].optimizer_state_bytes * 4, mem0[0].optimizer_state_bytes);
  // Note [Transactional update]: stage 1 keeps no copy of its moments, only
  // the commit scratch (a chunk of each); stage 0 needs none.
  const size_t owned = mem[0].optimizer_state_bytes / (2 * sizeof(float));
  EXPECT_EQ(mem[0].rollback_bytes,
            2 * std::min(owned, FlatOptimizer::kCommitChunk) * sizeof(float));
  EXPECT_EQ(mem0[0].rollback_bytes, 0u);
  EXPECT_EQ(mem[0].peak_bytes, mem[0].param_bytes + mem[0].grad_bytes +
                                   mem[0].optimizer_state_bytes +
                                   mem[0].rollback_bytes);
}

// make_stage() builds stages 0-2; stage 3 needs the Engine's storages.
TEST(StageTest, Stage3IsAClearErrorInMakeStage) {
  SimWorld sim({1, 5});
  std::vector<float> p(16), g(16);
  StageOptions o;
  o.layout = FlatLayout::make({16}, 1);
  o.per_stage = Stage3Options{};
  try {
    make_stage(o, {p.data(), g.data()}, &sim.comm(0));
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.stage = 3"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace zerostep
