#include "tools/tinker/access.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <utility>

#include "common/cli.h"
#include "common/errors.h"

namespace zerostep {
namespace tinker {
namespace {

bool value_of(const std::string& arg, const char* name, std::string* out) {
  const std::string p = std::string("--") + name + "=";
  if (arg.rfind(p, 0) != 0) return false;
  *out = arg.substr(p.size());
  return true;
}

bool loopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const uint32_t ip =
        ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr);
    return (ip >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&ip)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&ip)) return ip.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace

bool parse_access_flag(const std::string& a, AccessFlags* f) {
  std::string v;
  if (a == "--allow-unauthenticated") {
    f->allow_unauthenticated = true;
  } else if (value_of(a, "api-keys", &v)) {
    if (v.empty())
      throw UsageError("--api-keys=: give the keys file, e.g. "
                       "--api-keys=/etc/zerostep/keys");
    f->api_keys_file = v;
  } else if (value_of(a, "api-keys-reload-s", &v)) {
    f->api_keys_reload_s = parse_double("--api-keys-reload-s", v, 0, 3600, 2.0);
  } else if (value_of(a, "tenant-max-models", &v)) {
    f->quotas.max_models = parse_int("--tenant-max-models", v, 0, 1 << 20, 4);
  } else if (value_of(a, "tenant-max-bytes", &v)) {
    f->quotas.max_bytes =
        parse_bytes("--tenant-max-bytes", v, 0, UINT64_MAX, "20G");
  } else if (value_of(a, "max-connections", &v)) {
    f->limits.max_connections =
        static_cast<int>(parse_int("--max-connections", v, 1, 1 << 20, 256));
  } else if (value_of(a, "max-connections-per-client", &v)) {
    f->limits.max_connections_per_client = static_cast<int>(
        parse_int("--max-connections-per-client", v, 1, 1 << 20, 64));
  } else if (value_of(a, "max-body-bytes", &v)) {
    f->limits.max_body_bytes =
        parse_bytes("--max-body-bytes", v, 1024, 1ULL << 40, "64M");
  } else if (value_of(a, "header-timeout-s", &v)) {
    f->limits.header_timeout_s =
        parse_double("--header-timeout-s", v, 0.01, 3600, 10.0);
  } else if (value_of(a, "read-timeout-s", &v)) {
    f->limits.read_timeout_s =
        parse_double("--read-timeout-s", v, 0.01, 86400, 60.0);
  } else if (value_of(a, "idle-timeout-s", &v)) {
    f->limits.idle_timeout_s =
        parse_double("--idle-timeout-s", v, 0.01, 3600, 5.0);
  } else {
    return false;
  }
  return true;
}

std::string access_flags_usage() {
  return "[--api-keys=FILE] [--api-keys-reload-s=T] "
         "[--allow-unauthenticated] [--tenant-max-models=N] "
         "[--tenant-max-bytes=B] [--max-connections=N] "
         "[--max-connections-per-client=N] [--max-body-bytes=B] "
         "[--header-timeout-s=T] [--read-timeout-s=T] [--idle-timeout-s=T]";
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr)
    return false;
  bool all = true;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next)
    all = all && loopback(a->ai_addr);
  freeaddrinfo(res);
  return all;
}

Access make_access(const AccessFlags& f, const std::string& host,
                   const char* env_keys,
                   std::function<void(const std::string&)> log) {
  const bool env = env_keys != nullptr && env_keys[0] != '\0';
  const bool keyed = !f.api_keys_file.empty() || env;
  if (!f.api_keys_file.empty() && env)
    throw UsageError(
        "--api-keys and ZEROSTEP_API_KEYS are both set. Fix: give the keys "
        "one way (the file can be changed without a restart)");
  if (keyed && f.allow_unauthenticated)
    throw UsageError(std::string("--allow-unauthenticated with ") +
                     (env ? "ZEROSTEP_API_KEYS" : "--api-keys") +
                     ": keys are checked whenever they are given. Fix: drop "
                     "one of them");
  const bool local = is_loopback_host(host);
  if (!keyed && !local && !f.allow_unauthenticated)
    throw UsageError(
        "--host=" + host +
        " serves beyond this machine, and no API keys are set: anyone who "
        "can reach the port could create, train, load and overwrite every "
        "model. Fix: give --api-keys=FILE (or ZEROSTEP_API_KEYS), or pass "
        "--allow-unauthenticated to serve without keys anyway");
  Access out;
  out.http.limits = f.limits;
  out.http.anonymous = f.quotas;
  out.http.anonymous.tenant = kDefaultTenant;
  out.http.log = log;
  if (keyed) {
    ApiKeys::Options o;
    o.file = f.api_keys_file;
    if (env) o.text = env_keys;
    o.reload_s = f.api_keys_reload_s;
    o.defaults = f.quotas;
    o.log = log;
    out.keys = std::make_unique<ApiKeys>(std::move(o));
    ApiKeys* keys = out.keys.get();
    out.http.authenticate = [keys](const std::string& key) {
      return keys->authenticate(key);
    };
    out.summary = "keys (" + std::to_string(keys->size()) + " from " +
                  (env ? std::string("ZEROSTEP_API_KEYS")
                       : "--api-keys " + f.api_keys_file) +
                  ")";
  } else {
    out.summary = "none (every request is tenant 'default')";
    if (!local && log)
      log("WARNING: serving --host=" + host +
          " without API keys (--allow-unauthenticated): anyone who can "
          "reach the port acts as tenant 'default' and can create, train, "
          "load and overwrite every model");
  }
  return out;
}

}  // namespace tinker
}  // namespace zerostep
