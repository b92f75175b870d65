// NodeLink on loopback: the launchers of several nodes as threads of this
// process (Note [Launchers of several nodes]).
#include "tools/node_link.h"

#include <gtest/gtest.h>

#include <future>
#include <random>
#include <thread>

#include "common/errors.h"

namespace zerostep {
namespace {

// A port below the ephemeral range, different on every call.
int test_port() {
  static std::mt19937 rng(std::random_device{}());
  return std::uniform_int_distribution<int>(20000, 30000)(rng);
}

NodeLinkOptions node(int rank, int nnodes, int port) {
  NodeLinkOptions o;
  o.nnodes = nnodes;
  o.node_rank = rank;
  o.nproc = 2;
  o.master_addr = "127.0.0.1";
  o.port = port;
  o.join_timeout = std::chrono::seconds(20);
  o.node_timeout = std::chrono::seconds(20);
  return o;
}

// Services `link` until `done()` (or, without it, until a failure
// elsewhere is heard of), for at most 10 s; returns the first remote
// failure.
RemoteFailure service_until(NodeLink& link,
                            const std::function<bool()>& done = nullptr) {
  RemoteFailure first;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    const RemoteFailure f = link.service();
    if (f.node >= 0 && first.node < 0) first = f;
    if (done ? done() : first.node >= 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return first;
}

std::pair<std::unique_ptr<NodeLink>, std::unique_ptr<NodeLink>> join_two(
    int port,
    std::chrono::milliseconds node_timeout = std::chrono::seconds(20)) {
  auto o0 = node(0, 2, port), o1 = node(1, 2, port);
  o0.node_timeout = o1.node_timeout = node_timeout;
  auto other =
      std::async(std::launch::async, [&] { return NodeLink::join(o1); });
  auto zero = NodeLink::join(o0);
  return {std::move(zero), other.get()};
}

TEST(NodeLinkTest, AFailureOnOneNodeReachesTheOthersNamingIt) {
  const int port = test_port();
  auto o0 = node(0, 3, port), o1 = node(1, 3, port), o2 = node(2, 3, port);
  auto f1 = std::async(std::launch::async, [&] { return NodeLink::join(o1); });
  auto f2 = std::async(std::launch::async, [&] { return NodeLink::join(o2); });
  auto n0 = NodeLink::join(o0);
  auto n1 = f1.get(), n2 = f2.get();
  n2->report("rank 5 exited with status 3");
  const RemoteFailure at0 = service_until(*n0), at1 = service_until(*n1);
  // Node 0 heard it from node 2, node 1 from node 0's stop.
  EXPECT_EQ(at0.node, 2);
  EXPECT_EQ(at0.description, "rank 5 exited with status 3");
  EXPECT_NE(at0.host.find("node 2 (host "), std::string::npos) << at0.host;
  EXPECT_NE(at0.host.find(", 127.0.0.1)"), std::string::npos) << at0.host;
  EXPECT_EQ(at1.node, 2);
  EXPECT_EQ(at1.host, at0.host);
  EXPECT_EQ(at1.description, at0.description);
  // Once every node reported, node 0 ends the job everywhere as failed.
  n1->report("rank 2 was killed by signal 15 (Terminated)");
  n0->report("");
  service_until(*n0, [&] { return n0->settled(); });
  service_until(*n1, [&] { return n1->settled(); });
  service_until(*n2, [&] { return n2->settled(); });
  for (NodeLink* n : {n0.get(), n1.get(), n2.get()}) {
    EXPECT_TRUE(n->settled());
    EXPECT_EQ(n->job_failure(), at0.host + ": rank 5 exited with status 3");
  }
}

TEST(NodeLinkTest, EveryNodeDoneEndsTheJobOk) {
  auto [n0, n1] = join_two(test_port());
  n1->report("");
  n0->report("");
  service_until(*n0, [&] { return n0->settled(); });
  const RemoteFailure f = service_until(*n1, [&] { return n1->settled(); });
  EXPECT_EQ(f.node, -1);
  EXPECT_TRUE(n0->settled() && n1->settled());
  EXPECT_EQ(n0->job_failure(), "");
  EXPECT_EQ(n1->job_failure(), "");
}

TEST(NodeLinkTest, ALauncherThatGoesAwayIsANodeFailure) {
  auto [n0, n1] = join_two(test_port());
  n1.reset();  // its connection closes, as when the process is killed
  const RemoteFailure f = service_until(*n0);
  EXPECT_EQ(f.node, 1);
  EXPECT_EQ(f.description, "its launcher is gone (its connection closed)");
  // And node 0 going away fails the other nodes.
  auto [m0, m1] = join_two(test_port());
  m0.reset();
  const RemoteFailure g = service_until(*m1, [&] { return m1->settled(); });
  EXPECT_EQ(g.node, 0);
  EXPECT_TRUE(m1->settled());
  EXPECT_NE(m1->job_failure().find("node 0 (host "), std::string::npos);
}

TEST(NodeLinkTest, ASilentNodeIsLostAfterTheNodeTimeout) {
  auto [n0, n1] = join_two(test_port(), std::chrono::milliseconds(1500));
  // n1 is never serviced: no pings from it, as from a stopped host.
  const RemoteFailure f = service_until(*n0);
  EXPECT_EQ(f.node, 1);
  EXPECT_NE(f.description.find("nothing heard for 1 s"), std::string::npos)
      << f.description;
}

TEST(NodeLinkTest, NodesThatDisagreeAreRefusedOnBothSides) {
  const int port = test_port();
  auto o0 = node(0, 2, port), o1 = node(1, 3, port);
  auto other = std::async(std::launch::async, [&] {
    try {
      NodeLink::join(o1);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("joined");
  });
  try {
    NodeLink::join(o0);
    ADD_FAILURE() << "joined";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "with --node-rank=1 has --nnodes=3, node 0 has --nnodes=2"),
              std::string::npos)
        << e.what();
  }
  const std::string e1 = other.get();
  EXPECT_EQ(e1.rfind("node 0's launcher refused this node: ", 0), 0u) << e1;
}

TEST(NodeLinkTest, NodesThatNeverJoinAreNamed) {
  auto o0 = node(0, 3, test_port());
  o0.join_timeout = std::chrono::milliseconds(300);
  try {
    NodeLink::join(o0);
    ADD_FAILURE() << "joined";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "for the launchers of nodes 1 and 2 of 3 to join at port"),
              std::string::npos)
        << e.what();
  }
  auto o1 = node(1, 2, test_port());
  o1.join_timeout = std::chrono::milliseconds(300);
  try {
    NodeLink::join(o1);
    ADD_FAILURE() << "joined";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "node 1 could not reach node 0's launcher at 127.0.0.1:"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace zerostep
