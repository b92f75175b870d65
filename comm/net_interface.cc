#include "comm/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "common/errors.h"

namespace zerostep {
namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf,
              sizeof(buf));
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr,
              buf, sizeof(buf));
  return buf;
}

// "lo 127.0.0.1, eth0 10.0.0.5 (down)": for error messages.
std::string list_interfaces(const std::vector<InterfaceAddress>& all) {
  std::string out;
  for (const InterfaceAddress& i : all) {
    if (i.link_local) continue;
    if (!out.empty()) out += ", ";
    out += i.name + " " + i.address + (i.up ? "" : " (down)");
  }
  return out.empty() ? "none with an address" : out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The address to bind on interface `name`: its first IPv4 address, else its
// first IPv6 address that is not link-local; nullptr if none or down.
const InterfaceAddress* usable_address(const std::vector<InterfaceAddress>& all,
                                       const std::string& name) {
  const InterfaceAddress* v6 = nullptr;
  for (const InterfaceAddress& i : all) {
    if (i.name != name || !i.up || i.link_local) continue;
    if (!i.ipv6) return &i;
    if (v6 == nullptr) v6 = &i;
  }
  return v6;
}

std::string owner_of(const std::vector<InterfaceAddress>& all,
                     const std::string& address) {
  for (const InterfaceAddress& i : all)
    if (i.address == address) return i.name;
  return "";
}

// Rule 2: the source address of the route to MASTER_ADDR.
BindAddress routed(const std::string& master_addr, int world_size,
                   int local_world_size, const std::string& fix_variable,
                   const HostNetwork& net) {
  const RouteSource r = net.route(master_addr);
  if (!r.error.empty())
    throw UsageError(
        "MASTER_ADDR=" + master_addr + ": " + r.error +
        ", so the interface that reaches it cannot be found. Fix: set "
        "MASTER_ADDR to rank 0's host as this host reaches it, or name the "
        "interface with " +
        fix_variable);
  BindAddress b;
  b.address = r.source;
  b.interface = owner_of(net.interfaces, r.source);
  if (is_loopback_address(r.resolved)) {
    if (local_world_size > 0 && local_world_size < world_size)
      throw UsageError(
          "MASTER_ADDR=" + master_addr +
          (r.resolved != master_addr ? " (" + r.resolved + " on this host)"
                                     : std::string()) +
          " is a loopback address, but the world spans hosts (WORLD_SIZE=" +
          std::to_string(world_size) +
          " > LOCAL_WORLD_SIZE=" + std::to_string(local_world_size) +
          "): no other host could reach this rank at " + r.source +
          ". Fix: set MASTER_ADDR to rank 0's address on the network the "
          "hosts share (a host name that /etc/hosts maps to 127.0.1.1 does "
          "not do), or name the interface with " +
          fix_variable);
    b.why = "MASTER_ADDR=" + master_addr + " is local (loopback)";
  } else {
    b.why =
        "the address this host reaches MASTER_ADDR=" + master_addr + " from";
  }
  return b;
}

}  // namespace

bool is_loopback_address(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1)
    return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

std::vector<InterfaceAddress> host_interfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    throw IoError(std::string("cannot list this host's network interfaces "
                              "(getifaddrs): ") +
                  std::strerror(errno));
  std::vector<InterfaceAddress> out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    InterfaceAddress a;
    a.name = i->ifa_name;
    a.address = numeric(i->ifa_addr);
    a.ipv6 = family == AF_INET6;
    a.up = (i->ifa_flags & IFF_UP) != 0 && (i->ifa_flags & IFF_RUNNING) != 0;
    a.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    a.link_local =
        a.ipv6 && IN6_IS_ADDR_LINKLOCAL(
                      &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    out.push_back(a);
  }
  freeifaddrs(list);
  return out;
}

RouteSource route_source(const std::string& host) {
  RouteSource out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  // IPv4 first, as Gloo and c10d's store connect.
  hints.ai_family = AF_INET;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  if (rc != 0) {
    hints.ai_family = AF_UNSPEC;
    rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  }
  if (rc != 0) {
    out.error = std::string("cannot resolve it (") + gai_strerror(rc) + ")";
    return out;
  }
  out.resolved = numeric(res->ai_addr);
  // A UDP socket's connect() only picks the route: nothing is sent.
  const int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    out.error = std::string("socket(): ") + std::strerror(errno);
  } else if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    out.error = "this host has no route to " + out.resolved + " (" +
                std::strerror(errno) + ")";
  } else {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0)
      out.error = std::string("getsockname(): ") + std::strerror(errno);
    else
      out.source = numeric(reinterpret_cast<sockaddr*>(&local));
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

HostNetwork HostNetwork::of_this_host() {
  HostNetwork n;
  n.interfaces = host_interfaces();
  n.route = route_source;
  return n;
}

std::vector<BindAddress> choose_gloo_addresses(const char* ifname,
                                               const std::string& master_addr,
                                               int world_size,
                                               int local_world_size,
                                               const HostNetwork& net) {
  if (ifname == nullptr || *ifname == '\0')
    return {routed(master_addr, world_size, local_world_size,
                   "GLOO_SOCKET_IFNAME", net)};
  const std::vector<std::string> names = split(ifname, ',');
  if (names.empty())
    throw UsageError(std::string("GLOO_SOCKET_IFNAME=") + ifname +
                     ": names no interface. Fix: name one or more of this "
                     "host's interfaces, comma-separated (" +
                     list_interfaces(net.interfaces) +
                     "), or unset it to use the one that routes to "
                     "MASTER_ADDR");
  std::vector<BindAddress> out;
  for (const std::string& name : names) {
    const InterfaceAddress* a = usable_address(net.interfaces, name);
    if (a == nullptr) {
      bool exists = false;
      for (const InterfaceAddress& i : net.interfaces)
        exists = exists || i.name == name;
      throw UsageError(
          std::string("GLOO_SOCKET_IFNAME=") + ifname + ": interface '" + name +
          "' " +
          (exists ? "is down or holds no usable address"
                  : "does not exist on this host") +
          " (its interfaces: " + list_interfaces(net.interfaces) +
          "). Fix: name an interface that is up and reaches the other "
          "hosts, or unset GLOO_SOCKET_IFNAME to use the one that routes to "
          "MASTER_ADDR");
    }
    out.push_back(
        {a->address, name, std::string("GLOO_SOCKET_IFNAME=") + ifname});
  }
  return out;
}

bool nccl_ifname_matches(const std::string& spec, const std::string& name) {
  std::string s = spec;
  const bool exclude = !s.empty() && s[0] == '^';
  if (exclude) s.erase(0, 1);
  const bool exact = !s.empty() && s[0] == '=';
  if (exact) s.erase(0, 1);
  bool listed = false;
  for (const std::string& p : split(s, ','))
    listed = listed || (exact ? name == p : name.rfind(p, 0) == 0);
  return exclude ? !listed : listed;
}

NcclSocketChoice choose_nccl_socket_ifname(const char* ifname,
                                           const std::string& master_addr,
                                           int world_size, int local_world_size,
                                           const HostNetwork& net) {
  NcclSocketChoice c;
  if (ifname != nullptr && *ifname != '\0') {
    c.ifname = ifname;
    c.set_by_user = true;
    std::string chosen;
    for (const InterfaceAddress& i : net.interfaces)
      if (i.up && !i.link_local && nccl_ifname_matches(ifname, i.name)) {
        if (chosen.empty()) c.address = i.address;
        chosen += (chosen.empty() ? "" : ", ") + i.name;
      }
    if (chosen.empty())
      throw UsageError(
          std::string("NCCL_SOCKET_IFNAME=") + ifname +
          ": no interface of this host that is up and holds an address "
          "matches it (NCCL reads a comma-separated list of name prefixes; "
          "'=' before the list means exact names, '^' excludes; this "
          "host's interfaces: " +
          list_interfaces(net.interfaces) +
          "). Fix: name the interface that reaches the other hosts, or "
          "unset NCCL_SOCKET_IFNAME to use the one that routes to "
          "MASTER_ADDR");
    c.why = std::string("NCCL_SOCKET_IFNAME=") + ifname + " (matches " +
            chosen + ")";
    return c;
  }
  const BindAddress b = routed(master_addr, world_size, local_world_size,
                               "NCCL_SOCKET_IFNAME", net);
  if (b.interface.empty())
    throw UsageError("MASTER_ADDR=" + master_addr +
                     ": this host reaches it "
                     "from " +
                     b.address +
                     ", which no interface holds (its interfaces: " +
                     list_interfaces(net.interfaces) +
                     "). Fix: set NCCL_SOCKET_IFNAME to the interface that "
                     "reaches the other hosts");
  c.ifname = "=" + b.interface;
  c.address = b.address;
  c.why = b.why;
  return c;
}

}  // namespace zerostep
