#include "comm/gloo_world.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/conformance.h"
#include "common/errors.h"

namespace zerostep {
namespace {

class GlooRunner : public ConformanceRunner {
 public:
  void run(int world_size, const RankBody& body) override {
    GlooLocalWorld world(world_size);
    world.run([&](int r) { body(world.comm(r)); });
  }
  std::vector<int> world_sizes() const override { return {1, 2, 3, 4}; }
};

const bool registered = [] {
  register_communicator_conformance(
      "gloo", [] { return std::make_unique<GlooRunner>(); });
  return true;
}();

TEST(GlooWorldTest, FromEnvironmentNamesTheMissingVariable) {
  unsetenv("RANK");
  try {
    GlooCommunicator::from_environment();
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK is not set"),
              std::string::npos)
        << e.what();
  }
}

// A rank that stops taking part makes its peers fail within the timeout,
// with a CommError, instead of hanging.
TEST(GlooWorldTest, APeerThatNeverArrivesIsACommErrorAfterTheTimeout) {
  GlooOptions o;
  o.timeout = std::chrono::milliseconds(1500);
  GlooLocalWorld world(2, o);
  auto errors = world.run_collect([&](int r) {
    if (r == 1) return;  // never joins
    float x = 1;
    world.comm(r).all_reduce(Buffer::of(&x, 1), {});
  });
  ASSERT_TRUE(errors[0]);
  EXPECT_THROW(std::rethrow_exception(errors[0]), CommError);
  EXPECT_FALSE(errors[1]);
}

}  // namespace
}  // namespace zerostep
