// BlockDevice: a named, file-like array of bytes with asynchronous reads and
// writes at byte offsets, an explicit durability barrier (flush), and
// errors that name the device. It is the only way the NVMe swap layer
// (offload/swap_store.h) touches storage, so the same store runs on a real
// file (offload/posix_block_device.h: io_uring, O_DIRECT), on memory
// (offload/memory_block_device.h) and under fault injection
// (offload/faulty_block_device.h).
//
// Contract shared by every implementation:
//  * Alignment: every offset, size and buffer address is a multiple of
//    kBlockAlign (4096), the strictest O_DIRECT requirement of the drives
//    and file systems we target. Every implementation checks it (UsageError),
//    so code that runs on memory also runs with O_DIRECT. AlignedBuffer
//    allocates such memory.
//  * Asynchrony: submit_read/submit_write start an operation and return a
//    ticket at once (an implementation may also complete it before it
//    returns). The buffer belongs to the device until the operation is
//    retired by wait(ticket) or flush(): it must stay allocated, a write's
//    buffer must not be modified, and a read's buffer must not be read.
//    Operations in flight at the same time have no order among themselves;
//    callers never overlap two in-flight operations on the same bytes.
//  * Completion: wait(ticket) blocks until the operation is complete and
//    retires the ticket; it returns normally if every byte was transferred
//    and throws IoError otherwise (the message names the device, the
//    operation, offset, size, and the cause: strerror, short transfer, or
//    simulated crash). poll(ticket) tells without blocking whether wait
//    would return at once. A ticket is waited at most once.
//  * Durability: a completed write is not durable until a later flush()
//    returns. flush() retires every outstanding operation (throwing the
//    first error among them, by submission order), then makes every
//    completed write durable (fdatasync) or throws IoError.
//  * Size: reads and writes lie within [0, size()) (UsageError otherwise;
//    a file that shrank under us gives IoError). reserve(bytes) grows the
//    device to at least `bytes`, allocating the space so that a full disk is
//    reported then (IoError, ENOSPC) rather than in the middle of a write.
//  * Errors: IoError for everything the medium or the OS refuses; UsageError
//    for calls that break this contract (misalignment, an empty or larger
//    than kMaxIoBytes transfer, a range past size(), a reused ticket).
//
// Thread safety: a BlockDevice is used by one thread at a time (the swap
// store's caller). The I/O itself progresses in the kernel (or, for the
// simulated devices, inside wait/flush) without further calls.
//
// Lifetime: destroying a device waits for its operations still in flight
// (their errors are dropped) so no transfer outlives its buffer.
#ifndef ZEROSTEP_OFFLOAD_BLOCK_DEVICE_H_
#define ZEROSTEP_OFFLOAD_BLOCK_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace zerostep {

// Alignment of offsets, sizes and buffers for every BlockDevice.
constexpr size_t kBlockAlign = 4096;

// The largest single operation (Linux transfers at most ~2 GiB per call;
// callers split larger transfers).
constexpr size_t kMaxIoBytes = size_t{1} << 30;

inline constexpr uint64_t round_up_to_block(uint64_t bytes) {
  return (bytes + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
}

// Identifies one submitted operation of one device. 0 is never a ticket.
using IoTicket = uint64_t;

enum class IoOp { kRead, kWrite };
const char* io_op_name(IoOp op);  // "read", "write"

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;

  // What error messages call the device: a file's path, or a simulated
  // device's given name.
  virtual const std::string& name() const = 0;

  // Bytes addressable now.
  virtual uint64_t size() const = 0;

  // Grows the device to at least `bytes` (a multiple of kBlockAlign),
  // allocating the space. No-op if already that large. IoError (ENOSPC
  // names the device, the bytes asked for, and the fix) if it cannot.
  virtual void reserve(uint64_t bytes) = 0;

  // Start copying size bytes at offset into buffer / from buffer to offset.
  // See the contract above for alignment, ownership of the buffer and the
  // range. Misuse is UsageError; a submission the OS refuses is IoError.
  virtual IoTicket submit_read(uint64_t offset, void* buffer, size_t size) = 0;
  virtual IoTicket submit_write(uint64_t offset, const void* buffer,
                                size_t size) = 0;

  // True if wait(ticket) would not block. UsageError for an unknown ticket.
  virtual bool poll(IoTicket ticket) = 0;

  // Blocks until the operation completes and retires the ticket. IoError if
  // it failed or transferred fewer bytes than asked (the message says how
  // many). UsageError for an unknown or already retired ticket.
  virtual void wait(IoTicket ticket) = 0;

  // Retires every outstanding operation, then makes all completed writes
  // durable. IoError if an outstanding operation failed (the first by
  // submission order; the sync is not attempted then) or the sync failed.
  virtual void flush() = 0;

  // Operations submitted and not yet retired.
  virtual size_t in_flight() const = 0;
};

// The message every device uses for a failed operation, e.g.
//   "write of 1048576 bytes at offset 8192 on '/nvme/rank0.swap' failed:
//    No space left on device (errno 28). The drive is full: free space on
//    it or point nvme_path at a drive with room for the optimizer state."
// `cause` is the errno text or another explanation (short transfer,
// simulated crash); a hint is added for ENOSPC and EIO when err is set.
std::string io_error_message(const char* op, uint64_t size, uint64_t offset,
                             const std::string& device, int err,
                             const std::string& cause);

// The message for a failed flush (durability barrier), e.g.
//   "flush (fdatasync) of '/nvme/rank0.swap' failed: Input/output error
//    (errno 5). The drive reported ...".
std::string flush_error_message(const std::string& device, int err,
                                const std::string& cause);

// Checks one operation against the contract: alignment, 0 < size <=
// kMaxIoBytes, and offset + size <= device_size. UsageError naming the
// device and the offending value.
void check_io_request(const std::string& device, const char* op,
                      uint64_t offset, const void* buffer, size_t size,
                      uint64_t device_size);

// Zero-initialised memory aligned to kBlockAlign, sized up to a multiple of
// it. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Throws std::bad_alloc when out of memory.
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_BLOCK_DEVICE_H_
