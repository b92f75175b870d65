#include "comm/torchrun_env.h"

#include <climits>
#include <cstdint>
#include <cstdlib>

#include "common/cli.h"
#include "common/errors.h"

namespace zerostep {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// A variable every launcher sets, read whole and checked against its range.
int required_int(const char* name, int64_t min, int64_t max) {
  const char* v = env(name);
  if (v == nullptr)
    throw UsageError(std::string("environment variable ") + name +
                     " is not set: a rank started across processes reads "
                     "torchrun's RANK, WORLD_SIZE, MASTER_ADDR and "
                     "MASTER_PORT. Fix: start the program with tools/launch, "
                     "torchrun or your scheduler, or set them");
  return static_cast<int>(parse_int(name, v, min, max));
}

}  // namespace

TorchrunEnv read_torchrun_env() {
  TorchrunEnv e;
  e.rank = required_int("RANK", 0, INT_MAX);
  e.world_size = required_int("WORLD_SIZE", 1, INT_MAX);
  e.master_port = required_int("MASTER_PORT", 1, 65535);
  if (e.rank >= e.world_size)
    throw UsageError("RANK=" + std::to_string(e.rank) +
                     " WORLD_SIZE=" + std::to_string(e.world_size) +
                     ": need RANK < WORLD_SIZE. Fix: give each of the "
                     "WORLD_SIZE processes its own RANK from 0 to "
                     "WORLD_SIZE - 1");
  const char* addr = env("MASTER_ADDR");
  if (addr == nullptr)
    throw UsageError(
        "environment variable MASTER_ADDR is not set: the address of the "
        "host every rank meets at (rank 0's, e.g. 10.0.0.1; 127.0.0.1 when "
        "every rank runs on one host). Fix: set it, or start the program "
        "with tools/launch or torchrun");
  e.master_addr = addr;
  e.local_rank = e.rank;
  if (const char* v = env("LOCAL_RANK"))
    e.local_rank = static_cast<int>(parse_int("LOCAL_RANK", v, 0, INT_MAX));
  if (const char* v = env("LOCAL_WORLD_SIZE"))
    e.local_world_size =
        static_cast<int>(parse_int("LOCAL_WORLD_SIZE", v, 1, e.world_size));
  // PyTorch's own test: rank 0 hosts the store unless the agent does.
  if (const char* v = env("TORCHELASTIC_USE_AGENT_STORE"))
    e.rank0_hosts_store = std::string(v) != "True";
  if (const char* run = env("TORCHELASTIC_RUN_ID")) {
    e.key_prefix += std::string(run) + "/";
    const char* restart = env("TORCHELASTIC_RESTART_COUNT");
    e.key_prefix += std::string(restart != nullptr ? restart : "0") + "/";
  }
  return e;
}

}  // namespace zerostep
