#include "comm/bounded_call.h"

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "common/errors.h"

namespace zerostep {

void run_bounded(std::function<void()> fn, std::chrono::milliseconds timeout,
                 const std::function<std::string()>& on_timeout) {
  // Shared with the thread, which may outlive this call.
  struct State {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;         // guarded by m
    std::exception_ptr error;  // guarded by m
    std::function<void()> fn;
  };
  auto state = std::make_shared<State>();
  state->fn = std::move(fn);
  std::thread([state] {
    std::exception_ptr error;
    try {
      state->fn();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> hold(state->m);
    state->error = error;
    state->done = true;
    state->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> hold(state->m);
  if (!state->cv.wait_for(hold, timeout, [&] { return state->done; }))
    throw CommError(on_timeout());
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace zerostep
