#include "zero/agreement.h"

#include "common/errors.h"
#include "zero/phase.h"

namespace zerostep {

void broadcast_initial_parameters(Communicator& comm, float* data, size_t n) {
  comm.broadcast(Buffer::of(data, n), {0, phase::kSetup});
}

void agree_between_windows(Communicator& comm, int64_t window_backwards,
                           const std::string& what) {
  const int world = comm.world_size();
  std::vector<int64_t> all(static_cast<size_t>(world));
  comm.all_gather(Buffer::of(&window_backwards, 1),
                  Buffer::of(all.data(), all.size()), {phase::kSetup});
  for (int r = 0; r < world; ++r)
    if (all[r] != 0)
      throw UsageError(what +
                       " inside an open accumulation "
                       "window (rank " +
                       std::to_string(r) + " has " + std::to_string(all[r]) +
                       " backward() call(s) since "
                       "its last step()): checkpoints are taken between "
                       "windows. Fix: call step() first. Nothing was written");
}

std::vector<RankOutcome> share_outcomes(Communicator& comm,
                                        const RankOutcome& mine) {
  const size_t world = static_cast<size_t>(comm.world_size());
  int64_t packed[3] = {mine.failed ? 1 : 0, static_cast<int64_t>(mine.bytes),
                       static_cast<int64_t>(mine.checksum)};
  std::vector<int64_t> all(3 * world);
  comm.all_gather(Buffer::of(packed, 3), Buffer::of(all.data(), all.size()),
                  {phase::kSetup});
  std::vector<RankOutcome> out(world);
  for (size_t r = 0; r < world; ++r) {
    out[r].failed = all[3 * r] != 0;
    out[r].bytes = static_cast<uint64_t>(all[3 * r + 1]);
    out[r].checksum = static_cast<uint64_t>(all[3 * r + 2]);
  }
  return out;
}

bool root_failed(Communicator& comm, bool failed) {
  int64_t flag = failed ? 1 : 0;
  comm.broadcast(Buffer::of(&flag, 1), {0, phase::kSetup});
  return flag != 0;
}

}  // namespace zerostep
