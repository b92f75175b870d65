// tools/launch: a local launcher like `torchrun --standalone`.
//
//   ./bazelw run //tools:launch -- --nproc=4 -- <program> <args...>
//
// Starts N copies of <program> with torchrun's variables set (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
// prefixes their output with the rank, and exits with the first failing
// rank's status (naming it), after stopping the others; 0 if all succeed.
// SIGTERM, SIGINT and SIGHUP are forwarded to every rank; launch exits 0
// if every rank then exits 0, else 128 + the signal.
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

constexpr const char kUsage[] =
    "usage: launch --nproc=N [--master-port=P] -- <program> [args...]\n";

constexpr const char kHelp[] =
    "\n"
    "Starts N copies of <program> on this machine, like torchrun "
    "--standalone,\n"
    "each with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR\n"
    "(127.0.0.1) and MASTER_PORT set, so GlooCommunicator::from_environment()\n"
    "connects them. Output lines are prefixed with the rank. The first rank "
    "to\n"
    "fail stops the others; launch then exits with its status and names it.\n"
    "SIGINT, SIGTERM and SIGHUP are forwarded to every rank, which gets 60 s\n"
    "to exit; launch exits 0 if every rank exits 0, else 128 + the signal.\n"
    "\n"
    "  --nproc=N          ranks to start (1 to 4096; default 1)\n"
    "  --master-port=P    the rendezvous port, 1 to 65535 (default, or 0: a "
    "free one)\n"
    "  --help             this text\n";

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
    try {
      if (a.rfind("--nproc=", 0) == 0) {
        options.nproc = static_cast<int>(
            zerostep::parse_int("--nproc", a.substr(8), 1, kMaxProcesses, 2));
        continue;
      }
      if (a.rfind("--master-port=", 0) == 0) {
        options.master_port = static_cast<int>(zerostep::parse_int(
            "--master-port", a.substr(14), 0, 65535, 29500));
        continue;
      }
    } catch (const zerostep::Error& e) {
      std::fprintf(stderr, "launch: %s\n", e.what());
      return 2;
    }
    std::fprintf(stderr, "launch: unknown argument '%s'\n%s", a.c_str(),
                 kUsage);
    return 2;
  }
  for (; i < argc; ++i) program.push_back(argv[i]);
  try {
    zerostep::LaunchResult r = zerostep::launch(program, options);
    if (r.failed_rank >= 0 || r.exit_code != 0) {
      std::fprintf(stderr, "launch: failed: %s\n", r.description.c_str());
      return r.exit_code != 0 ? r.exit_code : 1;
    }
    return 0;
  } catch (const zerostep::Error& e) {
    std::fprintf(stderr, "launch: %s\n", e.what());
    return 2;
  }
}
