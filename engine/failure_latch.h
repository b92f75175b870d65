// FailureLatch: an engine's memory of its first failed collective (or
// failed offload device in step()). Once set, every call that would
// communicate is refused: the window's gradients are lost and the ranks may
// be out of step, so the world must be rebuilt (engine/engine.h).
//
// Shared by the Engine and its parameter binding (stage 3's forward gathers
// run outside backward() and step()).
//
// Thread safety: none; one per Engine, used from its thread.
#ifndef ZEROSTEP_ENGINE_FAILURE_LATCH_H_
#define ZEROSTEP_ENGINE_FAILURE_LATCH_H_

#include <string>

#include "common/errors.h"

namespace zerostep {

class FailureLatch {
 public:
  explicit FailureLatch(int rank) : rank_(rank) {}

  // UsageError naming `what`, this rank and the recorded failure once one
  // was recorded; nothing otherwise.
  void require_working(const char* what) const;
  // Records `e` and throws it again as CommError naming `call`, this rank
  // and what stayed `unchanged` (Note [Transactional update]): `kept` names
  // the parameters that are as before the call.
  [[noreturn]] void comm_failed(
      const CommError& e, const std::string& call, const std::string& unchanged,
      const std::string& kept = "Parameters and optimizer state are");
  // Records a failure (an offload device's IoError) without throwing.
  void record(const std::string& failure) { failure_ = failure; }
  bool failed() const { return !failure_.empty(); }

 private:
  int rank_;
  std::string failure_;  // the first failure's message, or ""
};

}  // namespace zerostep

#endif  // ZEROSTEP_ENGINE_FAILURE_LATCH_H_
