// Multi-process Gloo runs under the launcher: 2 and 4 real processes on
// loopback, every stage, unmanaged vs managed bitwise and ranks in
// agreement (tools/gloo_worker.cc); and a rank dying mid-step ends the job
// with that rank named and no process left behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "tools/launcher.h"

namespace zerostep {
namespace {

struct WorkerRun {
  LaunchResult result;
  std::string output;
};

WorkerRun run_worker(int nproc, const std::vector<std::string>& args) {
  std::FILE* out = std::tmpfile();
  LaunchOptions o;
  o.nproc = nproc;
  o.out = out;
  std::vector<std::string> argv = {"tools/gloo_worker"};
  argv.insert(argv.end(), args.begin(), args.end());
  WorkerRun run;
  run.result = launch(argv, o);
  std::rewind(out);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), out)) > 0)
    run.output.append(buf, n);
  std::fclose(out);
  return run;
}

TEST(LaunchTest, EveryStageTrainsBitwiseOnTwoAndFourProcesses) {
  for (int nproc : {2, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      WorkerRun run = run_worker(
          nproc, {"--stage=" + std::to_string(stage), "--backwards=2,3"});
      EXPECT_EQ(run.result.exit_code, 0) << run.output;
      EXPECT_EQ(run.result.failed_rank, -1) << run.output;
      for (int r = 0; r < nproc; ++r)
        EXPECT_NE(run.output.find("[rank " + std::to_string(r) + "] rank " +
                                  std::to_string(r) +
                                  " ok stage=" + std::to_string(stage)),
                  std::string::npos)
            << run.output;
    }
  }
}

std::string digest_of(const std::string& output, int rank) {
  const std::string key = "[rank " + std::to_string(rank) + "] rank " +
                          std::to_string(rank) + " ok";
  const size_t at = output.find(key);
  if (at == std::string::npos) return "";
  const size_t d = output.find("digest=", at);
  return output.substr(d + 7, 16);
}

// Real processes with optimizer offload (cpu, and nvme: each rank streams
// its moments through its own swap file; at stage 3 the parameter
// partitions too) and mixed precision give the same bits as the in-memory
// run, on every rank.
TEST(LaunchTest, OffloadAndMixedPrecisionAcrossProcesses) {
  char tmpl[] = "/tmp/zerostep_nvme_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string nvme = tmpl;
  const std::vector<std::pair<int, std::string>> runs = {
      {1, "fp32"}, {2, "fp32"}, {3, "fp32"}, {2, "bf16"}};
  for (const auto& [stage, dtype] : runs) {
    {
      const std::vector<std::string> base = {"--stage=" + std::to_string(stage),
                                             "--backwards=2,3",
                                             "--dtype=" + dtype};
      WorkerRun plain = run_worker(2, base);
      ASSERT_EQ(plain.result.exit_code, 0) << plain.output;
      const std::string want = digest_of(plain.output, 0);
      ASSERT_EQ(want.size(), 16u) << plain.output;
      for (const std::string offload : {"cpu", "nvme"}) {
        std::vector<std::string> args = base;
        args.push_back("--offload=" + offload);
        args.push_back("--nvme-path=" + nvme);
        if (stage == 3) args.push_back("--offload-param");
        WorkerRun run = run_worker(2, args);
        EXPECT_EQ(run.result.exit_code, 0) << run.output;
        for (int r = 0; r < 2; ++r)
          EXPECT_EQ(digest_of(run.output, r), want)
              << "stage " << stage << " " << dtype << " " << offload << "\n"
              << run.output;
      }
    }
  }
  std::filesystem::remove_all(nvme);
}

TEST(LaunchTest, ARankDyingMidStepEndsTheJobNamingIt) {
  char tmpl[] = "/tmp/zerostep_launch_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  WorkerRun run = run_worker(3, {"--stage=1", "--backwards=2,2,2",
                                 "--die-at-step=2", "--checkpoint-dir=" + dir});
  EXPECT_EQ(run.result.failed_rank, 1) << run.output;
  EXPECT_EQ(run.result.exit_code, 3) << run.output;
  EXPECT_NE(run.result.description.find("rank 1 exited with status 3"),
            std::string::npos);
  EXPECT_NE(run.output.find("dying in window 2 as asked"), std::string::npos)
      << run.output;
  // The last checkpoint (after window 1) is complete and is the latest.
  std::ifstream latest(dir + "/latest");
  std::string tag;
  latest >> tag;
  EXPECT_EQ(tag, "w1");
  // ... and loads on every rank of a new job.
  WorkerRun resumed = run_worker(3, {"--stage=1", "--resume-from=" + dir});
  EXPECT_EQ(resumed.result.exit_code, 0) << resumed.output;
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(resumed.output.find("rank " + std::to_string(r) +
                                  " resumed at global_steps=2"),
              std::string::npos)
        << resumed.output;
}

// The rendezvous port comes from below the kernel's ephemeral range (where
// no port-0 bind or outgoing connection of another job can take it before
// rank 0 binds it), is free, and differs between calls (random, not the
// first free port of the band, which concurrent launchers would all pick).
TEST(LaunchTest, TheRendezvousPortIsFreeAndOutsideTheEphemeralRange) {
  const EphemeralPorts eph = ephemeral_ports();
  ASSERT_GE(eph.low - 1 - 10000, 1000)
      << "this machine's ip_local_port_range starts at " << eph.low
      << ": too low for the band below it";
  std::set<int> seen;
  for (int i = 0; i < 16; ++i) {
    const int port = pick_master_port();
    EXPECT_GE(port, 10000);
    EXPECT_LT(port, eph.low);
    seen.insert(port);
  }
  EXPECT_GT(seen.size(), 8u);
}

TEST(LaunchTest, AProgramThatCannotStartIsAFailureNotAHang) {
  LaunchOptions o;
  o.nproc = 2;
  std::FILE* out = std::tmpfile();
  o.out = out;
  LaunchResult r = launch({"/nonexistent/program"}, o);
  std::fclose(out);
  EXPECT_GE(r.failed_rank, 0);
  EXPECT_EQ(r.exit_code, 127);
}

}  // namespace
}  // namespace zerostep

namespace zerostep {
namespace {

// Reads lines from `fd` until `count` of them contain `needle`; false if
// the stream ends or no line comes for `timeout_ms`.
bool wait_for_lines(int fd, int count, const std::string& needle,
                    int timeout_ms) {
  std::string pending;
  int seen = 0;
  while (seen < count) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[256];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return false;
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      if (pending.substr(0, nl).find(needle) != std::string::npos) ++seen;
      pending.erase(0, nl + 1);
    }
  }
  return true;
}

// SIGTERM to the launcher stops every rank (they run in process groups of
// their own, so nothing else would reach them) and reports the signal. The
// signal goes out once the launcher has relayed every rank's "ready" line:
// it relays output only after installing its signal handlers.
TEST(LaunchTest, ASignalToTheLauncherStopsEveryRank) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  std::FILE* out = fdopen(fds[1], "w");
  ASSERT_NE(out, nullptr);
  LaunchOptions o;
  o.nproc = 3;
  o.out = out;
  o.kill_grace = std::chrono::milliseconds(500);
  bool ready = false;
  std::thread killer([&] {
    ready = wait_for_lines(fds[0], 3, "] ready", 60000);
    if (ready) kill(getpid(), SIGTERM);
  });
  LaunchResult r = launch({"/bin/sh", "-c", "echo ready; exec sleep 30"}, o);
  killer.join();
  std::fclose(out);
  close(fds[0]);
  ASSERT_TRUE(ready);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_NE(r.description.find("signal"), std::string::npos);
}

// The launcher forwards the signal it got as that same signal, and a job
// whose ranks all exit 0 on it (a graceful stop) succeeds. Each rank exits
// 0 only on the signal under test and 3 on the other two.
TEST(LaunchTest, ASignalEveryRankStopsOnGracefullyEndsTheJobWithZero) {
  for (const char* name : {"TERM", "INT", "HUP"}) {
    const int sig = std::string(name) == "TERM"  ? SIGTERM
                    : std::string(name) == "INT" ? SIGINT
                                                 : SIGHUP;
    int fds[2];
    ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
    std::FILE* out = fdopen(fds[1], "w");
    ASSERT_NE(out, nullptr);
    LaunchOptions o;
    o.nproc = 2;
    o.out = out;
    std::string lines;
    bool ready = false;
    std::thread killer([&] {
      ready = wait_for_lines(fds[0], 2, "] ready", 60000);
      if (ready) kill(getpid(), sig);
      char buf[256];  // keep the pipe drained until the launcher closes it
      ssize_t n;
      while ((n = read(fds[0], buf, sizeof(buf))) > 0) lines.append(buf, n);
    });
    const std::string script =
        std::string("trap 'exit 3' TERM INT HUP; trap 'echo stopping on ") +
        name + "; exit 0' " + name + "; echo ready; while :; do sleep 1; done";
    LaunchResult r = launch({"/bin/sh", "-c", script}, o);
    std::fclose(out);
    killer.join();
    close(fds[0]);
    ASSERT_TRUE(ready) << name;
    EXPECT_EQ(r.exit_code, 0) << name << ": " << r.description << "\n" << lines;
    EXPECT_EQ(r.failed_rank, -1) << name;
    EXPECT_EQ(r.signal, sig) << name;
    EXPECT_NE(lines.find("[rank 0] stopping on " + std::string(name)),
              std::string::npos)
        << lines;
    EXPECT_NE(lines.find("[rank 1] stopping on " + std::string(name)),
              std::string::npos)
        << lines;
  }
}

}  // namespace
}  // namespace zerostep
