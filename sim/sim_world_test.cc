#include "sim/sim_world.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "comm/conformance.h"
#include "common/errors.h"

namespace zerostep {
namespace {

class SimRunner : public ConformanceRunner {
 public:
  void run(int world_size, const RankBody& body) override {
    SimWorld world({world_size, /*seed=*/1});
    world.run([&](int r) { body(world.comm(r)); });
  }
  std::vector<int> world_sizes() const override { return {1, 2, 3, 4, 8}; }
};

const bool registered = [] {
  register_communicator_conformance(
      "sim", [] { return std::make_unique<SimRunner>(); });
  return true;
}();

// The process's address space now (VmSize), in bytes.
uint64_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmSize:") {
      uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    std::getline(status, key);
  }
  return 0;
}

// In a child process: an address space with room for a few thread stacks
// (8 MiB each by default), then a world of 64 ranks that meet in a
// barrier. Exits 0 with the error on stderr when the run is refused with
// a UsageError; any other outcome exits non-zero.
void run_world_beyond_the_threads_allowed() {
  const uint64_t now = address_space_bytes();
  if (now == 0) std::exit(3);
  const rlimit limit = {now + (48u << 20), now + (48u << 20)};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::exit(4);
  try {
    SimWorld world({64, 1});
    world.run([&](int r) { world.comm(r).barrier(); });
  } catch (const UsageError& e) {
    std::cerr << e.what() << "\n";
    std::exit(0);
  } catch (const std::exception& e) {
    std::cerr << "not a UsageError: " << e.what() << "\n";
    std::exit(5);
  }
  std::exit(6);  // every thread started: the limit did not bite
}

// Note [A rank whose thread cannot start]: before, the std::thread that
// could not be created left the started ones joinable, and the process
// ended in std::terminate (an abort, or a hang in their barrier).
TEST(SimWorldDeathTest, AWorldLargerThanTheThreadsAllowedIsAUsageError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_world_beyond_the_threads_allowed(),
              ::testing::ExitedWithCode(0),
              "could not start the thread of rank [0-9]+ of 64 .*Fix: "
              "run fewer ranks");
}

TEST(SimWorldTest, MismatchedCollectiveIsAnErrorOnEveryRank) {
  SimWorld world({3, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    std::vector<float> x(r == 2 ? 8 : 4, 1.0f);
    world.comm(r).all_reduce(Buffer::of(x.data(), x.size()), {});
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " did not fail";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CommError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("mismatched collective #0"), std::string::npos)
          << what;
      EXPECT_NE(what.find("rank 2 called all_reduce(sum, float32 x 8)"),
                std::string::npos)
          << what;
    }
  }
}

TEST(SimWorldTest, DifferentOpsOnDifferentRanksAreAMismatchNotAHang) {
  SimWorld world({2, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    std::vector<float> x(4, 1.0f), y(2);
    if (r == 0) {
      world.comm(r).all_reduce(Buffer::of(x.data(), 4), {});
    } else {
      world.comm(r).reduce_scatter(Buffer::of(x.data(), 4),
                                   Buffer::of(y.data(), 2), {});
    }
  });
  EXPECT_TRUE(errors[0]);
  EXPECT_TRUE(errors[1]);
}

TEST(SimWorldTest, RankThatFailsReleasesEveryWaitingRank) {
  SimWorld world({4, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    if (r == 1) throw UsageError("rank 1 gave up");
    float x = 1;
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
  });
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(errors[r]) << r;
  try {
    std::rethrow_exception(errors[0]);
  } catch (const CommError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("rank 1 left the world"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 gave up"), std::string::npos) << what;
  }
  // run() reports the root cause, not a consequence.
  EXPECT_THROW(world.run([&](int r) {
    if (r == 1) throw UsageError("rank 1 gave up");
    float x = 1;
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
  }),
               UsageError);
}

TEST(SimWorldTest, RankThatReturnsEarlyIsReportedByTheOthers) {
  SimWorld world({2, 7});
  std::vector<std::exception_ptr> errors = world.run_collect([&](int r) {
    if (r == 0) return;
    world.comm(r).barrier();
  });
  EXPECT_FALSE(errors[0]);
  ASSERT_TRUE(errors[1]);
  EXPECT_THROW(std::rethrow_exception(errors[1]), CommError);
}

TEST(SimWorldTest, ReductionIsInRankOrderAndIdenticalOnEveryRank) {
  // Values chosen so that float addition order matters: (a+b)+c != a+(b+c).
  const float vals[3] = {1e8f, -1e8f, 1.0f};
  SimWorld world({3, 7});
  std::vector<float> out(3);
  world.run([&](int r) {
    float x = vals[r];
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
    out[r] = x;
  });
  const float expect = (vals[0] + vals[1]) + vals[2];
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r], expect);
}

TEST(SimWorldTest, ResultsDoNotDependOnThreadScheduling) {
  std::vector<uint32_t> first;
  for (int trial = 0; trial < 5; ++trial) {
    SimWorld world({4, 7});
    std::vector<std::vector<float>> outs(4);
    world.run([&](int r) {
      std::mt19937 rng(100 + r);  // per-rank data, same every trial
      std::normal_distribution<float> nd;
      std::vector<float> x(257);
      for (float& v : x) v = nd(rng);
      // Jitter the arrival order differently each trial.
      for (int spin = 0; spin < (trial * 7 + r * 13) % 5 * 1000; ++spin)
        std::atomic_signal_fence(std::memory_order_seq_cst);
      world.comm(r).all_reduce(Buffer::of(x.data(), x.size()),
                               {ReduceOp::kAvg, "step"});
      outs[r] = x;
    });
    std::vector<uint32_t> bits(outs[0].size());
    std::memcpy(bits.data(), outs[0].data(), bits.size() * 4);
    for (int r = 1; r < 4; ++r) ASSERT_EQ(outs[r], outs[0]);
    if (trial == 0) first = bits;
    EXPECT_EQ(bits, first) << "trial " << trial;
  }
}

// Collectives of several parts (Note [Parallel reduction] in
// sim/reduction.cc) are reduced by every rank thread at once; each element
// must still be the rank-order fold, the same bits on every rank, at sizes
// that cut chunks and parts, in every world from 1 to 8.
TEST(SimWorldTest, SplitReductionsAreTheRankOrderFoldOnEveryRank) {
  const size_t n = 3 * 65536 + 4099;  // over three 256 KiB parts of floats
  for (int world_size = 1; world_size <= 8; ++world_size) {
    SCOPED_TRACE(testing::Message() << "world " << world_size);
    std::vector<std::vector<float>> in(world_size, std::vector<float>(n));
    std::mt19937 rng(world_size);
    std::normal_distribution<float> nd(0.0f, 1e3f);
    for (auto& v : in)
      for (float& x : v) x = nd(rng);
    std::vector<float> sum(n), avg(n);
    for (size_t i = 0; i < n; ++i) {
      float acc = in[0][i];
      for (int r = 1; r < world_size; ++r) acc = acc + in[r][i];
      sum[i] = acc;
      avg[i] = acc / static_cast<float>(world_size);
    }
    const size_t per_rank = n / world_size;
    SimWorld world({world_size, 7});
    std::vector<std::vector<float>> reduced = in;
    std::vector<std::vector<float>> scattered(world_size,
                                              std::vector<float>(per_rank));
    world.run([&](int r) {
      Communicator& comm = world.comm(r);
      comm.reduce_scatter(Buffer::of(in[r].data(), per_rank * world_size),
                          Buffer::of(scattered[r].data(), per_rank),
                          {ReduceOp::kSum, "step"});
      comm.all_reduce(Buffer::of(reduced[r].data(), n),
                      {ReduceOp::kAvg, "step"});
    });
    for (int r = 0; r < world_size; ++r) {
      ASSERT_EQ(std::memcmp(reduced[r].data(), avg.data(), n * 4), 0)
          << "all_reduce rank " << r;
      ASSERT_EQ(std::memcmp(scattered[r].data(), sum.data() + r * per_rank,
                            per_rank * 4),
                0)
          << "reduce_scatter rank " << r;
    }
  }
}

TEST(SimWorldTest, LedgerRecordsOpBytesAndPhase) {
  SimWorld world({2, 7});
  world.run([&](int r) {
    std::vector<float> g(10), p(5);
    world.comm(r).all_reduce(Buffer::of(g.data(), 10),
                             {ReduceOp::kAvg, "backward"});
    world.comm(r).all_gather(Buffer::of(p.data(), 5), Buffer::of(g.data(), 10),
                             {"step"});
  });
  const Ledger& l = world.ledger(1);
  ASSERT_EQ(l.entries().size(), 2u);
  EXPECT_EQ(l.entries()[0].kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(l.entries()[0].bytes, 40u);
  EXPECT_EQ(l.entries()[0].wire_bytes, 40u);  // 2(W-1)/W * 40
  EXPECT_EQ(l.entries()[1].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(l.bytes_in("backward"), 40u);
  EXPECT_EQ(l.bytes_in("step"), 40u);
}

TEST(SimWorldTest, ZeroRanksIsRejected) {
  EXPECT_THROW(SimWorld({0, 1}), UsageError);
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

TEST(SimWorldTest, ReduceScatterIntoItsOwnInputIsRejected) {
  SimWorld world({2, 7});
  EXPECT_THROW(world.run([&](int r) {
    std::vector<float> buf(8, 1.0f);
    world.comm(r).reduce_scatter(Buffer::of(buf.data(), 8),
                                 Buffer::of(buf.data() + 4, 4), {});
  }),
               UsageError);
}

}  // namespace
}  // namespace zerostep

// Faults and the virtual clock (Note [Fault model], Note [Virtual clock]).
namespace zerostep {
namespace {

SimOptions with_faults(int w, const std::string& faults) {
  SimOptions o;
  o.world_size = w;
  o.seed = 7;
  o.faults = parse_fault_options(faults);
  return o;
}

std::string what(const std::exception_ptr& e) {
  if (!e) return "(no error)";
  try {
    std::rethrow_exception(e);
  } catch (const CommError& c) {
    return std::string("CommError: ") + c.what();
  } catch (const std::exception& x) {
    return std::string("other: ") + x.what();
  }
}

// Three float all-reduces, in the step phase.
void three_all_reduces(SimWorld& world, int r) {
  for (int i = 0; i < 3; ++i) {
    std::vector<float> x(16, 1.0f);
    world.comm(r).all_reduce(Buffer::of(x.data(), x.size()),
                             {ReduceOp::kSum, "step"});
  }
}

TEST(SimFaultTest, CrashIsACommErrorOnEveryRankNamingRankAndCollective) {
  SimWorld world(with_faults(4, "crash:2@1,timeout:5"));
  auto errors = world.run_collect([&](int r) { three_all_reduces(world, r); });
  for (int r = 0; r < 4; ++r) {
    const std::string m = what(errors[r]);
    EXPECT_EQ(m.rfind("CommError: ", 0), 0u) << m;
    EXPECT_NE(m.find("rank 2 crashed on entering its collective #1 "
                     "(all_reduce, phase step)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("injected fault crash:2@1"), std::string::npos) << m;
  }
  // Survivors gave up one timeout after they arrived at collective #1.
  const double one = world.timeline(0)[0].end_s;
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(world.ledger(r).entries().size(), 1u);
    EXPECT_DOUBLE_EQ(world.clock(r).now_s, one + 5.0) << r;
    ASSERT_EQ(world.timeline(r).size(), 2u);
    EXPECT_TRUE(world.timeline(r)[1].failed);
  }
  // run() reports the crash itself, whichever thread failed first.
  for (int trial = 0; trial < 3; ++trial) {
    try {
      world.run([&](int r) { three_all_reduces(world, r); });
      ADD_FAILURE() << "no error";
    } catch (const CommError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("rank 2 crashed", 0), 0u)
          << e.what();
    }
  }
}

TEST(SimFaultTest, LostPeerTimesOutInVirtualTimeOnEveryRank) {
  SimWorld world(with_faults(3, "lost:1@2,timeout:7.5"));
  auto errors = world.run_collect([&](int r) { three_all_reduces(world, r); });
  for (int r = 0; r < 3; ++r) {
    const std::string m = what(errors[r]);
    EXPECT_NE(m.find("CommError: rank " + std::to_string(r) +
                     ": collective #2 (all_reduce, phase step) never "
                     "completed: rank 1's part of it was lost"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("timeout of 7.5 s"), std::string::npos) << m;
    EXPECT_NE(m.find("injected fault lost:1@2"), std::string::npos) << m;
    const double arrived = world.timeline(r)[1].end_s;
    EXPECT_DOUBLE_EQ(world.clock(r).now_s, arrived + 7.5);
  }
}

TEST(SimFaultTest, LostPeerInAWorldOfOneIsNotAHang) {
  SimWorld world(with_faults(1, "lost:0@0"));
  EXPECT_THROW(world.run([&](int r) { world.comm(r).barrier(); }), CommError);
  EXPECT_DOUBLE_EQ(world.clock(0).now_s, 60.0);
}

TEST(SimFaultTest, MismatchOfEachFieldIsAnErrorNamingTheOddRank) {
  for (const char* field : {"op", "dtype", "count"}) {
    SimWorld world(with_faults(4, std::string("mismatch:3@1:") + field));
    auto errors =
        world.run_collect([&](int r) { three_all_reduces(world, r); });
    for (int r = 0; r < 4; ++r) {
      const std::string m = what(errors[r]);
      EXPECT_NE(m.find("mismatched collective #1"), std::string::npos) << m;
      EXPECT_NE(m.find(": rank 3 called "), std::string::npos) << m;
      EXPECT_NE(m.find("but ranks 0, 1, 2 called all_reduce(sum, float32 x "
                       "16) in phase step"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find(std::string("injected fault mismatch:3@1:") + field),
                std::string::npos)
          << m;
    }
  }
}

// Found by the swarm property: the same injected mismatch on every rank is
// no mismatch, and the collective must move the real buffers, not the
// described ones (which would write past them).
TEST(SimFaultTest, AMismatchEveryRankSharesMovesTheRealBuffers) {
  for (const char* field : {"op", "dtype", "count"}) {
    const std::string f = field;
    SimWorld world(with_faults(
        3, "mismatch:0@0:" + f + ",mismatch:1@0:" + f + ",mismatch:2@0:" + f));
    std::vector<std::vector<float>> out(3);
    world.run([&](int r) {
      std::vector<float> x(5, static_cast<float>(r + 1));
      world.comm(r).all_reduce(Buffer::of(x.data(), x.size()), {});
      out[r] = x;
    });
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(out[r], std::vector<float>(5, 6.0f)) << field;
  }
}

TEST(SimFaultTest, StragglerWithinTheTimeoutOnlyCostsTime) {
  SimOptions o = with_faults(2, "straggle:1@1x2:0.25,timeout:1");
  SimWorld world(o);
  std::vector<float> out(2);
  world.run([&](int r) {
    three_all_reduces(world, r);
    float x = static_cast<float>(r + 1);
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
    out[r] = x;
  });
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], 3.0f);
  const double ar =
      o.cost.collective_seconds(CollectiveKind::kAllReduce, 64, 2);
  const double ar1 =
      o.cost.collective_seconds(CollectiveKind::kAllReduce, 4, 2);
  // Collectives 1 and 2 each start 0.25 s late: rank 1 arrives late.
  for (int r = 0; r < 2; ++r) {
    EXPECT_DOUBLE_EQ(world.clock(r).now_s, 3 * ar + ar1 + 0.5) << r;
    EXPECT_DOUBLE_EQ(world.clock(r).comm_s, 3 * ar + ar1) << r;
  }
  // Rank 0 waited for the straggler: that wait is exposed, not comm time.
  EXPECT_DOUBLE_EQ(world.clock(0).exposed_comm_s, 3 * ar + ar1 + 0.5);
}

TEST(SimFaultTest, StragglerBeyondTheTimeoutTimesOutEveryRank) {
  SimWorld world(with_faults(3, "straggle:2@0:3,timeout:2"));
  auto errors = world.run_collect([&](int r) { three_all_reduces(world, r); });
  for (int r = 0; r < 3; ++r) {
    const std::string m = what(errors[r]);
    EXPECT_NE(m.find("collective #0 (all_reduce, phase step) timed out at "
                     "t=2 s: rank 2 arrived at t=3 s, 3 virtual seconds "
                     "after rank 0 (a straggler)"),
              std::string::npos)
        << m;
  }
  EXPECT_DOUBLE_EQ(world.clock(0).now_s, 2.0);
  EXPECT_DOUBLE_EQ(world.clock(2).now_s, 3.0);
}

// The faults named in an error come in rank order, whatever order the
// ranks arrived in (found by the harness swarm: a message that changed from
// run to run). Here rank 2 arrives before rank 0 as a rule.
TEST(SimFaultTest, AnErrorListsTheInjectedFaultsInRankOrder) {
  SimWorld world(with_faults(3, "mismatch:2@0:count,mismatch:0@0:op"));
  std::atomic<bool> rank2_called{false};
  auto errors = world.run_collect([&](int r) {
    if (r == 2) rank2_called = true;
    if (r == 0)
      while (!rank2_called) std::this_thread::yield();
    three_all_reduces(world, r);
  });
  for (int r = 0; r < 3; ++r) {
    const std::string m = what(errors[r]);
    EXPECT_NE(m.find("; injected fault mismatch:0@0:op; injected fault "
                     "mismatch:2@0:count"),
              std::string::npos)
        << m;
  }
}

TEST(SimFaultTest, FaultsBeyondTheRunNeverFire) {
  SimWorld world(with_faults(2, "crash:0@3,lost:1@10"));
  EXPECT_NO_THROW(world.run([&](int r) { three_all_reduces(world, r); }));
}

TEST(SimFaultTest, AFaultyRunIsReproducedExactly) {
  auto once = [] {
    SimWorld world(with_faults(4, "straggle:0@0:0.5,mismatch:1@2:count"));
    auto errors =
        world.run_collect([&](int r) { three_all_reduces(world, r); });
    std::string trace;
    for (int r = 0; r < 4; ++r) {
      std::ostringstream os;
      os << what(errors[r]) << " now=" << world.clock(r).now_s
         << " exposed=" << world.clock(r).exposed_comm_s << "\n";
      trace += os.str();
    }
    return trace;
  };
  const std::string first = once();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(once(), first);
}

TEST(SimFaultTest, FaultsThatDoNotFitTheWorldAreRejected) {
  EXPECT_THROW(SimWorld(with_faults(2, "crash:2@0")), UsageError);
  EXPECT_THROW(SimWorld(with_faults(1, "mismatch:0@0:op")), UsageError);
}

TEST(SimClockTest, BlockingCollectivesChargeTheClosedFormCosts) {
  SimOptions o;
  o.world_size = 4;
  SimWorld world(o);
  world.run([&](int r) {
    std::vector<float> g(1024), part(256);
    world.compute(r, 0.001 * (r + 1));  // ranks ready at different times
    world.comm(r).all_reduce(Buffer::of(g.data(), 1024), {});
    world.comm(r).reduce_scatter(Buffer::of(g.data(), 1024),
                                 Buffer::of(part.data(), 256), {});
    world.comm(r).all_gather(Buffer::of(part.data(), 256),
                             Buffer::of(g.data(), 1024), {});
    world.comm(r).broadcast(Buffer::of(g.data(), 1024), {});
  });
  const CostModel& c = o.cost;
  const double total =
      c.collective_seconds(CollectiveKind::kAllReduce, 4096, 4) +
      c.collective_seconds(CollectiveKind::kReduceScatter, 4096, 4) +
      c.collective_seconds(CollectiveKind::kAllGather, 4096, 4) +
      c.collective_seconds(CollectiveKind::kBroadcast, 4096, 4);
  for (int r = 0; r < 4; ++r) {
    const SimClock k = world.clock(r);
    EXPECT_NEAR(k.now_s, 0.004 + total, 1e-15) << r;  // the last rank's start
    EXPECT_NEAR(k.comm_s, total, 1e-15) << r;
    // Rank r waited 0.004 - 0.001 (r+1) for the last rank, plus the rest.
    EXPECT_NEAR(k.exposed_comm_s, 0.004 - 0.001 * (r + 1) + total, 1e-15) << r;
    ASSERT_EQ(world.timeline(r).size(), 4u);
    EXPECT_EQ(world.timeline(r)[2].kind, CollectiveKind::kAllGather);
    EXPECT_EQ(world.timeline(r)[2].bytes, 4096u);
  }
}

TEST(SimClockTest, ComputeBetweenAnAsyncLaunchAndItsWaitHidesTheCollective) {
  SimOptions o;
  o.world_size = 2;
  const double rs =
      o.cost.collective_seconds(CollectiveKind::kReduceScatter, 1 << 22, 2);
  for (double work : {0.25 * rs, 4.0 * rs}) {
    SimWorld world(o);
    world.run([&](int r) {
      std::vector<float> g(1 << 20), part(1 << 19);
      auto w = world.comm(r).reduce_scatter_async(
          Buffer::of(g.data(), g.size()), Buffer::of(part.data(), part.size()),
          {ReduceOp::kSum, "backward"});
      world.compute(r, work);
      w->wait();
      w->wait();  // a second wait changes nothing
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_DOUBLE_EQ(world.clock(r).now_s, std::max(work, rs)) << work;
      EXPECT_DOUBLE_EQ(world.clock(r).exposed_comm_s, std::max(0.0, rs - work))
          << work;
      EXPECT_DOUBLE_EQ(world.clock(r).comm_s, rs);
      EXPECT_TRUE(world.timeline(r)[0].async);
    }
  }
}

TEST(SimClockTest, DescribePrintsEveryOption) {
  SimWorld world(with_faults(2, "crash:1@4"));
  const std::string d = world.describe();
  EXPECT_NE(d.find("seed=7 world=2 faults=crash:1@4,timeout:60 cost: "
                   "alpha_s="),
            std::string::npos)
      << d;
}

}  // namespace
}  // namespace zerostep
