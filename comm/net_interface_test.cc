#include "comm/net_interface.h"

#include <gtest/gtest.h>

#include "common/errors.h"

namespace zerostep {
namespace {

// A host with loopback, one up interface on the cluster network, one down
// interface and a link-local IPv6 address; routes as a kernel would give
// them.
HostNetwork fake_host() {
  HostNetwork n;
  n.interfaces = {
      {"lo", "127.0.0.1", false, true, true, false},
      {"eth0", "fe80::1", true, true, false, true},
      {"eth0", "10.77.0.2", false, true, false, false},
      {"eth1", "192.168.9.2", false, false, false, false},
      {"ib0", "fd00::2", true, true, false, false},
  };
  n.route = [](const std::string& host) {
    RouteSource r;
    if (host == "nowhere") {
      r.error = "cannot resolve it (Name or service not known)";
    } else if (host == "10.99.0.1") {
      r.resolved = host;
      r.error = "this host has no route to 10.99.0.1 (Network is unreachable)";
    } else if (host == "127.0.0.1" || host == "localhost") {
      r.resolved = "127.0.0.1";
      r.source = "127.0.0.1";
    } else if (host == "myhost") {  // /etc/hosts: 127.0.1.1 myhost
      r.resolved = "127.0.1.1";
      r.source = "127.0.0.1";
    } else if (host == "10.77.0.2") {  // this host's own address
      r.resolved = host;
      r.source = "10.77.0.2";
    } else {
      r.resolved = host;
      r.source = "10.77.0.2";
    }
    return r;
  };
  return n;
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(NetInterfaceTest, WithoutAVariableTheRouteToTheMasterChooses) {
  const HostNetwork net = fake_host();
  auto b = choose_gloo_addresses(nullptr, "10.77.0.1", 4, 2, net);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].address, "10.77.0.2");
  EXPECT_EQ(b[0].interface, "eth0");
  EXPECT_NE(b[0].why.find("MASTER_ADDR=10.77.0.1"), std::string::npos);
  // The master's own host binds its address, not loopback.
  b = choose_gloo_addresses("", "10.77.0.2", 4, 2, net);
  EXPECT_EQ(b[0].address, "10.77.0.2");
  EXPECT_EQ(b[0].interface, "eth0");
}

TEST(NetInterfaceTest, LoopbackOnlyWhenTheMasterIsLocal) {
  const HostNetwork net = fake_host();
  for (const char* master : {"127.0.0.1", "localhost"}) {
    auto b = choose_gloo_addresses(nullptr, master, 4, 4, net);
    EXPECT_EQ(b[0].address, "127.0.0.1") << master;
    EXPECT_EQ(b[0].interface, "lo") << master;
    // LOCAL_WORLD_SIZE unset: nothing says the world spans hosts.
    EXPECT_EQ(choose_gloo_addresses(nullptr, master, 4, 0, net)[0].address,
              "127.0.0.1");
  }
  // A world across hosts cannot meet on loopback: refused, naming why.
  const std::string e =
      usage_error([&] { choose_gloo_addresses(nullptr, "myhost", 4, 2, net); });
  EXPECT_NE(e.find("MASTER_ADDR=myhost (127.0.1.1 on this host) is a "
                   "loopback address, but the world spans hosts"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("GLOO_SOCKET_IFNAME"), std::string::npos) << e;
}

TEST(NetInterfaceTest, AMasterThatCannotBeReachedIsNamed) {
  const HostNetwork net = fake_host();
  std::string e = usage_error(
      [&] { choose_gloo_addresses(nullptr, "nowhere", 2, 1, net); });
  EXPECT_EQ(e.rfind("MASTER_ADDR=nowhere: cannot resolve it", 0), 0u) << e;
  e = usage_error(
      [&] { choose_gloo_addresses(nullptr, "10.99.0.1", 2, 1, net); });
  EXPECT_NE(e.find("no route to 10.99.0.1"), std::string::npos) << e;
}

TEST(NetInterfaceTest, GlooSocketIfnameNamesTheInterfaces) {
  const HostNetwork net = fake_host();
  auto b = choose_gloo_addresses("eth0", "10.77.0.1", 4, 2, net);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].address, "10.77.0.2");  // IPv4 first, never link-local
  EXPECT_EQ(b[0].why, "GLOO_SOCKET_IFNAME=eth0");
  b = choose_gloo_addresses("ib0,eth0", "10.77.0.1", 4, 2, net);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].address, "fd00::2");
  EXPECT_EQ(b[1].address, "10.77.0.2");
  // The variable wins over the route, loopback included.
  EXPECT_EQ(choose_gloo_addresses("lo", "10.77.0.1", 4, 2, net)[0].address,
            "127.0.0.1");
}

TEST(NetInterfaceTest, AMisconfiguredGlooSocketIfnameIsAClearError) {
  const HostNetwork net = fake_host();
  std::string e = usage_error(
      [&] { choose_gloo_addresses("eth9", "10.77.0.1", 2, 1, net); });
  EXPECT_EQ(e.rfind("GLOO_SOCKET_IFNAME=eth9: interface 'eth9' does not "
                    "exist on this host (its interfaces: lo 127.0.0.1, eth0 "
                    "10.77.0.2, eth1 192.168.9.2 (down), ib0 fd00::2)",
                    0),
            0u)
      << e;
  EXPECT_NE(e.find("Fix:"), std::string::npos) << e;
  e = usage_error(
      [&] { choose_gloo_addresses("eth0,eth1", "10.77.0.1", 2, 1, net); });
  EXPECT_NE(e.find("interface 'eth1' is down or holds no usable address"),
            std::string::npos)
      << e;
  e = usage_error([&] { choose_gloo_addresses(",", "10.77.0.1", 2, 1, net); });
  EXPECT_NE(e.find("GLOO_SOCKET_IFNAME=,: names no interface"),
            std::string::npos)
      << e;
}

TEST(NetInterfaceTest, NcclSocketIfnameFollowsNcclsRules) {
  EXPECT_TRUE(nccl_ifname_matches("eth", "eth0"));
  EXPECT_TRUE(nccl_ifname_matches("ib,eth", "eth1"));
  EXPECT_FALSE(nccl_ifname_matches("=eth", "eth0"));
  EXPECT_TRUE(nccl_ifname_matches("=eth0", "eth0"));
  EXPECT_FALSE(nccl_ifname_matches("^eth", "eth0"));
  EXPECT_TRUE(nccl_ifname_matches("^docker,lo", "eth0"));
  EXPECT_TRUE(nccl_ifname_matches("^=eth", "eth0"));
  EXPECT_FALSE(nccl_ifname_matches("^=eth0", "eth0"));
}

TEST(NetInterfaceTest, NcclKeepsItsVariableAndOtherwiseGetsTheRoutedOne) {
  const HostNetwork net = fake_host();
  NcclSocketChoice c = choose_nccl_socket_ifname("ib", "10.77.0.1", 4, 2, net);
  EXPECT_TRUE(c.set_by_user);
  EXPECT_EQ(c.ifname, "ib");
  EXPECT_EQ(c.address, "fd00::2");
  c = choose_nccl_socket_ifname(nullptr, "10.77.0.1", 4, 2, net);
  EXPECT_FALSE(c.set_by_user);
  EXPECT_EQ(c.ifname, "=eth0");
  EXPECT_EQ(c.address, "10.77.0.2");
  const std::string e = usage_error(
      [&] { choose_nccl_socket_ifname("=eth", "10.77.0.1", 4, 2, net); });
  EXPECT_EQ(e.rfind("NCCL_SOCKET_IFNAME==eth: no interface of this host", 0),
            0u)
      << e;
  // eth1 is down: matching it alone is no use.
  EXPECT_NE(usage_error([&] {
              choose_nccl_socket_ifname("eth1", "10.77.0.1", 4, 2, net);
            }).find("NCCL_SOCKET_IFNAME=eth1"),
            std::string::npos);
  EXPECT_NE(usage_error([&] {
              choose_nccl_socket_ifname(nullptr, "myhost", 4, 2, net);
            }).find("NCCL_SOCKET_IFNAME"),
            std::string::npos);
}

// On this machine: loopback is found, and the route to 127.0.0.1 comes
// from it.
TEST(NetInterfaceTest, ThisHost) {
  const HostNetwork net = HostNetwork::of_this_host();
  bool lo = false;
  for (const InterfaceAddress& i : net.interfaces)
    lo = lo || (i.loopback && i.address == "127.0.0.1");
  EXPECT_TRUE(lo);
  const RouteSource r = route_source("127.0.0.1");
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.source, "127.0.0.1");
  auto b = choose_gloo_addresses(nullptr, "127.0.0.1", 2, 2, net);
  EXPECT_EQ(b[0].address, "127.0.0.1");
  EXPECT_EQ(b[0].interface, "lo");
  EXPECT_TRUE(is_loopback_address("127.0.1.1"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
  EXPECT_FALSE(is_loopback_address("not an address"));
}

}  // namespace
}  // namespace zerostep
