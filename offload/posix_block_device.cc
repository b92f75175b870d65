#include "offload/posix_block_device.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

#include "common/errors.h"

namespace zerostep {

struct PosixBlockDevice::Ring {
  struct io_uring ring;
};

namespace {

std::string errno_text(int err) { return std::strerror(err); }

// The fix to suggest when `path` (or its directory) refuses us.
std::string access_fix(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
      return ". Fix: make the directory writable by this process (uid " +
             std::to_string(getuid()) +
             "), or set nvme_path to a directory it can write";
    case EROFS:
      return ". Fix: the file system is read-only; set nvme_path to a "
             "directory on a writable drive";
    case ENOENT:
      return ". Fix: create the directory (mkdir -p) or set nvme_path to an "
             "existing directory";
    case ENOTDIR:
      return ". Fix: a component of the path is not a directory; set "
             "nvme_path to a directory";
    case ENOSPC:
    case EDQUOT:
      return ". Fix: the drive is full; free space or use another nvme_path";
    default:
      return "";
  }
}

[[noreturn]] void throw_open_error(const std::string& what,
                                   const std::string& path, int err) {
  std::ostringstream os;
  os << what << " '" << path << "': " << errno_text(err) << " (errno " << err
     << ")" << access_fix(err);
  throw IoError(os.str());
}

// One synchronous transfer of [done, size) with pread/pwrite, retrying
// EINTR. Returns the bytes transferred by the first call (>= 0) or -errno.
int64_t sync_transfer(int fd, IoOp op, char* buffer, size_t size,
                      uint64_t offset) {
  for (;;) {
    const ssize_t n =
        op == IoOp::kRead
            ? ::pread(fd, buffer, size, static_cast<off_t>(offset))
            : ::pwrite(fd, buffer, size, static_cast<off_t>(offset));
    if (n >= 0) return n;
    if (errno != EINTR) return -errno;
  }
}

}  // namespace

std::unique_ptr<PosixBlockDevice> PosixBlockDevice::open_in_directory(
    const std::string& dir, const std::string& file_name,
    const PosixDeviceOptions& options) {
  if (file_name.empty() || file_name.find('/') != std::string::npos) {
    throw UsageError("PosixBlockDevice::open_in_directory: file name '" +
                     file_name + "' must be non-empty and contain no '/'");
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      throw IoError("nvme_path '" + dir +
                    "' does not exist. Fix: create it (mkdir -p '" + dir +
                    "') or set nvme_path to an existing directory on the "
                    "drive that should hold the optimizer state");
    }
    throw_open_error("cannot use nvme_path", dir, err);
  }
  if (!S_ISDIR(st.st_mode)) {
    throw IoError("nvme_path '" + dir +
                  "' is not a directory. Fix: set nvme_path to a directory "
                  "(zerostep creates its swap files inside it)");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw_open_error("nvme_path is not writable:", dir, errno);
  }
  const std::string path =
      dir.back() == '/' ? dir + file_name : dir + "/" + file_name;
  std::unique_ptr<PosixBlockDevice> device = open(path, options);
  // Make the (possibly new) directory entry durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw_open_error("cannot open nvme_path", dir, errno);
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0) throw_open_error("cannot fsync nvme_path", dir, err);
  return device;
}

std::unique_ptr<PosixBlockDevice> PosixBlockDevice::open(
    const std::string& path, const PosixDeviceOptions& options) {
  const int base = O_RDWR | O_CLOEXEC | (options.create ? O_CREAT : 0);
  bool direct = options.direct_io;
  int fd = ::open(path.c_str(), base | (direct ? O_DIRECT : 0), 0600);
  if (fd < 0 && direct && errno == EINVAL) {
    // The file system does not do O_DIRECT: use the page cache.
    direct = false;
    fd = ::open(path.c_str(), base, 0600);
  }
  if (fd < 0) throw_open_error("cannot open swap file", path, errno);

  auto fail = [&](const std::string& what, int err) {
    ::close(fd);
    throw_open_error(what, path, err);
  };
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      throw IoError("swap file '" + path +
                    "' is in use by another process (it holds the lock). "
                    "Fix: give every rank its own file or nvme_path");
    }
    throw_open_error("cannot lock swap file", path, err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) fail("cannot stat swap file", errno);
  uint64_t size = 0;
  bool block_dev = false;
  if (S_ISREG(st.st_mode)) {
    // Only once we hold the lock: a file in use elsewhere is never cut.
    if (options.truncate && st.st_size != 0) {
      if (::ftruncate(fd, 0) != 0) fail("cannot truncate swap file", errno);
      st.st_size = 0;
    }
    size = static_cast<uint64_t>(st.st_size);
  } else if (S_ISBLK(st.st_mode)) {
    block_dev = true;
    if (::ioctl(fd, BLKGETSIZE64, &size) != 0) {
      fail("cannot read the size of block device", errno);
    }
  } else {
    ::close(fd);
    throw IoError("swap file '" + path +
                  "' is neither a regular file nor a block device. Fix: "
                  "point nvme_path at a directory on a drive");
  }
  return std::unique_ptr<PosixBlockDevice>(
      new PosixBlockDevice(path, fd, direct, block_dev, size, options));
}

PosixBlockDevice::PosixBlockDevice(std::string path, int fd, bool direct_io,
                                   bool block_dev, uint64_t size,
                                   const PosixDeviceOptions& options)
    : path_(std::move(path)),
      fd_(fd),
      direct_io_(direct_io),
      block_device_(block_dev),
      size_(size) {
  if (!options.use_io_uring) {
    io_engine_ = "pread/pwrite (io_uring off by option)";
    return;
  }
  auto ring = std::make_unique<Ring>();
  const unsigned depth = options.queue_depth < 1 ? 1 : options.queue_depth;
  const int rc = io_uring_queue_init(depth, &ring->ring, 0);
  if (rc < 0) {
    io_engine_ = "pread/pwrite (io_uring unavailable: " + errno_text(-rc) + ")";
    return;
  }
  ring_ = std::move(ring);
  queue_depth_ = depth;
  io_engine_ = "io_uring";
}

PosixBlockDevice::~PosixBlockDevice() {
  drain_noexcept();
  if (ring_ != nullptr) io_uring_queue_exit(&ring_->ring);
  ::close(fd_);  // also releases the flock
}

void PosixBlockDevice::drain_noexcept() {
  while (pending_ > 0) {
    try {
      reap(true);
    } catch (...) {
      // The ring itself failed; nothing more can be reaped.
      return;
    }
  }
}

void PosixBlockDevice::reserve(uint64_t bytes) {
  bytes = round_up_to_block(bytes);
  if (bytes <= size_) return;
  if (block_device_) {
    std::ostringstream os;
    os << "block device '" << path_ << "' holds " << size_
       << " bytes but the swap store needs " << bytes
       << ". Fix: use a larger device or a directory on a file system";
    throw IoError(os.str());
  }
  int rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes));
  int err = rc == 0 ? 0 : errno;
  if (err == EOPNOTSUPP || err == ENOSYS) {
    // No allocation on this file system: a sparse file must do.
    rc = ::ftruncate(fd_, static_cast<off_t>(bytes));
    err = rc == 0 ? 0 : errno;
  }
  struct stat st;
  if (::fstat(fd_, &st) == 0) size_ = static_cast<uint64_t>(st.st_size);
  if (err != 0) {
    throw IoError(io_error_message("reserve", bytes - std::min(bytes, size_),
                                   size_, path_, err, errno_text(err)));
  }
  if (size_ < bytes) size_ = bytes;
}

IoTicket PosixBlockDevice::submit_read(uint64_t offset, void* buffer,
                                       size_t size) {
  check_io_request(path_, "read", offset, buffer, size, size_);
  return submit(IoOp::kRead, offset, static_cast<char*>(buffer), size);
}

IoTicket PosixBlockDevice::submit_write(uint64_t offset, const void* buffer,
                                        size_t size) {
  check_io_request(path_, "write", offset, buffer, size, size_);
  // io_uring and pwrite take a non-const pointer for both directions; a
  // write never stores through it.
  return submit(IoOp::kWrite, offset,
                const_cast<char*>(static_cast<const char*>(buffer)), size);
}

IoTicket PosixBlockDevice::submit(IoOp op, uint64_t offset, char* buffer,
                                  size_t size) {
  if (!broken_.empty()) {
    throw IoError(io_error_message(io_op_name(op), size, offset, path_, 0,
                                   "the device is unusable after an earlier "
                                   "failure: " +
                                       broken_));
  }
  const IoTicket ticket = next_ticket_++;
  Op record{op, offset, buffer, size};
  if (ring_ == nullptr) {
    record.done = true;
    record.result = sync_transfer(fd_, op, buffer, size, offset);
    ops_.emplace(ticket, record);
    return ticket;
  }
  while (pending_ >= queue_depth_) reap(true);
  struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
  ZS_CHECK(sqe != nullptr);  // every earlier SQE was submitted
  if (op == IoOp::kRead) {
    io_uring_prep_read(sqe, fd_, buffer, static_cast<unsigned>(size), offset);
  } else {
    io_uring_prep_write(sqe, fd_, buffer, static_cast<unsigned>(size), offset);
  }
  io_uring_sqe_set_data64(sqe, ticket);
  int rc;
  for (;;) {
    rc = io_uring_submit(&ring_->ring);
    if (rc == -EINTR) continue;
    // The kernel is short of completion space: make room and retry.
    if ((rc == -EAGAIN || rc == -EBUSY) && pending_ > 0) {
      reap(true);
      continue;
    }
    break;
  }
  if (rc < 0) {
    // The SQE stays queued in the ring and would go out with the next
    // submission, into a buffer the caller may reuse: refuse all further
    // I/O on this device.
    broken_ = io_error_message(io_op_name(op), size, offset, path_, -rc,
                               "io_uring_submit: " + errno_text(-rc));
    throw IoError(broken_);
  }
  ++pending_;
  ops_.emplace(ticket, record);
  return ticket;
}

void PosixBlockDevice::reap(bool block) {
  if (pending_ == 0) return;
  struct io_uring_cqe* cqe = nullptr;
  int rc;
  if (block) {
    do {
      rc = io_uring_wait_cqe(&ring_->ring, &cqe);
    } while (rc == -EINTR);
  } else {
    rc = io_uring_peek_cqe(&ring_->ring, &cqe);
    if (rc == -EAGAIN) return;
  }
  if (rc < 0) {
    throw IoError("waiting for I/O on '" + path_ +
                  "' failed: io_uring_wait_cqe: " + errno_text(-rc));
  }
  // Consume everything that is ready.
  while (cqe != nullptr) {
    const IoTicket ticket = io_uring_cqe_get_data64(cqe);
    auto it = ops_.find(ticket);
    ZS_CHECK(it != ops_.end());
    it->second.done = true;
    it->second.result = cqe->res;
    io_uring_cqe_seen(&ring_->ring, cqe);
    --pending_;
    cqe = nullptr;
    if (io_uring_peek_cqe(&ring_->ring, &cqe) != 0) cqe = nullptr;
  }
}

bool PosixBlockDevice::poll(IoTicket ticket) {
  auto it = ops_.find(ticket);
  if (it == ops_.end()) {
    throw UsageError("poll on '" + path_ + "': unknown or retired ticket " +
                     std::to_string(ticket));
  }
  if (!it->second.done) reap(false);
  return it->second.done;
}

void PosixBlockDevice::wait(IoTicket ticket) {
  auto it = ops_.find(ticket);
  if (it == ops_.end()) {
    throw UsageError("wait on '" + path_ + "': unknown or retired ticket " +
                     std::to_string(ticket));
  }
  while (!it->second.done) reap(true);
  const Op op = it->second;
  ops_.erase(it);
  finish(op);
}

void PosixBlockDevice::finish(const Op& op) {
  const char* name = io_op_name(op.op);
  if (op.result < 0) {
    const int err = static_cast<int>(-op.result);
    throw IoError(io_error_message(name, op.size, op.offset, path_, err,
                                   errno_text(err)));
  }
  // A short transfer: finish it synchronously, so that a persistent cause
  // (a full drive, a file truncated under us) is reported by its errno.
  size_t done = static_cast<size_t>(op.result);
  while (done < op.size) {
    const int64_t n = sync_transfer(fd_, op.op, op.buffer + done,
                                    op.size - done, op.offset + done);
    if (n < 0) {
      const int err = static_cast<int>(-n);
      throw IoError(io_error_message(
          name, op.size, op.offset, path_, err,
          "short " + std::string(name) + " (" + std::to_string(done) + " of " +
              std::to_string(op.size) + " bytes), then " + errno_text(err)));
    }
    if (n == 0) {
      struct stat st;
      const uint64_t file_size =
          ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      std::ostringstream cause;
      cause << "short " << name << " (" << done << " of " << op.size
            << " bytes)";
      if (op.op == IoOp::kRead) {
        cause << ": end of file; the file is " << file_size
              << " bytes (truncated by another program?)";
      } else {
        cause << ": the drive accepted no more bytes";
      }
      throw IoError(
          io_error_message(name, op.size, op.offset, path_, 0, cause.str()));
    }
    done += static_cast<size_t>(n);
  }
}

void PosixBlockDevice::flush() {
  std::exception_ptr first;
  while (!ops_.empty()) {
    try {
      wait(ops_.begin()->first);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  int rc;
  do {
    rc = ::fdatasync(fd_);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    throw IoError(flush_error_message(path_, err, errno_text(err)));
  }
}

}  // namespace zerostep
