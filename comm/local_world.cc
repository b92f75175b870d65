#include "comm/local_world.h"

#include "common/errors.h"

namespace zerostep {

void LocalWorld::run(const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors = run_collect(fn);
  std::exception_ptr first_comm;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const CommError&) {
      if (!first_comm) first_comm = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first_comm) std::rethrow_exception(first_comm);
}

}  // namespace zerostep
