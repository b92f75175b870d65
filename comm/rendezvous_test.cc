// The multi-process rendezvous, with its ranks as threads of this process
// on loopback (each Rendezvous takes its TorchrunEnv as an argument).
#include "comm/rendezvous.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "comm/test_ports.h"
#include "common/errors.h"

namespace zerostep {
namespace {

TorchrunEnv env_of(int rank, int world, int port) {
  TorchrunEnv e;
  e.rank = rank;
  e.world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

RendezvousOptions options(std::chrono::milliseconds timeout) {
  RendezvousOptions o;
  o.address = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

std::string comm_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const CommError& e) {
    return e.what();
  }
  return "(no CommError)";
}

TEST(RendezvousTest, EveryRankGetsEveryRanksEntry) {
  const int port = free_loopback_port();
  std::vector<std::future<std::unique_ptr<Rendezvous>>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(std::async(std::launch::async, [=] {
      return std::make_unique<Rendezvous>(env_of(r, 3, port),
                                          options(std::chrono::seconds(30)));
    }));
  std::vector<std::unique_ptr<Rendezvous>> rv;
  for (auto& f : ranks) rv.push_back(f.get());
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(rv[r]->peers().size(), 3u);
    for (int q = 0; q < 3; ++q) {
      EXPECT_EQ(rv[r]->peers()[q].rank, q);
      EXPECT_EQ(rv[r]->peers()[q].address, "127.0.0.1");
      EXPECT_EQ(rv[r]->peers()[q].pid, getpid());
      EXPECT_EQ(rv[r]->peers()[q].network, network_id());
      EXPECT_EQ(rv[r]->peers()[q].port, rv[q]->peers()[q].port);
    }
  }
  // Every peer answers; a rank whose listener is gone is named "gone".
  EXPECT_EQ(rv[0]->unanswered_peers(std::chrono::seconds(5)), "");
  const int gone_port = rv[2]->peers()[2].port;
  rv[2].reset();
  const std::string d = rv[0]->unanswered_peers(std::chrono::seconds(5));
  EXPECT_NE(d.find("rank 2 (host "), std::string::npos) << d;
  EXPECT_NE(d.find("127.0.0.1, pid " + std::to_string(getpid()) +
                   "): gone (Connection refused)"),
            std::string::npos)
      << d << " (port " << gone_port << ")";
  EXPECT_EQ(d.find("rank 1"), std::string::npos) << d;
  EXPECT_NE(rv[0]->diagnosis().find(". Ranks that did not answer a probe: "),
            std::string::npos);
}

TEST(RendezvousTest, RanksThatNeverJoinAreNamedAtTheTimeout) {
  const int port = free_loopback_port();
  auto rank1 = std::async(std::launch::async, [=] {
    return comm_error([&] {
      Rendezvous(env_of(1, 4, port), options(std::chrono::milliseconds(2500)));
    });
  });
  const std::string e0 = comm_error([&] {
    Rendezvous(env_of(0, 4, port), options(std::chrono::milliseconds(2000)));
  });
  EXPECT_EQ(e0.rfind("gloo rendezvous on rank 0 (host ", 0), 0u) << e0;
  EXPECT_NE(e0.find("timed out after 2 s, waiting for ranks 2 and 3 of 4 to "
                    "join rank 0's store at 127.0.0.1:" +
                    std::to_string(port)),
            std::string::npos)
      << e0;
  const std::string e1 = rank1.get();
  EXPECT_NE(e1.find("gloo rendezvous on rank 1"), std::string::npos) << e1;
}

TEST(RendezvousTest, AStoreThatIsNotThereIsNamed) {
  const std::string e = comm_error([&] {
    Rendezvous(env_of(1, 2, free_loopback_port()),
               options(std::chrono::milliseconds(1500)));
  });
  EXPECT_NE(e.find("connecting to rank 0's store at 127.0.0.1:"),
            std::string::npos)
      << e;
}

// Under torchrun's agent store (which outlives the job's attempts) every
// rank connects as a client, and each attempt's keys are its own: a
// restart does not read the last attempt's table.
TEST(RendezvousTest, UnderAnAgentStoreAttemptsDoNotMix) {
  const int port = free_loopback_port();
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = true;
  so.waitWorkers = false;
  c10d::TCPStore agent("127.0.0.1", so);
  for (const char* prefix : {"zerostep/run/0/", "zerostep/run/1/"}) {
    std::vector<std::future<std::unique_ptr<Rendezvous>>> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.push_back(std::async(std::launch::async, [=] {
        TorchrunEnv e = env_of(r, 2, port);
        e.rank0_hosts_store = false;
        e.key_prefix = prefix;
        return std::make_unique<Rendezvous>(e,
                                            options(std::chrono::seconds(30)));
      }));
    auto r0 = ranks[0].get();
    auto r1 = ranks[1].get();
    EXPECT_EQ(r1->peers()[0].port, r0->peers()[0].port) << prefix;
    EXPECT_EQ(r0->unanswered_peers(std::chrono::seconds(5)), "") << prefix;
    EXPECT_EQ(r1->unanswered_peers(std::chrono::seconds(5)), "") << prefix;
  }
}

}  // namespace
}  // namespace zerostep
