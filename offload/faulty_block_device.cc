#include "offload/faulty_block_device.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <utility>

#include "common/errors.h"

namespace zerostep {

const char* io_fault_kind_name(IoFaultKind kind) {
  switch (kind) {
    case IoFaultKind::kIoError:
      return "io_error";
    case IoFaultKind::kNoSpace:
      return "no_space";
    case IoFaultKind::kShortWrite:
      return "short_write";
    case IoFaultKind::kTornWrite:
      return "torn_write";
    case IoFaultKind::kCrash:
      return "crash";
  }
  return "?";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kRead:
      return "read";
    case OpKind::kWrite:
      return "write";
    case OpKind::kFlush:
      return "flush";
    case OpKind::kReserve:
      return "reserve";
  }
  return "?";
}

bool fault_applies(IoFaultKind fault, OpKind op) {
  switch (fault) {
    case IoFaultKind::kIoError:
    case IoFaultKind::kCrash:
      return true;
    case IoFaultKind::kNoSpace:
      return op != OpKind::kRead;
    case IoFaultKind::kShortWrite:
    case IoFaultKind::kTornWrite:
      return op == OpKind::kWrite;
  }
  return false;
}

std::string InjectedFault::describe() const {
  std::ostringstream os;
  os << op_kind_name(op) << " #" << op_index << ": " << io_fault_kind_name(fault);
  if (op == OpKind::kRead || op == OpKind::kWrite) {
    os << " at offset " << offset << " (";
    if (fault == IoFaultKind::kShortWrite || fault == IoFaultKind::kTornWrite) {
      os << prefix_bytes << " of ";
    }
    os << size << " bytes)";
  }
  return os.str();
}

FaultyBlockDevice::FaultyBlockDevice(BlockDevice* inner,
                                     const FaultyDeviceOptions& options)
    : inner_(inner), options_(options), rng_(options.seed) {
  if (inner == nullptr) throw UsageError("FaultyBlockDevice: inner is null");
  if (!(options.fault_probability >= 0.0 && options.fault_probability <= 1.0)) {
    throw UsageError("FaultyBlockDevice: fault_probability " +
                     std::to_string(options.fault_probability) +
                     " is outside [0, 1]");
  }
  const size_t s = options.sector_bytes;
  if (s == 0 || (s & (s - 1)) != 0 || kBlockAlign % s != 0) {
    throw UsageError("FaultyBlockDevice: sector_bytes " + std::to_string(s) +
                     " must be a power of two dividing " +
                     std::to_string(kBlockAlign));
  }
}

void FaultyBlockDevice::schedule(OpKind op, uint64_t index, IoFaultKind fault) {
  if (!fault_applies(fault, op)) {
    throw UsageError(std::string("FaultyBlockDevice::schedule: ") +
                     io_fault_kind_name(fault) + " does not apply to a " +
                     op_kind_name(op));
  }
  if (index < count(op)) {
    throw UsageError(std::string("FaultyBlockDevice::schedule: ") +
                     op_kind_name(op) + " #" + std::to_string(index) +
                     " was already submitted (" + std::to_string(count(op)) +
                     " so far)");
  }
  schedule_[{static_cast<int>(op), index}] = fault;
}

void FaultyBlockDevice::clear_schedule() { schedule_.clear(); }

uint64_t FaultyBlockDevice::count(OpKind op) const {
  return counts_[static_cast<int>(op)];
}

std::string FaultyBlockDevice::describe() const {
  std::ostringstream os;
  os << "FaultyBlockDevice(seed=" << options_.seed
     << ", fault_probability=" << options_.fault_probability << ") over '"
     << inner_->name() << "'; injected:";
  if (injected_.empty()) os << " none";
  for (size_t i = 0; i < injected_.size(); ++i) {
    os << (i == 0 ? " " : "; ") << injected_[i].describe();
  }
  return os.str();
}

bool FaultyBlockDevice::next_fault(OpKind op, IoFaultKind* fault) {
  const uint64_t index = counts_[static_cast<int>(op)]++;
  auto it = schedule_.find({static_cast<int>(op), index});
  if (it != schedule_.end()) {
    *fault = it->second;
    schedule_.erase(it);
    return true;
  }
  if (options_.fault_probability <= 0.0) return false;
  // Always draw the same numbers per operation, so that a schedule does not
  // shift the random faults of later operations.
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  const double u = coin(rng_);
  const uint64_t pick = rng_();
  if (u >= options_.fault_probability) return false;
  std::vector<IoFaultKind> candidates;
  for (IoFaultKind f : options_.random_faults) {
    if (fault_applies(f, op)) candidates.push_back(f);
  }
  if (candidates.empty()) return false;
  *fault = candidates[pick % candidates.size()];
  return true;
}

void FaultyBlockDevice::throw_crashed(const char* op, uint64_t size,
                                      uint64_t offset) const {
  throw IoError(io_error_message(op, size, offset, inner_->name(), 0,
                                 "the device is down after a simulated "
                                 "crash (" +
                                     crash_cause_ +
                                     "); restart() it to reboot"));
}

IoError FaultyBlockDevice::injected_error(const InjectedFault& f, int err,
                                          const std::string& cause) const {
  std::ostringstream os;
  os << cause << " [injected by FaultyBlockDevice seed=" << options_.seed
     << ": " << f.describe() << "]";
  const char* op = op_kind_name(f.op);
  if (f.op == OpKind::kFlush) {
    return IoError(flush_error_message(inner_->name(), err, os.str()));
  }
  return IoError(
      io_error_message(op, f.size, f.offset, inner_->name(), err, os.str()));
}

void FaultyBlockDevice::inner_read(uint64_t offset, char* buffer, size_t size) {
  inner_->wait(inner_->submit_read(offset, buffer, size));
}

void FaultyBlockDevice::inner_write(uint64_t offset, const char* buffer,
                                    size_t size) {
  inner_->wait(inner_->submit_write(offset, buffer, size));
}

uint64_t FaultyBlockDevice::draw_prefix(size_t size) {
  const uint64_t sectors = size / options_.sector_bytes;  // >= 8
  return (rng_() % sectors) * options_.sector_bytes;      // < size
}

void FaultyBlockDevice::write_prefix(uint64_t offset, const char* data,
                                     size_t size, size_t prefix,
                                     std::vector<char> before) {
  if (prefix == 0) return;
  const size_t span = static_cast<size_t>(round_up_to_block(prefix));
  ZS_CHECK(span <= size);
  AlignedBuffer merged(span);
  std::memcpy(merged.data(), data, prefix);
  std::memcpy(merged.data() + prefix, before.data() + prefix, span - prefix);
  inner_write(offset, merged.data(), span);
  before.resize(span);
  volatile_.push_back(
      VolatileWrite{offset, std::move(before),
                    std::vector<char>(merged.data(), merged.data() + span)});
}

void FaultyBlockDevice::crash() {
  if (crashed_) return;
  crashed_ = true;
  if (crash_cause_.empty()) crash_cause_ = "crash()";
  if (options_.lose_unsynced_on_crash && !volatile_.empty()) {
    // Undo every volatile write, newest first, then let each one land,
    // vanish, or land torn, oldest first.
    for (auto it = volatile_.rbegin(); it != volatile_.rend(); ++it) {
      AlignedBuffer b(it->before.size());
      std::memcpy(b.data(), it->before.data(), it->before.size());
      inner_write(it->offset, b.data(), it->before.size());
    }
    for (const VolatileWrite& w : volatile_) {
      const uint64_t fate = rng_() % 3;
      if (fate == 1) continue;  // lost
      size_t keep = w.after.size();
      if (fate == 2) keep = static_cast<size_t>(draw_prefix(w.after.size()));
      if (keep == 0) continue;
      const size_t span = static_cast<size_t>(round_up_to_block(keep));
      AlignedBuffer b(span);
      std::memcpy(b.data(), w.after.data(), keep);
      std::memcpy(b.data() + keep, w.before.data() + keep, span - keep);
      inner_write(w.offset, b.data(), span);
    }
  }
  volatile_.clear();
}

void FaultyBlockDevice::restart() {
  if (!crashed_) return;
  crashed_ = false;
  crash_cause_.clear();
  volatile_.clear();
}

IoTicket FaultyBlockDevice::complete(std::exception_ptr error) {
  const IoTicket ticket = next_ticket_++;
  results_.emplace(ticket, std::move(error));
  return ticket;
}

void FaultyBlockDevice::reserve(uint64_t bytes) {
  IoFaultKind fault;
  const uint64_t index = count(OpKind::kReserve);
  const bool faulted = next_fault(OpKind::kReserve, &fault);
  if (crashed_) throw_crashed("reserve", bytes, 0);
  if (faulted) {
    InjectedFault f{OpKind::kReserve, index, fault, 0, bytes, 0};
    injected_.push_back(f);
    if (fault == IoFaultKind::kCrash) {
      crash_cause_ = "injected at " + f.describe();
      crash();
      throw_crashed("reserve", bytes, 0);
    }
    const int err = fault == IoFaultKind::kNoSpace ? ENOSPC : EIO;
    throw injected_error(f, err, std::strerror(err));
  }
  inner_->reserve(bytes);
}

IoTicket FaultyBlockDevice::submit_read(uint64_t offset, void* buffer,
                                        size_t size) {
  check_io_request(inner_->name(), "read", offset, buffer, size,
                   inner_->size());
  IoFaultKind fault;
  const uint64_t index = count(OpKind::kRead);
  const bool faulted = next_fault(OpKind::kRead, &fault);
  if (crashed_) throw_crashed("read", size, offset);
  char* out = static_cast<char*>(buffer);
  if (faulted) {
    InjectedFault f{OpKind::kRead, index, fault, offset, size, 0};
    injected_.push_back(f);
    if (fault == IoFaultKind::kCrash) {
      crash_cause_ = "injected at " + f.describe();
      crash();
      throw_crashed("read", size, offset);
    }
    std::memset(out, 0xA5, size);
    return complete(
        std::make_exception_ptr(injected_error(f, EIO, std::strerror(EIO))));
  }
  try {
    inner_read(offset, out, size);
  } catch (...) {
    return complete(std::current_exception());
  }
  return complete(nullptr);
}

IoTicket FaultyBlockDevice::submit_write(uint64_t offset, const void* buffer,
                                         size_t size) {
  check_io_request(inner_->name(), "write", offset, buffer, size,
                   inner_->size());
  IoFaultKind fault;
  const uint64_t index = count(OpKind::kWrite);
  const bool faulted = next_fault(OpKind::kWrite, &fault);
  if (crashed_) throw_crashed("write", size, offset);
  const char* data = static_cast<const char*>(buffer);

  std::vector<char> before;
  const bool track = options_.lose_unsynced_on_crash ||
                     (faulted && fault == IoFaultKind::kShortWrite);
  if (track) {
    AlignedBuffer old(size);
    inner_read(offset, old.data(), size);
    before.assign(old.data(), old.data() + size);
  }
  if (faulted) {
    InjectedFault f{OpKind::kWrite, index, fault, offset, size, 0};
    switch (fault) {
      case IoFaultKind::kCrash:
        injected_.push_back(f);
        crash_cause_ = "injected at " + f.describe();
        crash();
        throw_crashed("write", size, offset);
      case IoFaultKind::kIoError:
      case IoFaultKind::kNoSpace: {
        injected_.push_back(f);
        const int err = fault == IoFaultKind::kNoSpace ? ENOSPC : EIO;
        return complete(std::make_exception_ptr(
            injected_error(f, err, std::strerror(err))));
      }
      case IoFaultKind::kShortWrite: {
        f.prefix_bytes = draw_prefix(size);
        injected_.push_back(f);
        write_prefix(offset, data, size, f.prefix_bytes, std::move(before));
        return complete(std::make_exception_ptr(
            injected_error(f, ENOSPC,
                           "short write (" + std::to_string(f.prefix_bytes) +
                               " of " + std::to_string(size) +
                               " bytes), then " + std::strerror(ENOSPC))));
      }
      case IoFaultKind::kTornWrite: {
        f.prefix_bytes = draw_prefix(size);
        injected_.push_back(f);
        // The earlier volatile writes meet their fate first; the torn
        // write's prefix is what the medium got last (over whatever the
        // crash left there).
        crash_cause_ = "injected at " + f.describe();
        crash();
        AlignedBuffer old(size);
        inner_read(offset, old.data(), size);
        write_prefix(offset, data, size, f.prefix_bytes,
                     std::vector<char>(old.data(), old.data() + size));
        volatile_.clear();
        throw_crashed("write", size, offset);
      }
    }
  }
  try {
    inner_write(offset, data, size);
  } catch (...) {
    return complete(std::current_exception());
  }
  if (options_.lose_unsynced_on_crash) {
    volatile_.push_back(VolatileWrite{offset, std::move(before),
                                      std::vector<char>(data, data + size)});
  }
  return complete(nullptr);
}

bool FaultyBlockDevice::poll(IoTicket ticket) {
  if (results_.count(ticket) == 0) {
    throw UsageError("poll on '" + inner_->name() +
                     "': unknown or retired ticket " + std::to_string(ticket));
  }
  return true;  // every operation completes before submit returns
}

void FaultyBlockDevice::wait(IoTicket ticket) {
  auto it = results_.find(ticket);
  if (it == results_.end()) {
    throw UsageError("wait on '" + inner_->name() +
                     "': unknown or retired ticket " + std::to_string(ticket));
  }
  std::exception_ptr error = it->second;
  results_.erase(it);
  if (error) std::rethrow_exception(error);
}

void FaultyBlockDevice::flush() {
  std::exception_ptr first;
  for (auto& entry : results_) {
    if (entry.second && !first) first = entry.second;
  }
  results_.clear();
  IoFaultKind fault;
  const uint64_t index = count(OpKind::kFlush);
  const bool faulted = next_fault(OpKind::kFlush, &fault);
  if (crashed_) throw_crashed("flush", 0, 0);
  if (first) std::rethrow_exception(first);
  if (faulted) {
    InjectedFault f{OpKind::kFlush, index, fault, 0, 0, 0};
    injected_.push_back(f);
    if (fault == IoFaultKind::kCrash) {
      crash_cause_ = "injected at " + f.describe();
      crash();
      throw_crashed("flush", 0, 0);
    }
    const int err = fault == IoFaultKind::kNoSpace ? ENOSPC : EIO;
    throw injected_error(f, err, std::strerror(err));
  }
  inner_->flush();
  volatile_.clear();
}

}  // namespace zerostep
