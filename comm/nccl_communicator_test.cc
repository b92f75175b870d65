// Built and run with --config=cuda. Without a GPU (CI): constructing the
// backend fails cleanly with CommError naming the CUDA call. With GPUs
// (tools/gpu_check.sh): the conformance suite on one rank per device,
// threads of this process.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>

#include "comm/conformance.h"
#include "common/errors.h"

namespace zerostep {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string id_path(int world) {
  return "/tmp/zerostep_nccl_id_" + std::to_string(getpid()) + "_" +
         std::to_string(world) + "_" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

class NcclRunner : public ConformanceRunner {
 public:
  void run(int world, const RankBody& body) override {
    const std::string path = id_path(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        NcclOptions o;
        o.device = r % device_count();
        o.id_path = path;
        NcclCommunicator c(r, world, o);
        body(c);
      });
    for (auto& t : threads) t.join();
    std::remove(path.c_str());
  }
  std::vector<int> world_sizes() const override {
    // One rank per device (NCCL needs distinct devices per rank).
    std::vector<int> w;
    for (int n = 1; n <= device_count(); n *= 2) w.push_back(n);
    return w;
  }
};

const bool registered = [] {
  if (device_count() > 0)
    register_communicator_conformance(
        "nccl", [] { return std::make_unique<NcclRunner>(); });
  return true;
}();

// Without a device the conformance suite is not registered; this case stands
// for it, so that the run lists it as skipped by name instead of passing.
TEST(NcclCommunicatorTest, ConformanceSuiteOnDevices) {
  if (device_count() == 0)
    GTEST_SKIP() << "needs a CUDA device: the nccl conformance suite did not "
                    "run (no device visible)";
  SUCCEED() << "the suite runs as CommunicatorConformance/nccl.*";
}

TEST(NcclCommunicatorTest, WithoutADeviceConstructionFailsCleanly) {
  if (device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  NcclOptions o;
  o.id_path = id_path(1);
  try {
    NcclCommunicator c(0, 1, o);
    FAIL() << "constructed without a device";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaSetDevice failed"),
              std::string::npos)
        << e.what();
  }
}

TEST(NcclCommunicatorTest, BadRankIsAUsageError) {
  NcclOptions o;
  o.id_path = "/tmp/x";
  EXPECT_THROW(NcclCommunicator(2, 2, o), UsageError);
}

}  // namespace
}  // namespace zerostep
