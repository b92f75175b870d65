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
//   --timeout-s=T        gloo: how long the rendezvous, the connection and
//                        each collective wait for the other ranks (120); a
//                        rank that dies or stops ends the others with a
//                        CommError naming it after at most this long
//                        (at least 5: idle ranks hear from rank 0 every 2 s)
//   --state-dir=DIR      where save_state writes (default
//                        $XDG_STATE_HOME/zerostep/trainer_server, else
//                        ~/.local/state/zerostep/trainer_server: stable
//                        across restarts; with gloo, rank 0's folder is
//                        every rank's, so across machines it must be a
//                        shared file system)
//   --seed=N             seed of every base model's weights (default 1234)
//   --model=NAME=DIR     also serve the Hugging Face folder DIR (Llama 3,
//                        Qwen2 or Qwen3: config.json, safetensors,
//                        tokenizer.json) as the base model NAME; repeatable.
//                        get_info names DIR as its tokenizer, so the SDK's
//                        get_tokenizer() loads it from there; EOS ids come
//                        from its config; stop strings are decoded with
//                        its tokenizer.json (a byte-level BPE)
//   --long-poll-s=T      retrieve_future waits this long before try_again (30)
//   --seq-gap-timeout-s=T  a request waits this long for a missing seq_id (60)
//   --public-url=URL     the base of the download URLs
//                        get_external_weights_urls hands out (default:
//                        http:// and the request's Host header); behind a
//                        TLS proxy, e.g. https://trainer.example.com
//   --api-keys=FILE ...  API keys, tenants' quotas and the HTTP limits:
//                        tools/tinker/access.h (ZEROSTEP_API_KEYS holds
//                        keys too). A --host that is not a loopback address
//                        needs keys or --allow-unauthenticated.
//
// Prints "seed=... options..." and then "listening on http://H:P" once it
// accepts requests. Keys, tenants and limits: README "Running the server
// for a team".
//
// SIGTERM, SIGINT and SIGHUP stop it gracefully (Note [Stopping on a
// signal]): rank 0 logs "trainer_server: got signal N (...); stopping after
// the queued requests", keeps executing commands until the queue is empty
// (the request being executed and every queued one, including any that
// arrive meanwhile, run to the end, so no checkpoint is left half written),
// tells every other rank to stop (the "shutdown" command), stops serving
// HTTP, logs "trainer_server: stopped" and exits 0. A rank other than 0 that
// gets the signal logs it and keeps executing rank 0's commands until that
// "shutdown", then logs "rank R stopped" and exits 0. Results not retrieved
// before HTTP stopped are lost with the process; a signal that arrives
// before main() (while the libraries load) still kills it.
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/gloo_world.h"
#include "common/cli.h"
#include "common/errors.h"
#include "engine/checkpoint_io.h"
#include "sim/sim_world.h"
#include "tools/tinker/access.h"
#include "tools/tinker/checkpoint_paths.h"
#include "tools/tinker/command.h"
#include "tools/tinker/http.h"
#include "tools/tinker/service.h"
#include "tools/tinker/tenancy.h"
#include "tools/tinker/trainer.h"

namespace zerostep {
namespace {

// Note [Stopping on a signal]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A signal mask set in main() covers only main() and the threads it starts
// later; libraries start threads before main() runs (OpenBLAS starts its
// workers when it is loaded), and the kernel may deliver a process-directed
// SIGTERM to any thread that does not block it. With the default action
// that killed the whole process (issue 15: exit 143, queued requests lost).
// A handler installed with sigaction(), unlike a mask, is process-wide, so
// whichever thread takes the signal runs it. The handler only writes the
// signal's number to a pipe (write() is async-signal-safe); SignalStop's
// thread reads it and calls the stop function from an ordinary thread.
// Every thread this program starts after SignalStop blocks the three
// signals, so the handler runs only on SignalStop's thread or on those early
// library threads, and the blocking calls of gloo and HTTP threads never see
// EINTR; SA_RESTART restarts the calls of the others.

int signal_pipe_write_fd = -1;

void on_stop_signal(int sig) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  // Nothing to do if the pipe is full: a stop is pending already.
  [[maybe_unused]] const ssize_t n = write(signal_pipe_write_fd, &byte, 1);
  errno = saved_errno;
}

// Turns SIGTERM, SIGINT and SIGHUP into one call of `stop` on a thread of
// its own (Note [Stopping on a signal]); later signals are logged only.
// Construct it in main()'s thread before any other thread of this program;
// the constructor blocks the signals in the calling thread, so threads
// started afterwards inherit the block. One instance per process. The
// destructor restores the default actions and joins the thread.
class SignalStop {
 public:
  explicit SignalStop(std::function<void(int sig)> stop)
      : stop_(std::move(stop)) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
      throw IoError(std::string("pipe2(): ") + std::strerror(errno));
    read_fd_ = fds[0];
    signal_pipe_write_fd = fds[1];
    fcntl(signal_pipe_write_fd, F_SETFL, O_NONBLOCK);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int sig : kSignals) sigaction(sig, &sa, nullptr);
    // The thread starts with the signals unblocked, so that one thread of
    // ours can always take them.
    thread_ = std::thread([this] { loop(); });
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kSignals) sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }

  ~SignalStop() {
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    for (int sig : kSignals) sigaction(sig, &sa, nullptr);
    const unsigned char quit = 0;  // not a signal number: ends loop()
    [[maybe_unused]] const ssize_t n = write(signal_pipe_write_fd, &quit, 1);
    thread_.join();
    close(read_fd_);
    close(signal_pipe_write_fd);
    signal_pipe_write_fd = -1;
  }

  SignalStop(const SignalStop&) = delete;
  SignalStop& operator=(const SignalStop&) = delete;

 private:
  static constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};

  void loop() {
    bool stopping = false;
    while (true) {
      unsigned char byte = 0;
      const ssize_t n = read(read_fd_, &byte, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n != 1 || byte == 0) return;
      std::fprintf(
          stderr, "trainer_server: got signal %d (%s); %s\n", byte,
          strsignal(byte),
          stopping ? "already stopping" : "stopping after the queued requests");
      if (!stopping) stop_(byte);
      stopping = true;
    }
  }

  std::function<void(int)> stop_;
  int read_fd_ = -1;
  std::thread thread_;
};

struct Flags {
  int port = 8000;
  std::string host = "127.0.0.1";
  std::string config_path;
  int stage = -1;
  int world = 1;
  std::string backend = "sim";
  double timeout_s = 120.0;  // gloo: --timeout-s
  std::string state_dir;
  uint64_t seed = 1234;
  double long_poll_s = 30.0;
  double seq_gap_timeout_s = 60.0;
  std::string public_url;
  std::vector<std::string> models;  // --model=NAME=DIR, in order
  tinker::AccessFlags access;
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
      std::printf(
          "usage: trainer_server [--port=P] [--host=H] [--config=FILE] "
          "[--stage=S] [--world=W] [--backend=sim|gloo] [--timeout-s=T] "
          "[--state-dir=DIR] [--seed=N] [--long-poll-s=T] "
          "[--seq-gap-timeout-s=T] [--public-url=URL] "
          "[--model=NAME=DIR ...] %s\n",
          tinker::access_flags_usage().c_str());
      std::exit(0);
    } else if (value(a, "port", &v))
      f.port = static_cast<int>(parse_int("--port", v, 0, 65535, 8000));
    else if (value(a, "host", &v))
      f.host = v;
    else if (value(a, "config", &v))
      f.config_path = v;
    else if (value(a, "stage", &v))
      f.stage = static_cast<int>(parse_int("--stage", v, 0, 3));
    else if (value(a, "world", &v))
      f.world = static_cast<int>(parse_int("--world", v, 1, 4096));
    else if (value(a, "backend", &v))
      f.backend = v;
    else if (value(a, "timeout-s", &v))
      f.timeout_s = parse_double("--timeout-s", v, 5, 86400, 120.0);
    else if (value(a, "state-dir", &v))
      f.state_dir = v;
    else if (value(a, "seed", &v))
      f.seed = parse_uint64("--seed", v);
    else if (value(a, "model", &v))
      f.models.push_back(v);
    else if (value(a, "long-poll-s", &v))
      f.long_poll_s = parse_double("--long-poll-s", v, 0, 3600, 30.0);
    else if (value(a, "seq-gap-timeout-s", &v))
      f.seq_gap_timeout_s =
          parse_double("--seq-gap-timeout-s", v, 0, 86400, 60.0);
    else if (value(a, "public-url", &v)) {
      while (!v.empty() && v.back() == '/') v.pop_back();
      if (v.rfind("http://", 0) != 0 && v.rfind("https://", 0) != 0)
        throw UsageError("--public-url='" + v +
                         "' must start with http:// or https:// (the base "
                         "clients download external weights from)");
      f.public_url = v;
    } else if (tinker::parse_access_flag(a, &f.access))
      continue;
    else
      throw UsageError("trainer_server: unknown argument '" + a +
                       "' (see --help)");
  }
  if (f.backend != "sim" && f.backend != "gloo")
    throw UsageError("--backend must be sim or gloo, not '" + f.backend + "'");
  return f;
}

std::string ds_config_text(const Flags& f) {
  nlohmann::json doc = nlohmann::json::object();
  if (!f.config_path.empty()) {
    try {
      doc = nlohmann::json::parse(read_file(f.config_path));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError("--config '" + f.config_path +
                       "' is not JSON: " + e.what());
    }
  }
  if (f.stage >= 0) doc["zero_optimization"]["stage"] = f.stage;
  return doc.dump();
}

// Once, by rank 0: what the config's "auto" became (Note [Trainer values]
// in config/trainer_values.h; tinker::server_trainer_values()).
void print_filled_auto(const std::string& ds_config_json, int world_size) {
  const std::string note =
      filled_auto_note(tinker::server_config(ds_config_json, world_size));
  if (!note.empty()) std::printf("%s\n", note.c_str());
}

// The state folder (checkpoints, sampler weights) is created and written
// once before any request is served: a save_weights that failed hours into
// a run would lose what it was asked to keep. Empty if `dir` could be
// created and a file written and removed there; else the IoError's text.
std::string state_dir_problem(const std::string& dir, int rank) {
  try {
    make_dirs(dir);
    const std::string probe = dir + "/.write-probe-rank" +
                              std::to_string(rank) + "-" +
                              std::to_string(getpid());
    atomic_write_file(probe, "ok");
    if (unlink(probe.c_str()) != 0)
      return "cannot remove " + probe + ": " + std::strerror(errno);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

[[noreturn]] void refuse_state_dir(const std::string& dir,
                                   const std::string& problem) {
  throw UsageError("the state folder '" + dir + "' (--state-dir) " + problem +
                   ". Fix: give --state-dir a folder this user can create "
                   "and write (with several machines, one they share)");
}

// The served base models, "NAME[=DIR],..." (the start line).
std::string served_models() {
  std::string out;
  for (const tinker::BaseModel& b : tinker::base_models())
    out += (out.empty() ? "" : ",") + b.name +
           (b.is_hf() ? "=" + b.hf_dir : std::string());
  return out;
}

int run(int argc, char** argv) {
  const Flags f = parse_flags(argc, argv);
  {
    std::vector<tinker::BaseModel> folders;
    for (const std::string& m : f.models) {
      const auto [name, dir] = tinker::split_model_flag(m);
      folders.push_back(tinker::hf_base_model(name, dir));
    }
    tinker::serve_hf_base_models(folders);  // before any thread starts
  }
  tinker::TrainerOptions topts;
  topts.ds_config_json = ds_config_text(f);
  topts.base_seed = f.seed;
  // Note [A model that cannot fit] (tools/tinker/model_registry.h).
  topts.ranks_in_process = f.backend == "sim" ? f.world : 1;
  topts.available_memory = available_memory;
  // Stable across restarts, so the last run's checkpoints are found.
  topts.state_dir =
      f.state_dir.empty() ? tinker::default_state_dir() : f.state_dir;
  tinker::ServiceOptions sopts;
  sopts.long_poll_s = f.long_poll_s;
  sopts.seq_gap_timeout_s = f.seq_gap_timeout_s;
  sopts.state_dir = topts.state_dir;
  sopts.public_url = f.public_url;
  for (const auto& b : tinker::base_models())
    sopts.models.push_back({b.name, b.max_context});
  tinker::Service service(sopts);
  // Before any thread of ours starts (Note [Stopping on a signal]). On a
  // rank other than 0 `service` is idle and stop() changes nothing: the rank
  // stops at rank 0's "shutdown" command.
  SignalStop signal_stop([&](int) { service.stop(); });
  at::set_num_threads(1);  // tiny models; ranks are the parallelism
  auto log = [](const std::string& line) {
    std::fprintf(stderr, "trainer_server: %s\n", line.c_str());
  };
  // Rank 0's: the keys and the HTTP front (tools/tinker/access.h), made
  // before anything starts so that a refused --host or a bad keys file
  // stops the server at once.
  tinker::Access access;
  std::unique_ptr<tinker::HttpServer> http;
  auto prepare_rank0 = [&] {
    access = tinker::make_access(f.access, f.host,
                                 std::getenv("ZEROSTEP_API_KEYS"), log);
    http = std::make_unique<tinker::HttpServer>(
        [&service](const tinker::HttpRequest& r) { return service.handle(r); },
        access.http);
    const std::vector<std::string> old =
        tinker::pre_tenant_run_folders(topts.state_dir);
    if (!old.empty())
      log("the state folder holds " + std::to_string(old.size()) +
          (old.size() == 1 ? " run folder" : " run folders") +
          " from before tenants (" + old.front() +
          (old.size() > 1 ? ", ..." : "") +
          "), which this server does not read: checkpoints now live in "
          "<state dir>/tenants/<tenant>/. Fix: move them into " +
          tinker::tenant_dir(topts.state_dir, tinker::kDefaultTenant) +
          "/ (or tenants/<name>/ for a tenant of the keys file)");
  };

  auto serve_rank0 = [&](Communicator& comm, tinker::RankTrainer& trainer) {
    const int port = http->start(f.host, f.port);
    std::printf("listening on http://%s:%d\n", f.host.c_str(), port);
    std::fflush(stdout);
    service.run_rank0([&](const tinker::Command& c) {
      return tinker::broadcast_and_execute(
          comm, c, [&](const tinker::Command& x) {
            tinker::CommandResult r = trainer.execute(x);
            if (!r.ok && r.category == "server")
              std::fprintf(stderr, "trainer_server: %s failed: %s\n",
                           x.op.c_str(), r.error.c_str());
            return r;
          });
    });
    http->stop();
    std::fprintf(stderr, "trainer_server: stopped\n");
  };

  if (f.backend == "sim") {
    const std::string problem = state_dir_problem(topts.state_dir, 0);
    if (!problem.empty())
      refuse_state_dir(topts.state_dir, "cannot be used: " + problem);
    prepare_rank0();
    std::printf(
        "seed=%llu backend=sim world=%d config=%s state_dir=%s api_keys=%s "
        "models=%s\n",
        static_cast<unsigned long long>(f.seed), f.world,
        topts.ds_config_json.c_str(), topts.state_dir.c_str(),
        access.summary.c_str(), served_models().c_str());
    print_filled_auto(topts.ds_config_json, f.world);
    std::fflush(stdout);
    SimWorld world({f.world, f.seed});
    std::vector<std::unique_ptr<tinker::RankTrainer>> trainers(f.world);
    for (int r = 0; r < f.world; ++r)
      trainers[r] =
          std::make_unique<tinker::RankTrainer>(&world.comm(r), topts);
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
  go.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000.0));
  std::unique_ptr<GlooCommunicator> comm =
      GlooCommunicator::from_environment(go);
  // Every rank writes and reads the same checkpoint folder: rank 0's choice
  // (on several machines it must be on a shared file system).
  tinker::broadcast_bytes(*comm, &topts.state_dir);
  {
    // Every rank writes there: each checks, and all stop if one cannot,
    // naming the lowest such rank.
    const std::string problem =
        state_dir_problem(topts.state_dir, comm->rank());
    int64_t first_bad = problem.empty() ? INT64_MAX : comm->rank();
    comm->all_reduce(Buffer::of(&first_bad, 1), {ReduceOp::kMin, "setup"});
    if (!problem.empty())
      refuse_state_dir(topts.state_dir, "cannot be used on rank " +
                                            std::to_string(comm->rank()) +
                                            ": " + problem);
    if (first_bad != INT64_MAX)
      refuse_state_dir(topts.state_dir, "cannot be used on rank " +
                                            std::to_string(first_bad) +
                                            " (its own message says why)");
  }
  tinker::RankTrainer trainer(comm.get(), topts);
  if (comm->rank() == 0) {
    prepare_rank0();
    std::printf(
        "seed=%llu backend=gloo world=%d config=%s state_dir=%s "
        "api_keys=%s models=%s\n",
        static_cast<unsigned long long>(f.seed), comm->world_size(),
        topts.ds_config_json.c_str(), topts.state_dir.c_str(),
        access.summary.c_str(), served_models().c_str());
    print_filled_auto(topts.ds_config_json, comm->world_size());
    serve_rank0(*comm, trainer);
  } else {
    tinker::run_follower(
        *comm, [&](const tinker::Command& c) { return trainer.execute(c); });
    std::fprintf(stderr, "trainer_server: rank %d stopped\n", comm->rank());
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
  } catch (const std::exception& e) {  // LibTorch's c10::Error, bad_alloc
    std::fprintf(stderr, "trainer_server: failed: %s\n",
                 zerostep::message_without_backtrace(e).c_str());
    return 1;
  }
}
