// trainer_server: a Tinker-protocol training server on zerostep engines.
//
//   ./bazelw run //tools:trainer_server -- --port=8000 --config=ds.json
//
// Rank 0 serves the Tinker HTTP API (the official `tinker` Python SDK is the
// client) and broadcasts every request to the other ranks, which hold their
// own replica of every model (tools/tinker/trainer.h, Note [One command
// stream] in tools/tinker/command.h).
//
// Flags:
//   --port=P             TCP port (default 8000; 0 = any free port)
//   --host=H             address to bind (default 127.0.0.1)
//   --config=FILE        ds_config JSON for every model's Engine (ZeRO stage,
//                        optimizer defaults, clipping...); unmanaged mode and
//                        scaling "none" are filled in
//   --stage=S            ZeRO stage, overriding the config's
//   --world=W            simulated ranks in this process (default 1)
//   --backend=sim|gloo   sim (default): W ranks as threads of this process;
//                        gloo: one rank per process, started by tools/launch
//                        (or torchrun), from RANK/WORLD_SIZE/MASTER_ADDR/
//                        MASTER_PORT; rank 0 serves HTTP
//   --state-dir=DIR      where save_state writes (default
//                        /tmp/zerostep-tinker-<pid of rank 0's process>;
//                        with gloo, rank 0's folder is every rank's, so
//                        across machines it must be a shared file system)
//   --seed=N             seed of every base model's weights (default 1234)
//   --long-poll-s=T      retrieve_future waits this long before try_again (30)
//   --seq-gap-timeout-s=T  a request waits this long for a missing seq_id (60)
//
// Prints "seed=... options..." and then "listening on http://H:P" once it
// accepts requests. SIGINT or SIGTERM stops it (exit 0).
#include <ATen/Parallel.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/gloo_world.h"
#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "sim/sim_world.h"
#include "tools/tinker/command.h"
#include "tools/tinker/http.h"
#include "tools/tinker/service.h"
#include "tools/tinker/trainer.h"

namespace zerostep {
namespace {

struct Flags {
  int port = 8000;
  std::string host = "127.0.0.1";
  std::string config_path;
  int stage = -1;
  int world = 1;
  std::string backend = "sim";
  std::string state_dir;
  uint64_t seed = 1234;
  double long_poll_s = 30.0;
  double seq_gap_timeout_s = 60.0;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  auto value = [](const std::string& a, const char* name, std::string* out) {
    const std::string p = std::string("--") + name + "=";
    if (a.rfind(p, 0) != 0) return false;
    *out = a.substr(p.size());
    return true;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string v;
    if (a == "--help" || a == "-h") {
      std::printf("usage: trainer_server [--port=P] [--host=H] [--config=FILE] "
                  "[--stage=S] [--world=W] [--backend=sim|gloo] "
                  "[--state-dir=DIR] [--seed=N] [--long-poll-s=T] "
                  "[--seq-gap-timeout-s=T]\n");
      std::exit(0);
    } else if (value(a, "port", &v)) f.port = std::atoi(v.c_str());
    else if (value(a, "host", &v)) f.host = v;
    else if (value(a, "config", &v)) f.config_path = v;
    else if (value(a, "stage", &v)) f.stage = std::atoi(v.c_str());
    else if (value(a, "world", &v)) f.world = std::atoi(v.c_str());
    else if (value(a, "backend", &v)) f.backend = v;
    else if (value(a, "state-dir", &v)) f.state_dir = v;
    else if (value(a, "seed", &v)) f.seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (value(a, "long-poll-s", &v)) f.long_poll_s = std::atof(v.c_str());
    else if (value(a, "seq-gap-timeout-s", &v)) f.seq_gap_timeout_s = std::atof(v.c_str());
    else throw UsageError("trainer_server: unknown argument '" + a + "' (see --help)");
  }
  if (f.backend != "sim" && f.backend != "gloo")
    throw UsageError("--backend must be sim or gloo, not '" + f.backend + "'");
  if (f.world < 1) throw UsageError("--world must be >= 1");
  if (f.port < 0 || f.port > 65535) throw UsageError("--port must be in [0, 65535]");
  return f;
}

std::string ds_config_text(const Flags& f) {
  nlohmann::json doc = nlohmann::json::object();
  if (!f.config_path.empty()) {
    try {
      doc = nlohmann::json::parse(read_file(f.config_path));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError("--config '" + f.config_path + "' is not JSON: " + e.what());
    }
  }
  if (f.stage >= 0) doc["zero_optimization"]["stage"] = f.stage;
  return doc.dump();
}

int run(int argc, char** argv) {
  const Flags f = parse_flags(argc, argv);
  at::set_num_threads(1);  // tiny models; ranks are the parallelism
  // SIGINT/SIGTERM are taken by one thread (sigwait), blocked elsewhere.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  tinker::TrainerOptions topts;
  topts.ds_config_json = ds_config_text(f);
  topts.base_seed = f.seed;
  topts.state_dir = f.state_dir.empty()
                        ? "/tmp/zerostep-tinker-" + std::to_string(getpid())
                        : f.state_dir;
  tinker::ServiceOptions sopts;
  sopts.long_poll_s = f.long_poll_s;
  sopts.seq_gap_timeout_s = f.seq_gap_timeout_s;
  for (const auto& b : tinker::base_models()) sopts.models.push_back({b.name, b.max_context});
  tinker::Service service(sopts);
  tinker::HttpServer http(&service);

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "trainer_server: signal %d, stopping\n", sig);
    service.stop();
  });
  signal_thread.detach();

  auto serve_rank0 = [&](Communicator& comm, tinker::RankTrainer& trainer) {
    const int port = http.start(f.host, f.port);
    std::printf("listening on http://%s:%d\n", f.host.c_str(), port);
    std::fflush(stdout);
    service.run_rank0([&](const tinker::Command& c) {
      return tinker::broadcast_and_execute(comm, c, [&](const tinker::Command& x) {
        tinker::CommandResult r = trainer.execute(x);
        if (!r.ok && r.category == "server")
          std::fprintf(stderr, "trainer_server: %s failed: %s\n", x.op.c_str(),
                       r.error.c_str());
        return r;
      });
    });
    http.stop();
  };

  if (f.backend == "sim") {
    std::printf("seed=%llu backend=sim world=%d config=%s state_dir=%s\n",
                static_cast<unsigned long long>(f.seed), f.world,
                topts.ds_config_json.c_str(), topts.state_dir.c_str());
    std::fflush(stdout);
    SimWorld world({f.world, f.seed});
    std::vector<std::unique_ptr<tinker::RankTrainer>> trainers(f.world);
    for (int r = 0; r < f.world; ++r)
      trainers[r] = std::make_unique<tinker::RankTrainer>(&world.comm(r), topts);
    world.run([&](int r) {
      if (r == 0) {
        serve_rank0(world.comm(0), *trainers[0]);
      } else {
        tinker::run_follower(world.comm(r), [&](const tinker::Command& c) {
          return trainers[r]->execute(c);
        });
      }
    });
    return 0;
  }
  GlooOptions go;
  go.timeout = std::chrono::seconds(120);
  std::unique_ptr<GlooCommunicator> comm = GlooCommunicator::from_environment(go);
  // Every rank writes and reads the same checkpoint folder: rank 0's choice
  // (on several machines it must be on a shared file system).
  tinker::broadcast_bytes(*comm, &topts.state_dir);
  tinker::RankTrainer trainer(comm.get(), topts);
  if (comm->rank() == 0) {
    std::printf("seed=%llu backend=gloo world=%d config=%s state_dir=%s\n",
                static_cast<unsigned long long>(f.seed), comm->world_size(),
                topts.ds_config_json.c_str(), topts.state_dir.c_str());
    serve_rank0(*comm, trainer);
  } else {
    tinker::run_follower(*comm, [&](const tinker::Command& c) { return trainer.execute(c); });
  }
  return 0;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  try {
    return zerostep::run(argc, argv);
  } catch (const zerostep::Error& e) {
    std::fprintf(stderr, "trainer_server: %s\n", e.what());
    return 2;
  }
}
