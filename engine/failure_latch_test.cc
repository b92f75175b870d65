#include "engine/failure_latch.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace zerostep {
namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FailureLatchTest, WorksUntilAFailureIsRecordedThenRefusesNamingIt) {
  FailureLatch latch(3);
  EXPECT_FALSE(latch.failed());
  latch.require_working("backward()");
  const std::string wrapped = message_of([&] {
    latch.comm_failed(CommError("all_gather #7 timed out"), "step() at 2",
                      "no counter moved");
  });
  EXPECT_EQ(wrapped,
            "step() at 2 failed on rank 3: all_gather #7 timed out. "
            "Parameters and optimizer state are as before the call and no "
            "counter moved (Note [Transactional update]); the window's "
            "gradients are lost");
  EXPECT_TRUE(latch.failed());
  const std::string refused =
      message_of([&] { latch.require_working("backward()"); });
  EXPECT_NE(refused.find("backward() on rank 3 after a collective"),
            std::string::npos);
  EXPECT_NE(refused.find("(all_gather #7 timed out)"), std::string::npos);
  EXPECT_THROW(latch.require_working("step()"), UsageError);
}

// Stage 2's step keeps the rank's own elements, not the whole replica
// (Note [Transactional update]): the message says which it kept.
TEST(FailureLatchTest, TheMessageNamesWhatWasKept) {
  FailureLatch latch(1);
  const std::string wrapped = message_of([&] {
    latch.comm_failed(CommError("x"), "step() at 4", "no counter moved",
                      "This rank's own elements are");
  });
  EXPECT_EQ(wrapped,
            "step() at 4 failed on rank 1: x. This rank's own elements are "
            "as before the call and no counter moved (Note [Transactional "
            "update]); the window's gradients are lost");
}

TEST(FailureLatchTest, RecordedDeviceErrorAlsoRefuses) {
  FailureLatch latch(0);
  latch.record("EIO on /nvme/x");
  EXPECT_THROW(latch.require_working("step()"), UsageError);
}

}  // namespace
}  // namespace zerostep
