// Where a rank's transport binds so that the ranks of other hosts can reach
// it (Note [Binding where the other hosts can reach]), and the checks of
// the variables users name interfaces with.
//
// Note [Binding where the other hosts can reach]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each rank advertises one address to every other rank (Gloo's pairs
// connect to it). It follows the conventions of PyTorch users:
//   1. GLOO_SOCKET_IFNAME names the interface(s), comma-separated (several:
//      one Gloo device each); each must exist, be up and hold an address,
//      else UsageError naming the variable, the value, this host's
//      interfaces and the fix.
//   2. Otherwise the address this host sends from to reach MASTER_ADDR (the
//      kernel's route: the interface that reaches the other hosts is the one
//      that reaches the master). That is a loopback address only when
//      MASTER_ADDR is local (127.0.0.1, localhost), and then the world must
//      fit on this host: where LOCAL_WORLD_SIZE says it does not, a loopback
//      MASTER_ADDR (often a host name that /etc/hosts maps to 127.0.1.1) is
//      a UsageError, since no other host could reach this rank.
// NCCL reads its own NCCL_SOCKET_IFNAME (prefixes; '=' exact names; '^'
// excludes); where it is set, it is checked against this host's
// interfaces with NCCL's rules and left as it is; where it is not, the
// nccl backend sets it to the interface of rule 2 ("=name"), so that NCCL's
// bootstrap binds there too.
//
// Thread safety: the functions that take the facts as arguments are pure;
// host_interfaces() and route_source() ask the kernel.
#ifndef ZEROSTEP_COMM_NET_INTERFACE_H_
#define ZEROSTEP_COMM_NET_INTERFACE_H_

#include <functional>
#include <string>
#include <vector>

namespace zerostep {

// One address of one interface of this host.
struct InterfaceAddress {
  std::string name;     // "eth0"
  std::string address;  // numeric: "10.0.0.5", "fd00::5"
  bool ipv6 = false;
  bool up = false;
  bool loopback = false;
  bool link_local = false;  // fe80::/10 (needs a scope; never chosen)
};

// Every IPv4 and IPv6 address of every interface (getifaddrs). IoError if
// the kernel cannot list them.
std::vector<InterfaceAddress> host_interfaces();

// The source address the kernel picks to reach `host` (a numeric address
// or a name, resolved IPv4 first): `source` set, or `error` saying why not
// (unknown name, no route).
struct RouteSource {
  std::string source;
  std::string resolved;  // the address `host` resolved to
  std::string error;
};
RouteSource route_source(const std::string& host);

struct BindAddress {
  std::string address;    // numeric, bound by the transport
  std::string interface;  // the interface holding it ("" if none does)
  std::string why;        // for the log: which rule chose it
};

// The facts the choice depends on, so that tests can give their own.
struct HostNetwork {
  std::vector<InterfaceAddress> interfaces;
  std::function<RouteSource(const std::string& host)> route;
  static HostNetwork of_this_host();
};

// Rules 1 and 2 of Note [Binding where the other hosts can reach].
// `ifname` is GLOO_SOCKET_IFNAME's value (nullptr or "" when unset);
// `local_world_size` is LOCAL_WORLD_SIZE (0 when unset). Throws UsageError
// naming GLOO_SOCKET_IFNAME or MASTER_ADDR.
std::vector<BindAddress> choose_gloo_addresses(const char* ifname,
                                               const std::string& master_addr,
                                               int world_size,
                                               int local_world_size,
                                               const HostNetwork& net);

// NCCL_SOCKET_IFNAME: its value where set (checked with NCCL's rules:
// UsageError naming the variable when no interface of this host matches),
// else "=<interface of rule 2>". `address` and `why` are for the log.
struct NcclSocketChoice {
  std::string ifname;  // the value NCCL should read
  bool set_by_user = false;
  std::string address;  // the address NCCL's bootstrap will bind (rule 2)
  std::string why;
};
NcclSocketChoice choose_nccl_socket_ifname(const char* ifname,
                                           const std::string& master_addr,
                                           int world_size, int local_world_size,
                                           const HostNetwork& net);

// Whether NCCL would use interface `name` under NCCL_SOCKET_IFNAME=`spec`.
bool nccl_ifname_matches(const std::string& spec, const std::string& name);

// Whether `address` (numeric) is a loopback address (127.0.0.0/8, ::1).
bool is_loopback_address(const std::string& address);

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_NET_INTERFACE_H_
