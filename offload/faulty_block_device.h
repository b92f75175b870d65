// FaultyBlockDevice: a decorator around any BlockDevice that injects storage
// faults at chosen operations or at seeded random ones, and simulates power
// loss. It is how the NVMe swap layer is shown to survive faults (the store
// never sees a flag saying it is being tested), and it is a product feature
// of the simulator: a simulated run can put one under each rank's store.
//
// Faults (IoFaultKind) and the operations they apply to:
//   kIoError    read, write, flush, reserve: the operation fails with EIO.
//               A failed read leaves garbage (0xA5 bytes) in the buffer; a
//               failed write changes nothing; a failed flush makes nothing
//               durable (the writes since the last good flush stay
//               volatile, as after a real fsync error).
//   kNoSpace    write, flush, reserve: fails with ENOSPC; nothing changes.
//   kShortWrite write: a seeded prefix of the data (a multiple of
//               sector_bytes, shorter than the write, possibly empty)
//               reaches the medium, then the write fails with ENOSPC, as a
//               kernel's short write on a filling drive does.
//   kTornWrite  write: a seeded prefix reaches the medium and the device
//               crashes at that instant (see crash()).
//   kCrash      any operation: the device crashes before the operation runs.
//
// Crash (power loss): the writes completed since the last successful flush
// are volatile. With options.lose_unsynced_on_crash (default), each of them
// independently, by a seeded draw, stays, is lost, or stays only as a
// sector-aligned prefix, so a store that relied on a write without flushing
// it is caught. Afterwards every operation fails (IoError "simulated
// crash") until restart(), which models the reboot: what the medium holds
// then is what the crash left.
//
// Every operation is forwarded to the inner device and completed (waited)
// before submit_* returns, so a fault lands at an exact point and a run is
// replayable: the same seed, schedule and sequence of calls inject the same
// faults at the same operations with the same prefixes. describe() names
// the seed and every fault injected, for failure messages.
//
// Operation numbering: operations of each OpKind are counted from 0 since
// construction, separately per kind (count(kind)); schedule(kWrite, 7, ...)
// faults the eighth write ever submitted. Counting continues across
// crashes and restarts.
//
// Thread safety and lifetime: as BlockDevice; *inner must outlive the
// decorator, and is only used through it while the decorator exists.
#ifndef ZEROSTEP_OFFLOAD_FAULTY_BLOCK_DEVICE_H_
#define ZEROSTEP_OFFLOAD_FAULTY_BLOCK_DEVICE_H_

#include <cstdint>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/errors.h"
#include "offload/block_device.h"

namespace zerostep {

enum class IoFaultKind { kIoError, kNoSpace, kShortWrite, kTornWrite, kCrash };
enum class OpKind { kRead, kWrite, kFlush, kReserve };

const char* io_fault_kind_name(IoFaultKind kind);  // "io_error", "no_space", ...
const char* op_kind_name(OpKind kind);        // "read", "write", ...
// Whether `fault` can be injected into an operation of kind `op` (above).
bool fault_applies(IoFaultKind fault, OpKind op);

struct FaultyDeviceOptions {
  // Seeds every draw (random faults, prefixes, crash losses). Default 0.
  uint64_t seed = 0;
  // Probability in [0, 1] that an operation draws a random fault, chosen
  // uniformly among random_faults that apply to it. Default 0: only
  // scheduled faults.
  double fault_probability = 0.0;
  // The faults random draws pick from. Default: all five.
  std::vector<IoFaultKind> random_faults = {
      IoFaultKind::kIoError, IoFaultKind::kNoSpace, IoFaultKind::kShortWrite,
      IoFaultKind::kTornWrite, IoFaultKind::kCrash};
  // On a crash, volatile writes may be lost or torn (above). false: they
  // all stay. Default true.
  bool lose_unsynced_on_crash = true;
  // Granularity of short and torn prefixes: a power of two dividing
  // kBlockAlign. Default 512 (a disk sector).
  size_t sector_bytes = 512;
};

// One injected fault, for describe() and tests.
struct InjectedFault {
  OpKind op;
  uint64_t op_index;  // the op_index-th operation of its kind (from 0)
  IoFaultKind fault;
  uint64_t offset = 0;  // read/write: the operation's range
  uint64_t size = 0;
  uint64_t prefix_bytes = 0;  // short/torn writes: bytes that reached it
  std::string describe() const;
};

class FaultyBlockDevice final : public BlockDevice {
 public:
  // UsageError if inner is null or the options are out of range.
  FaultyBlockDevice(BlockDevice* inner,
                    const FaultyDeviceOptions& options = FaultyDeviceOptions());
  ~FaultyBlockDevice() override = default;
  FaultyBlockDevice(const FaultyBlockDevice&) = delete;
  FaultyBlockDevice& operator=(const FaultyBlockDevice&) = delete;

  // Injects `fault` into the index-th operation of kind `op` (counted as
  // described above). UsageError if the fault does not apply to that kind
  // or that operation was already submitted. A scheduled fault wins over
  // a random draw for the same operation.
  void schedule(OpKind op, uint64_t index, IoFaultKind fault);
  // Drops every scheduled fault not yet injected.
  void clear_schedule();

  // Power loss now (see header comment). Idempotent while crashed.
  void crash();
  // The reboot after a crash: operations are accepted again; nothing is
  // volatile. No-op if not crashed.
  void restart();
  bool crashed() const { return crashed_; }

  // Operations of `op` submitted so far (including failed ones).
  uint64_t count(OpKind op) const;
  const std::vector<InjectedFault>& injected() const { return injected_; }
  // "FaultyBlockDevice(seed=.., fault_probability=..) over '<name>';
  //  injected: write #3: torn_write at offset .. (.. of .. bytes); ..."
  std::string describe() const;

  const std::string& name() const override { return inner_->name(); }
  uint64_t size() const override { return inner_->size(); }
  void reserve(uint64_t bytes) override;
  IoTicket submit_read(uint64_t offset, void* buffer, size_t size) override;
  IoTicket submit_write(uint64_t offset, const void* buffer,
                        size_t size) override;
  bool poll(IoTicket ticket) override;
  void wait(IoTicket ticket) override;
  void flush() override;
  size_t in_flight() const override { return results_.size(); }

 private:
  struct VolatileWrite {
    uint64_t offset;
    std::vector<char> before;  // the medium's bytes before the write
    std::vector<char> after;   // what the write put there
  };

  // The fault for the next operation of kind `op` (kNone: none), counting
  // it. Scheduled faults first, then the random draw.
  bool next_fault(OpKind op, IoFaultKind* fault);
  [[noreturn]] void throw_crashed(const char* op, uint64_t size,
                                  uint64_t offset) const;
  IoError injected_error(const InjectedFault& f, int err,
                         const std::string& cause) const;
  // Synchronous helpers on the inner device.
  void inner_read(uint64_t offset, char* buffer, size_t size);
  void inner_write(uint64_t offset, const char* buffer, size_t size);
  // Writes the first `prefix` bytes of data over the medium at offset
  // (block-granular on the inner device, keeping `before` beyond the
  // prefix) and records it as volatile.
  void write_prefix(uint64_t offset, const char* data, size_t size,
                    size_t prefix, std::vector<char> before);
  uint64_t draw_prefix(size_t size);
  IoTicket complete(std::exception_ptr error);

  BlockDevice* inner_;
  FaultyDeviceOptions options_;
  std::mt19937_64 rng_;
  uint64_t counts_[4] = {0, 0, 0, 0};
  std::map<std::pair<int, uint64_t>, IoFaultKind> schedule_;
  std::vector<InjectedFault> injected_;
  std::vector<VolatileWrite> volatile_;
  bool crashed_ = false;
  std::string crash_cause_;
  IoTicket next_ticket_ = 1;
  std::map<IoTicket, std::exception_ptr> results_;  // null: success
};

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_FAULTY_BLOCK_DEVICE_H_
