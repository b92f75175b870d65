#include "comm/peer_probe.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/errors.h"

namespace zerostep {
namespace {

// A socket on 127.0.0.1 that listens (so the kernel accepts connections
// into its backlog) but that no thread ever serves: a stopped process's.
// Closing it leaves a port nobody listens on: a dead process's.
class SilentSocket {
 public:
  SilentSocket() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), len), 0);
    EXPECT_EQ(listen(fd_, 8), 0);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentSocket() { close_now(); }
  void close_now() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

ProbeTarget target(int rank, int port, uint64_t identity) {
  ProbeTarget t;
  t.rank = rank;
  t.host = "h" + std::to_string(rank);
  t.address = "127.0.0.1";
  t.port = port;
  t.identity = identity;
  t.pid = 100 + rank;
  return t;
}

TEST(PeerProbeTest, TellsTheAliveTheGoneAndTheStoppedApart) {
  ProbeListener alive("127.0.0.1", 0xabc);
  ProbeListener impostor("127.0.0.1", 0xdef);
  SilentSocket stopped;
  SilentSocket dead;
  dead.close_now();
  const std::vector<ProbeReply> r =
      probe({target(1, alive.port(), 0xabc), target(2, stopped.port(), 7),
             target(3, dead.port(), 8), target(4, impostor.port(), 9)},
            std::chrono::milliseconds(300));
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].outcome, ProbeOutcome::kAnswered) << r[0].detail;
  EXPECT_EQ(r[1].outcome, ProbeOutcome::kNotAnswering) << r[1].detail;
  EXPECT_EQ(r[2].outcome, ProbeOutcome::kGone) << r[2].detail;
  EXPECT_EQ(r[3].outcome, ProbeOutcome::kGone) << r[3].detail;
  const std::string d = describe_unanswered(r);
  EXPECT_EQ(d.find("rank 1"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 2 (host h2, 127.0.0.1, pid 102): not answering (its "
                   "host accepted the connection but the process did not "
                   "answer within 300 ms"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("rank 3 (host h3, 127.0.0.1, pid 103): gone (Connection "
                   "refused)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("rank 4 (host h4, 127.0.0.1, pid 104): gone (another "
                   "process answers on its probe port)"),
            std::string::npos)
      << d;
}

TEST(PeerProbeTest, EveryAnswerIsNothingToReport) {
  ProbeListener a("127.0.0.1", 1), b("127.0.0.1", 2);
  const auto r = probe({target(0, a.port(), 1), target(1, b.port(), 2)},
                       std::chrono::milliseconds(2000));
  EXPECT_EQ(describe_unanswered(r), "");
  EXPECT_TRUE(probe({}, std::chrono::milliseconds(10)).empty());
}

// Issue 42's ranks bound 127.0.0.1 on two hosts: probing a loopback
// address of another host reaches this host's own, so such a peer is
// unreachable without a probe; in this rank's own network it is probed.
TEST(PeerProbeTest, ALoopbackAddressInAnotherNetworkIsNotProbed) {
  ProbeListener here("127.0.0.1", 0xabc);
  ProbeTarget elsewhere = target(1, here.port(), 0xabc);
  elsewhere.network = "another host's network";
  ProbeTarget mine = target(2, here.port(), 0xabc);
  mine.network = network_id();
  const std::vector<ProbeReply> r = probe_from(network_id(), {elsewhere, mine},
                                               std::chrono::milliseconds(2000));
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].target.rank, 1);
  EXPECT_EQ(r[0].outcome, ProbeOutcome::kUnreachable) << r[0].detail;
  EXPECT_EQ(describe_unanswered(r),
            "rank 1 (host h1, 127.0.0.1, pid 101): unreachable (it binds a "
            "loopback address on another host (or network namespace), which "
            "no other host reaches)");
  EXPECT_EQ(r[1].target.rank, 2);
  EXPECT_EQ(r[1].outcome, ProbeOutcome::kAnswered) << r[1].detail;
}

TEST(PeerProbeTest, TheNetworkIdNamesThisNetworkNamespace) {
  const std::string id = network_id();
  EXPECT_EQ(id, network_id());
  EXPECT_NE(id.find("/net:["), std::string::npos) << id;
}

TEST(PeerProbeTest, AListenerNeedsAnAddressOfThisHost) {
  EXPECT_THROW(ProbeListener("not-an-address", 1), IoError);
  EXPECT_THROW(ProbeListener("192.0.2.77", 1), IoError);  // TEST-NET-1
}

}  // namespace
}  // namespace zerostep
