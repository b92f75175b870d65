// What the trainer's tests share (testonly): running commands on a
// simulated world of RankTrainers, reading a step's parameter digest, and
// a scratch folder.
#ifndef ZEROSTEP_TOOLS_TINKER_TRAINER_TEST_UTIL_H_
#define ZEROSTEP_TOOLS_TINKER_TRAINER_TEST_UTIL_H_

#include <string>
#include <vector>

#include "tools/tinker/command.h"
#include "tools/tinker/trainer.h"

namespace zerostep {
namespace tinker {

// Runs `commands` on every rank of a SimWorld of `world` ranks (seed 1),
// each rank's RankTrainer (of `options`) executing each command in order,
// as run_follower does after rank 0's broadcast, with one compute thread.
// Returns rank 0's results.
std::vector<CommandResult> execute_on_sim_world(
    int world, const TrainerOptions& options,
    const std::vector<Command>& commands);

// A fresh (emptied) folder `name` under the test's TEST_TMPDIR (else /tmp).
std::string test_tmp_dir(const std::string& name);

// The parameter digest an optim_step's result reports (its metrics
// param_digest_hi:unique and param_digest_lo:unique), as digest_hex.
std::string digest_of(const CommandResult& result);

}  // namespace tinker
}  // namespace zerostep

#endif  // ZEROSTEP_TOOLS_TINKER_TRAINER_TEST_UTIL_H_
