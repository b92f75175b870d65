#include "offload/block_device.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <utility>

#include "common/errors.h"

namespace zerostep {

const char* io_op_name(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

namespace {

void append_cause(std::ostringstream& os, int err, const std::string& cause) {
  os << cause;
  if (err != 0) os << " (errno " << err << ")";
  if (err == ENOSPC || err == EDQUOT) {
    os << ". The drive is full: free space on it or point nvme_path at a "
          "drive with room for the optimizer state";
  } else if (err == EIO) {
    os << ". The drive reported an I/O error: check the kernel log (dmesg) "
          "and the drive's health, or use another nvme_path";
  }
}

}  // namespace

std::string io_error_message(const char* op, uint64_t size, uint64_t offset,
                             const std::string& device, int err,
                             const std::string& cause) {
  std::ostringstream os;
  os << op << " of " << size << " bytes at offset " << offset << " on '"
     << device << "' failed: ";
  append_cause(os, err, cause);
  return os.str();
}

std::string flush_error_message(const std::string& device, int err,
                                const std::string& cause) {
  std::ostringstream os;
  os << "flush (fdatasync) of '" << device << "' failed: ";
  append_cause(os, err, cause);
  return os.str();
}

void check_io_request(const std::string& device, const char* op,
                      uint64_t offset, const void* buffer, size_t size,
                      uint64_t device_size) {
  auto fail = [&](const char* what, uint64_t value) {
    std::ostringstream os;
    os << op << " on '" << device << "': " << what << " " << value
       << " is not a multiple of " << kBlockAlign
       << " bytes (BlockDevice requires aligned offsets, sizes and buffers; "
          "allocate buffers with AlignedBuffer)";
    throw UsageError(os.str());
  };
  if (offset % kBlockAlign != 0) fail("offset", offset);
  if (size % kBlockAlign != 0) fail("size", size);
  if (reinterpret_cast<uintptr_t>(buffer) % kBlockAlign != 0) {
    fail("buffer address", reinterpret_cast<uintptr_t>(buffer));
  }
  if (size == 0 || size > kMaxIoBytes) {
    std::ostringstream os;
    os << op << " on '" << device << "': size " << size << " is outside (0, "
       << kMaxIoBytes << "]; split larger transfers";
    throw UsageError(os.str());
  }
  if (offset > device_size || size > device_size - offset) {
    std::ostringstream os;
    os << op << " of " << size << " bytes at offset " << offset << " on '"
       << device << "' ends past the device's " << device_size
       << " bytes; reserve() the space first";
    throw UsageError(os.str());
  }
}

AlignedBuffer::AlignedBuffer(size_t bytes) {
  size_ = static_cast<size_t>(round_up_to_block(bytes));
  if (size_ == 0) return;
  data_ = static_cast<char*>(std::aligned_alloc(kBlockAlign, size_));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, size_);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace zerostep
