#include "engine/failure_latch.h"

namespace zerostep {

void FailureLatch::require_working(const char* what) const {
  if (failure_.empty()) return;
  throw UsageError(std::string(what) + " on rank " + std::to_string(rank_) +
                   " after a collective or the optimizer's device failed in "
                   "an earlier call (" +
                   failure_ +
                   "). The window's gradients are lost and the ranks may be "
                   "out of step. Fix: build a new world and new engines, "
                   "and load the last checkpoint");
}

void FailureLatch::comm_failed(const CommError& e, const std::string& call,
                               const std::string& unchanged,
                               const std::string& kept) {
  failure_ = e.what();
  throw CommError(call + " failed on rank " + std::to_string(rank_) + ": " +
                  e.what() + ". " + kept +
                  " as before "
                  "the call and " +
                  unchanged +
                  " (Note [Transactional update]); the window's gradients "
                  "are lost");
}

}  // namespace zerostep
