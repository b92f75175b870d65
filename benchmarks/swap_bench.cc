// swap_bench: how close the NVMe swap store (offload/swap_store.h) comes to
// the disk's sequential bandwidth, measured in the same run on the same
// file system (issue 4 asks for at least 70%).
//
// Every iteration times four things on files in one directory, rotating
// their order:
//   disk write  the bytes one update pass writes (W), written sequentially
//               in 2 MiB operations, 16 in flight (flags below), with
//               PosixBlockDevice (io_uring, O_DIRECT), then fdatasync
//   disk read   the bytes one update pass reads (R), the same way
//   disk mixed  R read and W written at once (below)
//   pass        one SwapStore::update over the whole store: K = 3 arrays
//               (fp32 params, exp_avg, exp_avg_sq) of numel floats, in
//               sub-groups, the function either trivial (it touches
//               nothing: the store's own I/O, checksums and commit) or
//               fused_adam_step with the gradient from memory
// The reported (manual) time is the pass's. Counters:
//   swap_bytes_per_second   (R + W) / pass time (median)
//   disk_read_bytes_per_second, disk_write_bytes_per_second   (medians)
//   swap_over_disk          median over iterations of the paired ratio
//                           (read time + write time) / pass time: 1.0 means
//                           the pass moved its bytes as fast as the disk
//                           reads R and then writes W sequentially; the
//                           pass overlaps reads with writes, so it can
//                           exceed 1 on drives that do both at once
//   swap_over_disk_min, swap_over_disk_max   its spread over iterations
//   swap_over_disk_read, swap_over_disk_write   (R+W)/pass time over the
//                           disk's read / write bandwidth (median ratios)
//   disk_mixed_bytes_per_second   (R + W) / time of a fourth measurement,
//                           "disk mixed": R read and W written at once,
//                           chunks alternating, the same queue depth
//   swap_over_disk_mixed    median paired ratio mixed time / pass time:
//                           the pass against the best this disk does on
//                           the same simultaneous reads and writes
//   disk_mixed_over_sequential   median (read + write time) / mixed time:
//                           above 1, the disk overlaps reads and writes;
//                           below 1, mixing them costs it bandwidth
//   pass_ms, function_ms, wait_ms   medians: the pass, the part inside the
//                           caller's function, the part blocked on I/O
//   pass_cpu_ms             median CPU time of the process during a pass
//                           (all threads, io_uring workers included): on a
//                           shared machine, pass_ms - wait_ms well above
//                           pass_cpu_ms means the pass waited for a CPU
//   direct_io               1 if both files were opened with O_DIRECT (no
//                           page cache: the figures are the drive's); 0
//                           means the file system refused O_DIRECT and the
//                           page cache flatters every figure
//
// Page cache: all I/O uses O_DIRECT where the file system supports it (the
// context records it), so nothing is served from memory; the store's file
// is written once and the disk file once before timing, so allocation of
// fresh extents is not timed either.
//
//   ./bazelw run -c opt //benchmarks:swap_bench -- --swap_dir=/path
//       --benchmark_format=json --benchmark_out=/tmp/swap.json
//       --benchmark_out_format=json     (one command line)
//
// Flags (after Google Benchmark's own):
//   --swap_dir=DIR          where the files go (default: $ZEROSTEP_SWAP_DIR,
//                           else /var/tmp); a fresh subdirectory is made
//                           and removed
//   --swap_numel=N          elements per array (default 64Mi: 768 MiB of
//                           state, 1.5 GiB on disk)
//   --swap_subgroup_numel=N, --swap_buffer_count=N, --swap_io_chunk_bytes=N
//                           (default: SwapStoreOptions's defaults)
//   --swap_disk_chunk_bytes=N, --swap_queue_depth=N   the disk tests'
//                           operation size (2 MiB) and operations in
//                           flight (16): the fastest of the sizes and
//                           depths tried here (docs/benchmarks.md as
//                           of fee84cc)
//   --swap_iterations=N     timed iterations (default 5)
//   --swap_adam_threads=N   fused_adam_step's threads (default 1)
//
// Benchmarks never run under `bazel test`: the target is a cc_binary
// tagged "benchmark".
#include <benchmark/benchmark.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/bench_stats.h"
#include "common/cli.h"
#include "common/errors.h"
#include "offload/block_device.h"
#include "offload/fused_adam.h"
#include "offload/posix_block_device.h"
#include "offload/swap_store.h"

namespace zerostep {
namespace {

struct Flags {
  std::string dir;
  uint64_t numel = uint64_t{64} << 20;
  // The store's defaults unless given.
  size_t subgroup_numel = SwapStoreOptions().subgroup_numel;
  size_t buffer_count = SwapStoreOptions().buffer_count;
  size_t io_chunk_bytes = SwapStoreOptions().io_chunk_bytes;
  size_t disk_chunk_bytes = size_t{2} << 20;
  int queue_depth = 16;
  int iterations = 5;
  int adam_threads = 1;
};
Flags flags;

using bench::median;

// CPU time of the whole process (every thread, io_uring's workers too).
double process_cpu_seconds() {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

using bench::seconds;

std::string filesystem_of(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) return "unknown";
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    default: {
      std::ostringstream os;
      os << "0x" << std::hex << static_cast<unsigned long>(fs.f_type);
      return os.str();
    }
  }
}

// Sequential transfer of [0, bytes) in chunk pieces, depth in flight,
// ending with a flush (fdatasync) as a swap pass does.
void sequential(PosixBlockDevice& dev, IoOp op, uint64_t bytes,
                std::vector<AlignedBuffer>& buffers) {
  const size_t chunk = buffers[0].size();
  std::deque<IoTicket> in_flight;
  size_t next_buffer = 0;
  for (uint64_t off = 0; off < bytes; off += chunk) {
    if (in_flight.size() == buffers.size()) {
      dev.wait(in_flight.front());
      in_flight.pop_front();
    }
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off));
    char* p = buffers[next_buffer].data();
    next_buffer = (next_buffer + 1) % buffers.size();
    in_flight.push_back(op == IoOp::kRead ? dev.submit_read(off, p, n)
                                          : dev.submit_write(off, p, n));
  }
  dev.flush();
}

// Reads [0, read_bytes) and writes [write_at, write_at + write_bytes) at
// the same time, alternating chunk submissions, the buffers split between
// the two streams: what the disk gives a workload that, like a swap pass,
// reads and writes at once. Ends with a flush.
void mixed(PosixBlockDevice& dev, uint64_t read_bytes, uint64_t write_at,
           uint64_t write_bytes, std::vector<AlignedBuffer>& buffers) {
  const size_t chunk = buffers[0].size();
  std::deque<IoTicket> in_flight;
  size_t next_buffer = 0;
  uint64_t r = 0, w = 0;
  bool read_turn = true;
  while (r < read_bytes || w < write_bytes) {
    if (in_flight.size() == buffers.size()) {
      dev.wait(in_flight.front());
      in_flight.pop_front();
    }
    char* p = buffers[next_buffer].data();
    next_buffer = (next_buffer + 1) % buffers.size();
    if ((read_turn && r < read_bytes) || w >= write_bytes) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(chunk, read_bytes - r));
      in_flight.push_back(dev.submit_read(r, p, n));
      r += n;
    } else {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(chunk, write_bytes - w));
      in_flight.push_back(dev.submit_write(write_at + w, p, n));
      w += n;
    }
    read_turn = !read_turn;
  }
  dev.flush();
}

// A scratch directory that is removed with everything in it.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& base) {
    std::string pattern = base + "/zerostep_swap_bench.XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) {
      std::fprintf(stderr,
                   "swap_bench: cannot create a directory in '%s': %s\n",
                   base.c_str(), std::strerror(errno));
      std::exit(2);
    }
    path_ = buf.data();
  }
  ~ScratchDir() {
    for (const std::string& f : files_) ::unlink((path_ + "/" + f).c_str());
    ::rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }
  void track(const std::string& file) { files_.push_back(file); }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

void BM_SwapVsDisk(benchmark::State& state, bool adam) {
  ScratchDir scratch(flags.dir);
  scratch.track("store.swap");
  scratch.track("disk.bin");
  PosixDeviceOptions dev_options;
  auto store_dev = PosixBlockDevice::open_in_directory(
      scratch.path(), "store.swap", dev_options);
  auto disk_dev = PosixBlockDevice::open_in_directory(scratch.path(),
                                                      "disk.bin", dev_options);

  SwapStoreOptions o;
  o.num_arrays = 3;
  o.numel = flags.numel;
  o.subgroup_numel = flags.subgroup_numel;
  o.buffer_count = flags.buffer_count;
  o.io_chunk_bytes = flags.io_chunk_bytes;
  SwapStore store(store_dev.get(), o);

  const uint64_t n = flags.numel;
  std::vector<float> grads(n);
  for (uint64_t i = 0; i < n; ++i) {
    grads[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 2001) - 1000);
  }
  store.write_all([](const SwapSubgroup& s) {
    for (size_t j = 0; j < s.count; ++j) {
      s.arrays[0][j] = 0.5f + 1e-6f * static_cast<float>((s.first + j) % 997);
    }
  });
  AdamStepParams hyper;
  hyper.lr = 1e-4;
  hyper.weight_decay = 0.01;
  int64_t step = 0;
  auto pass = [&] {
    if (adam) {
      hyper.step = ++step;
      store.update([&](const SwapSubgroup& s) {
        FusedAdamOptions threads;
        threads.threads = flags.adam_threads;
        fused_adam_step(s.arrays[0], grads.data() + s.first, s.arrays[1],
                        s.arrays[2], s.count, hyper, threads);
      });
    } else {
      store.update([](const SwapSubgroup&) {});
    }
  };
  pass();  // writes the second copy once: fresh extents are not timed
  const uint64_t read_bytes = store.last_pass_stats().bytes_read;
  const uint64_t write_bytes = store.last_pass_stats().bytes_written;

  std::vector<AlignedBuffer> buffers;
  for (int i = 0; i < flags.queue_depth; ++i) {
    buffers.emplace_back(flags.disk_chunk_bytes);
    std::memset(buffers.back().data(), 0x3C + i, flags.disk_chunk_bytes);
  }
  const uint64_t mixed_write_at = round_up_to_block(read_bytes);
  const uint64_t disk_bytes = mixed_write_at + write_bytes;
  disk_dev->reserve(disk_bytes);
  sequential(*disk_dev, IoOp::kWrite, disk_bytes, buffers);  // allocate

  std::vector<double> t_pass, t_read, t_write, t_fn, t_wait, t_cpu;
  std::vector<double> over_disk, over_read, over_write, t_mixed, over_mixed,
      mixed_over_sequential;
  int rotation = 0;
  for (auto _ : state) {
    double tp = 0, tr = 0, tw = 0, tm = 0, cpu = 0;
    for (int j = 0; j < 4; ++j) {
      switch ((rotation + j) % 4) {
        case 0: {
          const double c0 = process_cpu_seconds();
          tp = seconds(pass);
          cpu = process_cpu_seconds() - c0;
          break;
        }
        case 1:
          tr = seconds(
              [&] { sequential(*disk_dev, IoOp::kRead, read_bytes, buffers); });
          break;
        case 2:
          tw = seconds([&] {
            sequential(*disk_dev, IoOp::kWrite, write_bytes, buffers);
          });
          break;
        default:
          tm = seconds([&] {
            mixed(*disk_dev, read_bytes, mixed_write_at, write_bytes, buffers);
          });
          break;
      }
    }
    rotation = (rotation + 1) % 4;
    const double moved = static_cast<double>(read_bytes + write_bytes);
    t_pass.push_back(tp);
    t_read.push_back(tr);
    t_write.push_back(tw);
    t_fn.push_back(store.last_pass_stats().function_seconds);
    t_wait.push_back(store.last_pass_stats().wait_seconds);
    t_cpu.push_back(cpu);
    t_mixed.push_back(tm);
    over_mixed.push_back(tm / tp);
    mixed_over_sequential.push_back((tr + tw) / tm);
    over_disk.push_back((tr + tw) / tp);
    over_read.push_back((moved / tp) / (read_bytes / tr));
    over_write.push_back((moved / tp) / (write_bytes / tw));
    state.SetIterationTime(tp);
  }
  const double moved = static_cast<double>(read_bytes + write_bytes);
  state.SetBytesProcessed(static_cast<int64_t>(moved) * state.iterations());
  state.counters["swap_bytes_per_second"] = moved / median(t_pass);
  state.counters["disk_read_bytes_per_second"] = read_bytes / median(t_read);
  state.counters["disk_write_bytes_per_second"] = write_bytes / median(t_write);
  state.counters["swap_over_disk"] = median(over_disk);
  state.counters["swap_over_disk_min"] =
      *std::min_element(over_disk.begin(), over_disk.end());
  state.counters["swap_over_disk_max"] =
      *std::max_element(over_disk.begin(), over_disk.end());
  state.counters["swap_over_disk_read"] = median(over_read);
  state.counters["swap_over_disk_write"] = median(over_write);
  state.counters["disk_mixed_bytes_per_second"] = moved / median(t_mixed);
  state.counters["swap_over_disk_mixed"] = median(over_mixed);
  state.counters["disk_mixed_over_sequential"] = median(mixed_over_sequential);
  state.counters["pass_ms"] = median(t_pass) * 1e3;
  state.counters["function_ms"] = median(t_fn) * 1e3;
  state.counters["wait_ms"] = median(t_wait) * 1e3;
  state.counters["pass_cpu_ms"] = median(t_cpu) * 1e3;
  state.counters["read_bytes_per_pass"] = static_cast<double>(read_bytes);
  state.counters["write_bytes_per_pass"] = static_cast<double>(write_bytes);
  state.counters["subgroups"] = static_cast<double>(store.num_subgroups());
  state.counters["buffer_bytes"] = static_cast<double>(store.buffer_bytes());
  state.counters["direct_io"] =
      store_dev->direct_io() && disk_dev->direct_io() ? 1 : 0;
  state.SetLabel(std::string(adam ? "fused_adam_step" : "trivial") + ", " +
                 store_dev->io_engine() +
                 (store_dev->direct_io() ? ", O_DIRECT" : ", page cache"));
}

// "--name=value" for one of our flags; false if arg is not it.
bool parse_flag(const char* arg, const char* name, std::string* value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, "--", 2) != 0 ||
      std::strncmp(arg + 2, name, len) != 0 || arg[2 + len] != '=') {
    return false;
  }
  *value = arg + 3 + len;
  return true;
}

// "--name=N" for one of our count flags: N read whole, from 1 to the
// largest T (common/cli.h); false if arg is not it.
template <typename T>
bool parse_count(const char* arg, const char* name, T* out) {
  std::string v;
  if (!parse_flag(arg, name, &v)) return false;
  const int64_t max = static_cast<int64_t>(std::min<uint64_t>(
      std::numeric_limits<T>::max(), std::numeric_limits<int64_t>::max()));
  *out = static_cast<T>(parse_int(std::string("--") + name, v, 1, max));
  return true;
}

}  // namespace
}  // namespace zerostep

int main(int argc, char** argv) {
  using zerostep::flags;
  benchmark::Initialize(&argc, argv);
  const char* env = std::getenv("ZEROSTEP_SWAP_DIR");
  flags.dir = env != nullptr && *env != '\0' ? env : "/var/tmp";
  try {
    for (int i = 1; i < argc; ++i) {
      using zerostep::parse_count;
      const char* a = argv[i];
      std::string v;
      if (zerostep::parse_flag(a, "swap_dir", &v)) {
        flags.dir = v;
        continue;
      }
      if (!(parse_count(a, "swap_numel", &flags.numel) ||
            parse_count(a, "swap_subgroup_numel", &flags.subgroup_numel) ||
            parse_count(a, "swap_buffer_count", &flags.buffer_count) ||
            parse_count(a, "swap_io_chunk_bytes", &flags.io_chunk_bytes) ||
            parse_count(a, "swap_disk_chunk_bytes", &flags.disk_chunk_bytes) ||
            parse_count(a, "swap_queue_depth", &flags.queue_depth) ||
            parse_count(a, "swap_iterations", &flags.iterations) ||
            parse_count(a, "swap_adam_threads", &flags.adam_threads))) {
        std::fprintf(stderr, "swap_bench: unknown argument '%s'\n", a);
        return 1;
      }
    }
  } catch (const zerostep::Error& e) {
    std::fprintf(stderr, "swap_bench: %s\n", e.what());
    return 1;
  }
  struct stat st;
  if (::stat(flags.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "swap_bench: --swap_dir '%s' is not a directory\n",
                 flags.dir.c_str());
    return 1;
  }
  benchmark::AddCustomContext("swap_dir", flags.dir);
  benchmark::AddCustomContext("swap_dir_filesystem",
                              zerostep::filesystem_of(flags.dir));
  std::ostringstream workload;
  workload << "3 arrays x " << flags.numel << " floats, sub-groups of "
           << flags.subgroup_numel << ", buffer_count " << flags.buffer_count
           << ", io_chunk_bytes " << flags.io_chunk_bytes
           << "; disk tests: " << flags.disk_chunk_bytes << "-byte operations, "
           << flags.queue_depth << " in flight"
           << ", fused_adam_step threads " << flags.adam_threads;
  benchmark::AddCustomContext("workload", workload.str());
  benchmark::AddCustomContext("fused_adam_isa", zerostep::fused_adam_isa());
  for (bool adam : {false, true}) {
    benchmark::RegisterBenchmark(
        adam ? "BM_SwapVsDisk/update:adam" : "BM_SwapVsDisk/update:trivial",
        zerostep::BM_SwapVsDisk, adam)
        ->Iterations(flags.iterations)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
