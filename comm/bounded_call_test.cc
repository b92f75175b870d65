#include "comm/bounded_call.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>

#include "common/errors.h"

namespace zerostep {
namespace {

TEST(BoundedCallTest, ReturnsWhatTheCallDoes) {
  int x = 0;
  run_bounded([&] { x = 42; }, std::chrono::seconds(60),
              [] { return std::string("unused"); });
  EXPECT_EQ(x, 42);
  EXPECT_THROW(
      run_bounded([] { throw IoError("disk"); }, std::chrono::seconds(60),
                  [] { return std::string("unused"); }),
      IoError);
}

// A call that never returns is a CommError with the caller's description
// at the timeout; the thread is left blocked (here until the test releases
// it, so that it ends before the process does).
TEST(BoundedCallTest, ACallThatDoesNotReturnIsACommErrorAtTheTimeout) {
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  try {
    run_bounded(
        [released, finished] {
          released.wait();
          *finished = true;
        },
        std::chrono::milliseconds(50),
        [] { return std::string("waiting for rank 3 to join"); });
    FAIL() << "no error";
  } catch (const CommError& e) {
    EXPECT_STREQ(e.what(), "waiting for rank 3 to join");
  }
  EXPECT_FALSE(*finished);
  release->set_value();
}

}  // namespace
}  // namespace zerostep
