// TorchrunEnv: where a rank stands in a job started by torchrun,
// tools/launch or any launcher that sets torchrun's variables, read from
// the environment and checked.
//
//   RANK, WORLD_SIZE      this rank and the world (required)
//   MASTER_ADDR           the host whose store every rank meets at
//                         (required)
//   MASTER_PORT           that store's port (required)
//   LOCAL_RANK            the rank on this host (default: RANK); the nccl
//                         backend's device
//   LOCAL_WORLD_SIZE      the ranks on this host (default: unknown, 0);
//                         fewer than WORLD_SIZE means the world spans hosts
//   TORCHELASTIC_USE_AGENT_STORE=True   torchrun's agent already hosts the
//                         store at MASTER_ADDR:MASTER_PORT, so rank 0 only
//                         connects to it (as PyTorch's init_process_group
//                         does)
//   TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT   name this attempt's
//                         keys in that store, which outlives restarts
//
// Thread safety: read_torchrun_env() reads the environment (getenv); the
// struct is a value.
#ifndef ZEROSTEP_COMM_TORCHRUN_ENV_H_
#define ZEROSTEP_COMM_TORCHRUN_ENV_H_

#include <string>

namespace zerostep {

struct TorchrunEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 0;  // 0: not set
  std::string master_addr;
  int master_port = 0;
  // Whether rank 0 hosts the store (false under torchrun's agent store).
  bool rank0_hosts_store = true;
  // The prefix of this attempt's keys in the store ("zerostep/" plus the
  // run id and restart count where torchrun sets them).
  std::string key_prefix = "zerostep/";
};

// Throws UsageError naming the variable that is missing or malformed (a
// number is read whole and checked against its range: MASTER_PORT=99999
// is refused, not read as port 34463), or RANK >= WORLD_SIZE.
TorchrunEnv read_torchrun_env();

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_TORCHRUN_ENV_H_
