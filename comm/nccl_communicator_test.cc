// Built and run with --config=cuda. Without a GPU (CI): constructing the
// backend fails cleanly with CommError naming the CUDA call. With GPUs
// (tools/gpu_check.sh): the conformance suite on one rank per device,
// threads of this process.
#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/conformance.h"
#include "comm/test_ports.h"
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

// The suite on device buffers: every buffer the suite gives is copied into
// device memory, handed to NCCL marked `device` (its own stream, events:
// no host wait inside the call), and copied back after the compute stream
// (the legacy default stream) has caught up. With `mixed` (Note [NCCL
// buffers in host memory]) the all-gathers' inputs and the
// reduce-scatters' outputs stay in host memory, as stage 3's are with
// offload from a device: host partitions gathered into device storage,
// device gradients reduced into host chunks.
class OnDevice final : public Communicator {
 public:
  OnDevice(Communicator* inner, bool mixed) : inner_(inner), mixed_(mixed) {}
  ~OnDevice() override {
    for (void* p : allocations_) cudaFree(p);
  }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return "nccl"; }
  bool reads_device_memory() const override { return true; }

  void all_reduce(Buffer buf, const AllReduceOptions& opts) override {
    all_reduce_async(buf, opts)->wait();
  }
  void reduce_scatter(Buffer in, Buffer out,
                      const ReduceScatterOptions& opts) override {
    reduce_scatter_async(in, out, opts)->wait();
  }
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer in, Buffer out, const ReduceScatterOptions& opts) override {
    const Buffer din = up(in), dout = mixed_ ? out : up(out);
    return later(inner_->reduce_scatter_async(din, dout, opts), out, dout);
  }
  std::shared_ptr<Work> all_reduce_async(
      Buffer buf, const AllReduceOptions& opts) override {
    const Buffer d = up(buf);
    return later(inner_->all_reduce_async(d, opts), buf, d);
  }
  void all_gather(Buffer in, Buffer out, const AllGatherOptions& opts) override {
    all_gather_async(in, out, opts)->wait();
  }
  std::shared_ptr<Work> all_gather_async(
      Buffer in, Buffer out, const AllGatherOptions& opts) override {
    const Buffer din = mixed_ ? in : up(in), dout = up(out);
    return later(inner_->all_gather_async(din, dout, opts), out, dout);
  }
  void broadcast(Buffer buf, const BroadcastOptions& opts) override {
    const Buffer d = up(buf);
    inner_->broadcast(d, opts);
    down(buf, d);
  }
  void barrier() override { inner_->barrier(); }

 private:
  // The collective's Work, then the copy of its device output back to
  // `host` (nothing when the output was host memory already).
  class Later final : public Work {
   public:
    Later(std::shared_ptr<Work> inner, OnDevice* owner, Buffer host, Buffer d)
        : inner_(std::move(inner)), owner_(owner), host_(host), d_(d) {}
    void wait() override {
      inner_->wait();
      if (done_) return;
      done_ = true;
      if (d_.device) owner_->down(host_, d_);
    }

   private:
    std::shared_ptr<Work> inner_;
    OnDevice* owner_;
    Buffer host_, d_;
    bool done_ = false;
  };
  std::shared_ptr<Work> later(std::shared_ptr<Work> w, Buffer host, Buffer d) {
    return std::make_shared<Later>(std::move(w), this, host, d);
  }
  Buffer up(Buffer host) {
    Buffer d = host;
    d.device = true;
    if (host.bytes() == 0) return d;
    void* p = nullptr;
    if (cudaMalloc(&p, host.bytes()) != cudaSuccess)
      throw CommError("cudaMalloc failed in the device conformance adapter");
    allocations_.push_back(p);
    cudaMemcpy(p, host.data, host.bytes(), cudaMemcpyHostToDevice);
    d.data = p;
    return d;
  }
  void down(Buffer host, Buffer d) {
    if (host.bytes() == 0) return;
    // On the default stream: ordered after the compute stream's wait for
    // the collective's event.
    cudaMemcpy(host.data, d.data, host.bytes(), cudaMemcpyDeviceToHost);
  }
  Communicator* inner_;
  bool mixed_;
  std::vector<void*> allocations_;
};

class NcclDeviceRunner : public NcclRunner {
 public:
  explicit NcclDeviceRunner(bool mixed) : mixed_(mixed) {}
  void run(int world, const RankBody& body) override {
    NcclRunner::run(world, [&](Communicator& c) {
      OnDevice d(&c, mixed_);
      body(d);
    });
  }

 private:
  bool mixed_;
};

const bool registered = [] {
  if (device_count() > 0) {
    register_communicator_conformance(
        "nccl", [] { return std::make_unique<NcclRunner>(); });
    register_communicator_conformance("nccl_device", [] {
      return std::make_unique<NcclDeviceRunner>(false);
    });
    register_communicator_conformance(
        "nccl_mixed", [] { return std::make_unique<NcclDeviceRunner>(true); });
  }
  return true;
}();

// The conformance suite's registration, which its own cases
// (CommConformance/<backend>.<case>/world<W>, comm/conformance.h) cannot
// check. Without a device it is not registered: this case stands for it,
// so that the run lists it as skipped by name instead of passing. With
// devices the three device runners must each be registered, with the same
// cases, each at the world sizes NcclRunner gives (1, 2, 4, ... up to the
// device count).
TEST(NcclCommunicatorTest, ConformanceSuiteOnDevices) {
  if (device_count() == 0)
    GTEST_SKIP() << "needs a CUDA device: the nccl conformance suite "
                    "(CommConformance/nccl.*, nccl_device.*, nccl_mixed.*) "
                    "was not registered (no device visible)";
  std::vector<std::string> worlds;
  for (int w : NcclRunner().world_sizes())
    worlds.push_back("world" + std::to_string(w));
  const std::string prefix = "CommConformance/";
  std::map<std::string, std::set<std::string>> cases;  // backend -> cases
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    const std::string name = suite.name();
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    ASSERT_NE(dot, std::string::npos) << name;
    cases[name.substr(prefix.size(), dot - prefix.size())].insert(
        name.substr(dot + 1));
    std::vector<std::string> got;
    for (int k = 0; k < suite.total_test_count(); ++k)
      got.push_back(suite.GetTestInfo(k)->name());
    EXPECT_EQ(got, worlds) << name;
  }
  ASSERT_EQ(cases.size(), 3u) << "backends registered: " << cases.size();
  EXPECT_FALSE(cases["nccl"].empty());
  EXPECT_EQ(cases["nccl_device"], cases["nccl"]);
  EXPECT_EQ(cases["nccl_mixed"], cases["nccl"]);
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

// torchrun's variables for a world of `world` meeting at 127.0.0.1 on a
// free port; this process is rank 0.
class FromEnvironment : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("NCCL_SOCKET_IFNAME");
    unsetenv("LOCAL_WORLD_SIZE");
    setenv("RANK", "0", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(free_loopback_port()).c_str(), 1);
  }
  void TearDown() override {
    for (const char* v : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "NCCL_SOCKET_IFNAME"})
      unsetenv(v);
  }
};

// NCCL's own variable is checked with NCCL's rules before anything starts.
TEST_F(FromEnvironment, AMisconfiguredNcclSocketIfnameIsNamed) {
  setenv("WORLD_SIZE", "2", 1);
  setenv("NCCL_SOCKET_IFNAME", "=zs_no_such_if", 1);
  try {
    NcclCommunicator::from_environment();
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "NCCL_SOCKET_IFNAME==zs_no_such_if: no interface of this "
                  "host",
                  0),
              0u)
        << e.what();
  }
}

// The rendezvous is the gloo backend's: bounded, naming the rank missing.
TEST_F(FromEnvironment, ARankThatNeverJoinsIsNamedAtTheTimeout) {
  setenv("WORLD_SIZE", "2", 1);
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(1000);
  try {
    NcclCommunicator::from_environment(o);
    FAIL() << "no error";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "nccl rendezvous on rank 0 (host "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("waiting for rank 1 of 2 to join"),
              std::string::npos)
        << e.what();
  }
  // Unset, the variable is set for NCCL to the interface that routes to
  // MASTER_ADDR.
  ASSERT_NE(std::getenv("NCCL_SOCKET_IFNAME"), nullptr);
  EXPECT_STREQ(std::getenv("NCCL_SOCKET_IFNAME"), "=lo");
}

// A world of one: on a GPU it reduces; without one it fails naming the
// CUDA call.
TEST_F(FromEnvironment, AWorldOfOne) {
  setenv("WORLD_SIZE", "1", 1);
  NcclOptions o;
  o.timeout = std::chrono::seconds(30);
  if (device_count() == 0) {
    try {
      NcclCommunicator::from_environment(o);
      FAIL() << "constructed without a device";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("cudaSetDevice failed"),
                std::string::npos)
          << e.what();
    }
    return;
  }
  auto c = NcclCommunicator::from_environment(o);
  float x = 3.0f;
  c->all_reduce(Buffer::of(&x, 1), {ReduceOp::kSum, "step"});
  EXPECT_EQ(x, 3.0f);
}

TEST(NcclCommunicatorTest, BadRankIsAUsageError) {
  NcclOptions o;
  o.id_path = "/tmp/x";
  EXPECT_THROW(NcclCommunicator(2, 2, o), UsageError);
}

}  // namespace
}  // namespace zerostep
