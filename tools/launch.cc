// tools/launch: a launcher like torchrun, on one node or several.
//
//   ./bazelw run //tools:launch -- --nproc=4 -- <program> <args...>
//   launch --nnodes=2 --node-rank=0 --master-addr=10.0.0.1 \
//          --nproc-per-node=2 -- <program> <args...>      # on host A
//   launch --nnodes=2 --node-rank=1 --master-addr=10.0.0.1 \
//          --nproc-per-node=2 -- <program> <args...>      # on host B
//
// Starts this node's copies of <program> with torchrun's variables set
// (tools/launcher.h), prefixes their output with the rank, and exits with
// the first failing rank's status (naming it), after stopping the others;
// 0 if all succeed. Across nodes, a failure on any node stops every node,
// and each launcher exits non-zero naming the node, host and rank that
// failed. SIGTERM, SIGINT and SIGHUP are forwarded to every rank; launch
// exits 0 if every rank then exits 0, else 128 + the signal.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/errors.h"
#include "tools/launcher.h"

namespace {

// More ranks than one machine runs usefully; a larger --nproc is a typo.
constexpr int kMaxProcesses = 4096;
constexpr int kMaxNodes = 65536;

constexpr const char kUsage[] =
    "usage: launch [--nproc-per-node=N] [--nnodes=M --node-rank=K "
    "--master-addr=A]\n"
    "              [--master-port=P] [options] -- <program> [args...]\n";

constexpr const char kHelp[] =
    "\n"
    "Starts N copies of <program> on this node, like torchrun, each with\n"
    "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
    "GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR and\n"
    "MASTER_PORT set, so GlooCommunicator::from_environment() connects them.\n"
    "Output lines are prefixed with the rank. The first rank to fail stops\n"
    "the others; launch then exits with its status and names it. SIGINT,\n"
    "SIGTERM and SIGHUP are forwarded to every rank, which gets 60 s to exit;\n"
    "launch exits 0 if every rank exits 0, else 128 + the signal.\n"
    "\n"
    "On several nodes (hosts), run launch on each with the same --nnodes,\n"
    "--nproc-per-node, --master-addr and --master-port and its own\n"
    "--node-rank. The launchers meet at node 0 (port P + 1) before any rank\n"
    "starts; when a node fails (a rank's exit, its launcher gone or silent),\n"
    "every node stops its ranks and exits non-zero naming the node, host and\n"
    "rank that failed.\n"
    "\n"
    "  --nproc-per-node=N   ranks on this node (1 to 4096; default 1; "
    "--nproc=N too)\n"
    "  --nnodes=M           nodes of the job (default 1)\n"
    "  --node-rank=K        this node, 0 to M - 1 (default 0)\n"
    "  --master-addr=A      node 0's address as every node reaches it (default\n"
    "                       127.0.0.1 on one node; required on several)\n"
    "  --master-port=P      rank 0's store, 1 to 65535 (default: a free one on "
    "one\n"
    "                       node, 29500 on several)\n"
    "  --launcher-port=Q    where the launchers meet (default P + 1)\n"
    "  --join-timeout-s=T   how long the launchers wait for each other "
    "(default 600)\n"
    "  --node-timeout-s=T   silence after which a node counts as lost "
    "(default 60)\n"
    "  --node-failure-grace-s=T  after another node failed, how long this "
    "node's\n"
    "                       ranks may run on to end with their own errors "
    "(default 10)\n"
    "  --help               this text\n"
    "Flags take --flag=value or --flag value; torchrun's underscore spellings\n"
    "(--nproc_per_node, --node_rank, --master_addr, --master_port) work too.\n";

// torchrun spells some flags with underscores.
std::string canonical(std::string flag) {
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

std::chrono::milliseconds seconds_flag(const std::string& flag,
                                       const std::string& v) {
  return std::chrono::milliseconds(static_cast<int64_t>(
      zerostep::parse_double(flag, v, 0.01, 86400.0, 10.0) * 1000.0));
}

}  // namespace

int main(int argc, char** argv) {
  zerostep::LaunchOptions options;
  std::vector<std::string> program;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::fputs(kHelp, stdout);
      return 0;
    }
    std::string flag = a, value;
    const size_t eq = a.find('=');
    bool has_value = eq != std::string::npos;
    if (has_value) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    flag = canonical(flag);
    static const char* const kFlags[] = {
        "--nproc",        "--nproc-per-node", "--nnodes",
        "--node-rank",    "--master-addr",    "--master-port",
        "--launcher-port", "--join-timeout-s", "--node-timeout-s",
        "--node-failure-grace-s"};
    bool known = false;
    for (const char* f : kFlags) known = known || flag == f;
    if (!known) {
      std::fprintf(stderr, "launch: unknown argument '%s'\n%s", a.c_str(),
                   kUsage);
      return 2;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launch: %s needs a value\n%s", flag.c_str(),
                     kUsage);
        return 2;
      }
      value = argv[++i];
    }
    try {
      if (flag == "--nproc" || flag == "--nproc-per-node")
        options.nproc = static_cast<int>(
            zerostep::parse_int(flag, value, 1, kMaxProcesses, 2));
      else if (flag == "--nnodes")
        options.nnodes = static_cast<int>(zerostep::parse_int(
            flag, value, 1, kMaxNodes, 2));  // "1:4" (elastic) is refused
      else if (flag == "--node-rank")
        options.node_rank = static_cast<int>(
            zerostep::parse_int(flag, value, 0, kMaxNodes - 1, 0));
      else if (flag == "--master-addr")
        options.master_addr = value;
      else if (flag == "--master-port")
        options.master_port = static_cast<int>(
            zerostep::parse_int(flag, value, 0, 65535, 29500));
      else if (flag == "--launcher-port")
        options.launcher_port = static_cast<int>(
            zerostep::parse_int(flag, value, 0, 65535, 29501));
      else if (flag == "--join-timeout-s")
        options.join_timeout = seconds_flag(flag, value);
      else if (flag == "--node-timeout-s")
        options.node_timeout = seconds_flag(flag, value);
      else if (flag == "--node-failure-grace-s")
        options.remote_failure_grace = seconds_flag(flag, value);
    } catch (const zerostep::Error& e) {
      std::fprintf(stderr, "launch: %s\n", e.what());
      return 2;
    }
  }
  for (; i < argc; ++i) program.push_back(argv[i]);
  try {
    zerostep::LaunchResult r = zerostep::launch(program, options);
    if (r.failed_rank >= 0 || r.failed_node >= 0 || r.exit_code != 0) {
      std::fprintf(stderr, "launch: failed: %s\n", r.description.c_str());
      return r.exit_code != 0 ? r.exit_code : 1;
    }
    return 0;
  } catch (const zerostep::Error& e) {
    std::fprintf(stderr, "launch: %s\n", e.what());
    return 2;
  }
}
