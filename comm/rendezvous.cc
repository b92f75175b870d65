#include "comm/rendezvous.h"

#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/bounded_call.h"
#include "comm/net_interface.h"
#include "common/cli.h"
#include "common/errors.h"

namespace zerostep {
namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string text(const std::vector<uint8_t>& b) {
  return std::string(b.begin(), b.end());
}

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream os;
  os << static_cast<double>(t.count()) / 1000.0 << " s";
  return os.str();
}

// "2, 3 and 5": at most 16 listed.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > 16)
    out += " and " + std::to_string(ranks.size() - 16) + " more";
  return out;
}

std::string this_host() {
  char h[256] = {0};
  if (gethostname(h, sizeof(h) - 1) != 0) return "?";
  return h;
}

// "host address port identity pid network", one rank's entry.
std::string encode(const ProbeTarget& t) {
  return t.host + " " + t.address + " " + std::to_string(t.port) + " " +
         std::to_string(t.identity) + " " + std::to_string(t.pid) + " " +
         t.network;
}

ProbeTarget decode(int rank, const std::string& entry) {
  ProbeTarget t;
  t.rank = rank;
  std::istringstream is(entry);
  if (!(is >> t.host >> t.address >> t.port >> t.identity >> t.pid >>
        t.network))
    throw CommError("rendezvous: rank " + std::to_string(rank) +
                    "'s entry in the store is not zerostep's ('" + entry +
                    "'): another job uses this MASTER_ADDR:MASTER_PORT");
  return t;
}

// What the rendezvous thread is doing, for the message if it times out.
struct Progress {
  std::mutex m;
  std::string waiting_for;  // guarded by m
  void set(std::string s) {
    std::lock_guard<std::mutex> hold(m);
    waiting_for = std::move(s);
  }
  std::string get() {
    std::lock_guard<std::mutex> hold(m);
    return waiting_for;
  }
};

// Waits until `ready()` with a backoff from 5 ms to 200 ms between tries.
template <typename F>
void poll_until(F ready) {
  std::chrono::milliseconds pause(5);
  while (!ready()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

}  // namespace

std::chrono::milliseconds probe_window(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(1000));
}

Rendezvous::Rendezvous(const TorchrunEnv& env, const RendezvousOptions& options)
    : env_(env), options_(options) {
  std::random_device rd;
  const uint64_t identity = (static_cast<uint64_t>(rd()) << 32 | rd()) ^
                            static_cast<uint64_t>(getpid());
  listener_ = std::make_unique<ProbeListener>(options.address, identity);
  ProbeTarget me;
  me.rank = env.rank;
  me.host = this_host();
  me.address = options.address;
  me.port = listener_->port();
  me.identity = identity;
  me.pid = getpid();
  me.network = network_id();

  const int rank = env.rank, world = env.world_size;
  const std::string prefix = env.key_prefix + options.backend + "/";
  const std::string where =
      env.master_addr + ":" + std::to_string(env.master_port);
  const bool hosts = env.rank0_hosts_store && rank == 0;
  const std::string host_of_store =
      env.rank0_hosts_store ? "rank 0's store" : "the launcher's store";
  struct Result {
    std::mutex m;
    c10::intrusive_ptr<c10d::Store> store;  // guarded by m
    std::vector<std::string> table;         // guarded by m
  };
  auto result = std::make_shared<Result>();
  auto progress = std::make_shared<Progress>();
  const std::string entry = encode(me);
  const std::chrono::milliseconds timeout = options.timeout;
  auto meet = [=] {
    progress->set(hosts ? "hosting the store at port " +
                              std::to_string(env.master_port)
                        : "connecting to " + host_of_store + " at " + where +
                              " (is rank 0 started, and MASTER_ADDR its "
                              "address as this host reaches it?)");
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = hosts;
    so.waitWorkers = false;
    so.timeout = timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    store->set(prefix + "join/" + std::to_string(rank), bytes(entry));
    const int64_t joined0 = store->add(prefix + "joined", 1);
    std::vector<std::string> table(world);
    if (rank == 0) {
      // Names the missing ranks as they arrive.
      std::vector<int> missing;
      for (int r = 1; r < world; ++r) missing.push_back(r);
      poll_until([&] {
        std::vector<int> still;
        for (int r : missing)
          if (!store->check({prefix + "join/" + std::to_string(r)}))
            still.push_back(r);
        missing = still;
        progress->set("waiting for rank" +
                      std::string(missing.size() > 1 ? "s " : " ") +
                      rank_list(missing) + " of " + std::to_string(world) +
                      " to join " + host_of_store + " at " + where);
        return missing.empty();
      });
      progress->set("reading the ranks' entries from the store");
      std::string all;
      for (int r = 0; r < world; ++r) {
        table[r] = text(store->get(prefix + "join/" + std::to_string(r)));
        all += table[r] + "\n";
      }
      store->set(prefix + "table", bytes(all));
    } else {
      int64_t joined = joined0;
      std::string missing_text;  // the last names found
      auto last_names = std::chrono::steady_clock::time_point{};
      poll_until([&] {
        if (store->check({prefix + "table"})) return true;
        joined = store->add(prefix + "joined", 0);
        // Naming the missing ones costs a request per rank: at most once a
        // second, in worlds of up to 256.
        if (joined < world && world <= 256 &&
            std::chrono::steady_clock::now() - last_names >
                std::chrono::seconds(1)) {
          last_names = std::chrono::steady_clock::now();
          std::vector<int> missing;
          for (int r = 0; r < world; ++r)
            if (!store->check({prefix + "join/" + std::to_string(r)}))
              missing.push_back(r);
          missing_text =
              missing.empty()
                  ? ""
                  : "; missing: rank" +
                        std::string(missing.size() > 1 ? "s " : " ") +
                        rank_list(missing);
        }
        progress->set(
            joined < world
                ? "waiting for the ranks to join " + host_of_store + " at " +
                      where + " (" +
                      std::to_string(joined) + " of " + std::to_string(world) +
                      " joined" + missing_text + ")"
                : "waiting for rank 0 to publish the table of every rank's "
                  "address (all " +
                      std::to_string(world) + " ranks joined " + host_of_store +
                      " at " + where + ")");
        return false;
      });
      std::istringstream is(text(store->get(prefix + "table")));
      for (int r = 0; r < world; ++r) std::getline(is, table[r]);
    }
    std::lock_guard<std::mutex> hold(result->m);
    result->store = store;
    result->table = table;
  };
  const std::string on_rank = options.backend + " rendezvous on rank " +
                              std::to_string(rank) + " (host " + me.host +
                              ", " + me.address + ")";
  try {
    run_bounded(meet, timeout, [&] {
      return on_rank + " timed out after " + seconds(timeout) + ", " +
             progress->get() +
             ". Fix: start every rank (a rank that never started, or died, "
             "is the one missing), check that MASTER_ADDR and MASTER_PORT "
             "are the same for all, or raise the timeout";
    });
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = message_without_backtrace(e);
    std::string fix;
    if (hosts)
      fix =
          ". Fix: if the port is taken, choose another MASTER_PORT or end "
          "the job that holds it";
#if TORCH_VERSION_MAJOR < 2
    // Note [torchrun's agent store]
    if (!env.rank0_hosts_store)
      fix =
          ". torchrun's agent hosts this store (TORCHELASTIC_USE_AGENT_STORE"
          "=True), and a store of torch 2 or newer does not speak the "
          "protocol of the LibTorch " TORCH_VERSION
          " this program was built with. Fix: run torchrun with "
          "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and --rdzv-backend=c10d "
          "(rank 0 then hosts a store of its own), or build with "
          "--config=cuda (LibTorch 2.11, torchrun 2.11's protocol)";
#endif
    throw CommError(on_rank + " failed while " + progress->get() + ": " + what +
                    fix);
  }
  std::lock_guard<std::mutex> hold(result->m);
  store_ =
      c10::make_intrusive<c10d::PrefixStore>(prefix + "pg/", result->store);
  for (int r = 0; r < world; ++r) peers_.push_back(decode(r, result->table[r]));
}

Rendezvous::~Rendezvous() = default;

c10::intrusive_ptr<c10d::Store> Rendezvous::store() const { return store_; }

std::string Rendezvous::unanswered_peers(
    std::chrono::milliseconds window) const {
  std::vector<ProbeTarget> others;
  for (const ProbeTarget& t : peers_)
    if (t.rank != env_.rank) others.push_back(t);
  return describe_unanswered(
      probe_from(peers_[env_.rank].network, others, window));
}

std::string Rendezvous::diagnosis() const {
  const std::chrono::milliseconds window = probe_window(options_.timeout);
  const std::string missing = unanswered_peers(window);
  if (missing.empty())
    return ". Every other rank answers a probe (within " +
           std::to_string(window.count()) +
           " ms): none of them is gone or stopped; the rank that failed "
           "first says why in its own error";
  return ". Ranks that did not answer a probe: " + missing;
}

std::string Rendezvous::addresses() const {
  std::string out;
  bool loopback = false;
  std::set<std::string> networks;
  for (const ProbeTarget& t : peers_) {
    loopback = loopback || is_loopback_address(t.address);
    networks.insert(t.network);
    if (t.rank >= 16) continue;
    if (!out.empty()) out += ", ";
    out += "rank " + std::to_string(t.rank) + " " + t.address + " (host " +
           t.host + ")";
  }
  if (peers_.size() > 16) out += ", ...";
  if (loopback && networks.size() > 1)
    out +=
        ". The ranks run on several hosts (or network namespaces) and some "
        "bind a loopback address, which the other hosts cannot reach (a "
        "MASTER_ADDR that is local on their host, or GLOO_SOCKET_IFNAME=lo). "
        "Fix: set MASTER_ADDR to rank 0's address on the network the hosts "
        "share, and GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME), where set, to "
        "the interface that reaches the other hosts";
  return out;
}

}  // namespace zerostep
