// PosixBlockDevice: a BlockDevice on a file (or a raw block device such as
// /dev/nvme0n1), with asynchronous I/O through io_uring and O_DIRECT where
// the file system supports it. The production device under nvme_path.
//
//  * io_uring (liburing): submit_* queues one SQE and submits it; the kernel
//    moves the data while the caller computes; wait() reaps completions.
//    If the kernel refuses io_uring (ENOSYS on old kernels, EPERM under a
//    seccomp filter, kernel.io_uring_disabled), or options.use_io_uring is
//    false, each operation runs synchronously with pread/pwrite inside
//    submit_* instead: same results, no overlap. io_engine() says which.
//  * O_DIRECT (options.direct_io, default on) bypasses the page cache, so a
//    swap pass moves the bytes to the drive and does not evict the
//    training job's memory. File systems that refuse O_DIRECT (tmpfs: open
//    fails with EINVAL) get a buffered file instead; direct_io() says which.
//  * Short transfers: the remainder is retried synchronously; if the retry
//    fails (typically ENOSPC or EFBIG) the IoError names the errno and how
//    many bytes were transferred first. A read that meets end of file is
//    an IoError ("file is N bytes: truncated?").
//  * flush() is fdatasync(2) (the file's data and the metadata needed to
//    read it, including the extents reserve() allocated).
//  * The file is locked (flock, exclusive, non-blocking) for the device's
//    lifetime so that two processes (two ranks given the same nvme_path and
//    file name) cannot swap into the same file; the second gets IoError.
//
// Thread safety and lifetime: as BlockDevice (offload/block_device.h). The
// destructor waits for operations in flight, then unlocks and closes.
#ifndef ZEROSTEP_OFFLOAD_POSIX_BLOCK_DEVICE_H_
#define ZEROSTEP_OFFLOAD_POSIX_BLOCK_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "offload/block_device.h"

namespace zerostep {

struct PosixDeviceOptions {
  // Try O_DIRECT; fall back to buffered I/O where the file system refuses
  // it. Default true.
  bool direct_io = true;
  // Use io_uring; false runs every operation synchronously with
  // pread/pwrite at submission. Default true (with the automatic fallback
  // described above).
  bool use_io_uring = true;
  // io_uring submission queue entries: the most operations in flight; a
  // submission beyond it first waits for one to complete. Default 64.
  unsigned queue_depth = 64;
  // Create the file if it does not exist (mode 0600). Default true.
  bool create = true;
  // Empty a regular file once it is locked (what an earlier run left in it
  // is discarded: the engine starts every run from a fresh state). Default
  // false.
  bool truncate = false;
};

class PosixBlockDevice final : public BlockDevice {
 public:
  // Opens (creating if options.create) the file `file_name` inside the
  // existing directory `dir` (nvme_path). IoError, naming the path and the
  // fix, if dir does not exist, is not a directory, is not writable, or the
  // file cannot be opened or locked. The new file's directory entry is made
  // durable (fsync of dir). UsageError if file_name is empty or contains '/'.
  static std::unique_ptr<PosixBlockDevice> open_in_directory(
      const std::string& dir, const std::string& file_name,
      const PosixDeviceOptions& options = PosixDeviceOptions());

  // Opens `path` (a regular file, created if options.create, or a block
  // device). IoError as above.
  static std::unique_ptr<PosixBlockDevice> open(
      const std::string& path,
      const PosixDeviceOptions& options = PosixDeviceOptions());

  ~PosixBlockDevice() override;
  PosixBlockDevice(const PosixBlockDevice&) = delete;
  PosixBlockDevice& operator=(const PosixBlockDevice&) = delete;

  const std::string& name() const override { return path_; }
  uint64_t size() const override { return size_; }
  // Regular file: posix_fallocate to `bytes` (falling back to ftruncate
  // where the file system cannot allocate, e.g. EOPNOTSUPP); a block device
  // cannot grow: ENOSPC IoError if it is smaller than `bytes`.
  void reserve(uint64_t bytes) override;
  IoTicket submit_read(uint64_t offset, void* buffer, size_t size) override;
  IoTicket submit_write(uint64_t offset, const void* buffer,
                        size_t size) override;
  bool poll(IoTicket ticket) override;
  void wait(IoTicket ticket) override;
  void flush() override;
  size_t in_flight() const override { return ops_.size(); }

  // Whether the file was opened with O_DIRECT.
  bool direct_io() const { return direct_io_; }
  // "io_uring", or "pread/pwrite (...why...)" for the synchronous fallback.
  const std::string& io_engine() const { return io_engine_; }

 private:
  struct Ring;  // liburing state; kept out of this header
  struct Op {
    IoOp op;
    uint64_t offset;
    char* buffer;
    size_t size;
    bool done = false;
    int64_t result = 0;  // bytes transferred, or -errno
  };

  PosixBlockDevice(std::string path, int fd, bool direct_io, bool block_dev,
                   uint64_t size, const PosixDeviceOptions& options);
  IoTicket submit(IoOp op, uint64_t offset, char* buffer, size_t size);
  // Reaps at least one completion (blocking) if `block`, else whatever is
  // ready.
  void reap(bool block);
  // Turns a completed op into success (finishing a short transfer
  // synchronously) or IoError.
  void finish(const Op& op);
  void drain_noexcept();

  std::string path_;
  int fd_;
  bool direct_io_;
  bool block_device_;
  uint64_t size_;
  std::unique_ptr<Ring> ring_;  // null: synchronous fallback
  std::string io_engine_;
  IoTicket next_ticket_ = 1;
  std::map<IoTicket, Op> ops_;  // submitted, not yet retired
  size_t pending_ = 0;          // submitted to the ring, not yet reaped
  unsigned queue_depth_ = 1;
  std::string broken_;  // why the ring can no longer be used ("" if fine)
};

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_POSIX_BLOCK_DEVICE_H_
