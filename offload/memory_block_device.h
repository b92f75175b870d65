// MemoryBlockDevice: a BlockDevice (offload/block_device.h) whose medium is
// a byte vector. The simulator's storage: the NVMe swap store runs on it in
// tests and simulated runs, and offload/faulty_block_device.h decorates it.
//
// Deterministic, deferred completion: an operation does nothing when it is
// submitted; it executes (copies its bytes) when wait() or flush() reaches
// it, and operations execute in submission order. poll() reports an
// operation done only once it has executed. This makes the contract's rules
// on buffer ownership observable: a caller that reads a read buffer before
// waiting sees stale bytes, and one that reuses a write buffer before
// waiting writes the new contents, so such bugs fail tests instead of
// passing by luck.
//
// There is no volatile cache: every executed write is on the medium (the
// fault decorator models what a crash loses). flush() counts barriers.
//
// Thread safety and lifetime: as BlockDevice. The medium lives as long as
// the object; tests reopen a store on the same device to simulate a
// restart.
#ifndef ZEROSTEP_OFFLOAD_MEMORY_BLOCK_DEVICE_H_
#define ZEROSTEP_OFFLOAD_MEMORY_BLOCK_DEVICE_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "offload/block_device.h"

namespace zerostep {

class MemoryBlockDevice final : public BlockDevice {
 public:
  static constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

  // `name` is what error messages call the device (e.g. the path a real
  // run would use). reserve() beyond capacity_bytes is ENOSPC.
  explicit MemoryBlockDevice(std::string name,
                             uint64_t capacity_bytes = kUnlimited);
  ~MemoryBlockDevice() override = default;
  MemoryBlockDevice(const MemoryBlockDevice&) = delete;
  MemoryBlockDevice& operator=(const MemoryBlockDevice&) = delete;

  const std::string& name() const override { return name_; }
  uint64_t size() const override { return medium_.size(); }
  // Grows the medium with zero bytes. IoError (ENOSPC, naming the device)
  // beyond capacity_bytes.
  void reserve(uint64_t bytes) override;
  IoTicket submit_read(uint64_t offset, void* buffer, size_t size) override;
  IoTicket submit_write(uint64_t offset, const void* buffer,
                        size_t size) override;
  bool poll(IoTicket ticket) override;
  void wait(IoTicket ticket) override;
  void flush() override;
  size_t in_flight() const override { return ops_.size(); }

  // The medium, for tests (e.g. to corrupt a byte) and for inspection.
  std::vector<char>& medium() { return medium_; }
  const std::vector<char>& medium() const { return medium_; }
  uint64_t flush_count() const { return flushes_; }

 private:
  struct Op {
    IoOp op;
    uint64_t offset;
    char* buffer;
    size_t size;
    bool done = false;
  };
  // Executes every queued operation up to and including `ticket`.
  void execute_through(IoTicket ticket);

  std::string name_;
  uint64_t capacity_;
  std::vector<char> medium_;
  IoTicket next_ticket_ = 1;
  std::map<IoTicket, Op> ops_;  // submitted, not yet retired
  uint64_t flushes_ = 0;
};

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_MEMORY_BLOCK_DEVICE_H_
