#include "comm/gloo_world.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>

#include "comm/conformance.h"
#include "common/errors.h"

namespace zerostep {
namespace {

class GlooRunner : public ConformanceRunner {
 public:
  void run(int world_size, const RankBody& body) override {
    GlooLocalWorld world(world_size);
    world.run([&](int r) { body(world.comm(r)); });
  }
  std::vector<int> world_sizes() const override { return {1, 2, 3, 4}; }
};

const bool registered = [] {
  register_communicator_conformance(
      "gloo", [] { return std::make_unique<GlooRunner>(); });
  return true;
}();

TEST(GlooWorldTest, FromEnvironmentNamesTheMissingVariable) {
  unsetenv("RANK");
  try {
    GlooCommunicator::from_environment();
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK is not set"),
              std::string::npos)
        << e.what();
  }
}

// A set variable is read whole and within its range: MASTER_PORT=99999
// was read as port 34463 and RANK=1x as rank 1.
TEST(GlooWorldTest, FromEnvironmentRefusesAVariableThatIsNotItsNumber) {
  const struct {
    const char *rank, *world, *port, *want;
  } cases[] = {
      {"0", "2", "99999",
       "MASTER_PORT=99999: must be an integer from 1 to 65535"},
      {"1x", "2", "29500", "RANK=1x: not an integer"},
      {"0", "0", "29500", "WORLD_SIZE=0: must be an integer from 1 to"},
      {"0", "99999999999", "29500", "WORLD_SIZE=99999999999: must be an"},
  };
  for (const auto& c : cases) {
    setenv("RANK", c.rank, 1);
    setenv("WORLD_SIZE", c.world, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", c.port, 1);
    try {
      GlooCommunicator::from_environment();
      ADD_FAILURE() << "no error for " << c.want;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(c.want, 0), 0u) << e.what();
    }
  }
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    unsetenv(v);
}

// A rank that stops taking part makes its peers fail within the timeout,
// with a CommError, instead of hanging.
TEST(GlooWorldTest, APeerThatNeverArrivesIsACommErrorAfterTheTimeout) {
  GlooOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  GlooLocalWorld world(2, o);
  auto errors = world.run_collect([&](int r) {
    if (r == 1) return;  // never joins
    float x = 1;
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), CommError);
  EXPECT_FALSE(errors[1]);
}

// The same for the point-to-point collectives (Note [Gloo reduce-scatter
// and all-gather] in gloo_world.cc): the receive that never completes.
TEST(GlooWorldTest, APeerThatNeverSendsIsACommErrorAfterTheTimeout) {
  GlooOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  for (bool gather : {false, true}) {
    GlooLocalWorld world(2, o);
    auto errors = world.run_collect([&](int r) {
      if (r == 1) return;  // never joins
      std::vector<float> in(8, 1.0f), out(gather ? 16 : 4);
      if (gather)
        world.comm(r).all_gather(Buffer::of(in.data(), 8),
                                 Buffer::of(out.data(), 16), {});
      else
        world.comm(r).reduce_scatter(Buffer::of(in.data(), 8),
                                     Buffer::of(out.data(), 4), {});
    });
    ASSERT_TRUE(errors[0]) << (gather ? "all_gather" : "reduce_scatter");
    EXPECT_THROW(std::rethrow_exception(errors[0]), CommError);
    EXPECT_FALSE(errors[1]);
  }
}

// Note [Issuing under one lock] in gloo_world.cc: the ranks of fresh worlds
// issue their first collectives at once, the moment LibTorch 2.11's flight
// recorder adds each new process group to its map. Without the lock this
// crashed (SIGSEGV) in 9 of 10 runs of 40 worlds under --config=cuda.
TEST(GlooWorldTest, FreshWorldsIssuingAtOnceDoNotCrash) {
  constexpr int kWorld = 8;
  for (int i = 0; i < 25; ++i) {
    GlooLocalWorld world(kWorld);
    std::atomic<int> arrived{0};
    world.run([&](int r) {
      arrived.fetch_add(1);
      while (arrived.load() < kWorld) std::this_thread::yield();
      float x = static_cast<float>(r);
      world.comm(r).all_reduce(Buffer::of(&x, 1), {});
      EXPECT_EQ(x, kWorld * (kWorld - 1) / 2.0f);
    });
  }
}

// Note [Gloo reduce-scatter and all-gather] in gloo_world.cc: the
// reduce-scatter folds every rank's chunk in rank order, acc = x0;
// acc = acc + x1; ...; then / W, the simulator's order (Note [Reduction
// order] in sim/sim_world.h), so it gives the simulator's bits for floats
// that are not small integers (where another order, e.g. Gloo's ring,
// rounds differently). Large buffers (4 MiB per rank, more than a socket
// buffer holds), several in flight at once, waited in reverse issue order
// with a c10d all-reduce issued between them, at 3 and 4 ranks.
TEST(GlooWorldTest, ReduceScatterFoldsInRankOrderAndAllGatherPlacesChunks) {
  for (int world_size : {3, 4}) {
    const size_t chunk = (1 << 20) + 3;
    const size_t n = chunk * world_size;
    auto value = [](int rank, int k, size_t i) {
      // Values of many magnitudes, so that the order of a sum shows.
      const uint64_t h = (i * 2654435761u + rank * 40503u + k * 977u) % 100003u;
      return static_cast<float>(h) * 1e-3f * (h % 3 == 0 ? 1e4f : 1.0f) -
             17.25f;
    };
    GlooLocalWorld world(world_size);
    world.run([&](int r) {
      Communicator& c = world.comm(r);
      std::vector<std::vector<float>> ins(3, std::vector<float>(n));
      std::vector<std::vector<float>> outs(3, std::vector<float>(chunk));
      std::vector<std::shared_ptr<Work>> works;
      for (int k = 0; k < 3; ++k) {
        for (size_t i = 0; i < n; ++i) ins[k][i] = value(r, k, i);
        works.push_back(c.reduce_scatter_async(
            Buffer::of(ins[k].data(), n), Buffer::of(outs[k].data(), chunk),
            {k == 1 ? ReduceOp::kAvg : ReduceOp::kSum}));
      }
      double x = 1;
      c.all_reduce(Buffer::of(&x, 1), {});
      EXPECT_EQ(x, world_size);
      for (int k = 2; k >= 0; --k) works[k]->wait();
      size_t differs_from_reverse_order = 0;
      for (int k = 0; k < 3; ++k)
        for (size_t i = 0; i < chunk; ++i) {
          const size_t g = r * chunk + i;
          float acc = value(0, k, g), rev = value(world_size - 1, k, g);
          for (int q = 1; q < world_size; ++q) {
            acc = acc + value(q, k, g);
            rev = rev + value(world_size - 1 - q, k, g);
          }
          if (k == 1) {
            acc = acc / static_cast<float>(world_size);
            rev = rev / static_cast<float>(world_size);
          }
          differs_from_reverse_order += rev != acc;
          ASSERT_EQ(outs[k][i], acc)
              << "world " << world_size << " rank " << r << " op " << k
              << " element " << i;
        }
      // The values do tell summation orders apart.
      EXPECT_GT(differs_from_reverse_order, chunk / 100);

      // All-gather, out of place and in place from the own chunk.
      std::vector<float> gathered(n, -1.0f), in_place(n, -1.0f);
      std::vector<float> mine(chunk);
      for (size_t i = 0; i < chunk; ++i) mine[i] = value(r, 7, i);
      std::copy(mine.begin(), mine.end(), in_place.begin() + r * chunk);
      c.all_gather(Buffer::of(mine.data(), chunk),
                   Buffer::of(gathered.data(), n), {});
      c.all_gather(Buffer::of(in_place.data() + r * chunk, chunk),
                   Buffer::of(in_place.data(), n), {});
      for (size_t i = 0; i < n; ++i) {
        const float expect = value(static_cast<int>(i / chunk), 7, i % chunk);
        ASSERT_EQ(gathered[i], expect) << "rank " << r << " element " << i;
        ASSERT_EQ(in_place[i], expect) << "rank " << r << " element " << i;
      }
    });
  }
}

}  // namespace
}  // namespace zerostep
