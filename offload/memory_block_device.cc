#include "offload/memory_block_device.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/errors.h"

namespace zerostep {

MemoryBlockDevice::MemoryBlockDevice(std::string name, uint64_t capacity_bytes)
    : name_(std::move(name)), capacity_(capacity_bytes) {}

void MemoryBlockDevice::reserve(uint64_t bytes) {
  bytes = round_up_to_block(bytes);
  if (bytes <= medium_.size()) return;
  if (bytes > capacity_) {
    throw IoError(io_error_message(
        "reserve", bytes - medium_.size(), medium_.size(), name_, ENOSPC,
        std::strerror(ENOSPC) + std::string(" (the simulated device holds ") +
            std::to_string(capacity_) + " bytes)"));
  }
  medium_.resize(bytes, 0);
}

IoTicket MemoryBlockDevice::submit_read(uint64_t offset, void* buffer,
                                        size_t size) {
  check_io_request(name_, "read", offset, buffer, size, medium_.size());
  const IoTicket ticket = next_ticket_++;
  ops_.emplace(ticket,
               Op{IoOp::kRead, offset, static_cast<char*>(buffer), size});
  return ticket;
}

IoTicket MemoryBlockDevice::submit_write(uint64_t offset, const void* buffer,
                                         size_t size) {
  check_io_request(name_, "write", offset, buffer, size, medium_.size());
  const IoTicket ticket = next_ticket_++;
  // The bytes are copied when the write executes, not now (see header).
  ops_.emplace(ticket,
               Op{IoOp::kWrite, offset,
                  const_cast<char*>(static_cast<const char*>(buffer)), size});
  return ticket;
}

void MemoryBlockDevice::execute_through(IoTicket ticket) {
  for (auto it = ops_.begin(); it != ops_.end() && it->first <= ticket; ++it) {
    Op& op = it->second;
    if (op.done) continue;
    // reserve() only grows the medium, so a range checked at submission
    // is still inside it.
    ZS_CHECK(op.offset + op.size <= medium_.size());
    if (op.op == IoOp::kRead) {
      std::memcpy(op.buffer, medium_.data() + op.offset, op.size);
    } else {
      std::memcpy(medium_.data() + op.offset, op.buffer, op.size);
    }
    op.done = true;
  }
}

bool MemoryBlockDevice::poll(IoTicket ticket) {
  auto it = ops_.find(ticket);
  if (it == ops_.end()) {
    throw UsageError("poll on '" + name_ + "': unknown or retired ticket " +
                     std::to_string(ticket));
  }
  return it->second.done;
}

void MemoryBlockDevice::wait(IoTicket ticket) {
  auto it = ops_.find(ticket);
  if (it == ops_.end()) {
    throw UsageError("wait on '" + name_ + "': unknown or retired ticket " +
                     std::to_string(ticket));
  }
  execute_through(ticket);
  ops_.erase(ticket);
}

void MemoryBlockDevice::flush() {
  if (!ops_.empty()) execute_through(ops_.rbegin()->first);
  ops_.clear();
  ++flushes_;
}

}  // namespace zerostep
