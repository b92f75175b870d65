#include "offload/swap_store.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <sstream>
#include <utility>

#include "common/errors.h"
#include "offload/crc32c.h"

namespace zerostep {

// Device layout (Note [Swap pass atomicity] in swap_store.h):
//   [0, 4096)       superblock record copy 0
//   [4096, 8192)    superblock record copy 1
//   [8192, ...)     copy 0: slot of sub-group 0, 1, ..., G-1
//                   copy 1: slot of sub-group 0, 1, ..., G-1
// A slot is the K arrays of the sub-group, each at array_stride_bytes_
// from the previous, then a SlotTrailer, padded to a multiple of 4096.
// Integers are stored in the host's byte order (little-endian x86-64); a
// file moved to a big-endian host fails its magic check.
namespace {

constexpr uint64_t kRecordBytes = kBlockAlign;
constexpr uint64_t kDataOffset = 2 * kRecordBytes;
constexpr char kRecordMagic[8] = {'Z', 'S', 'S', 'W', 'A', 'P', '\0', '\1'};
constexpr char kSlotMagic[8] = {'Z', 'S', 'S', 'L', 'O', 'T', '\0', '\1'};
constexpr uint32_t kFormatVersion = 1;

struct Record {
  char magic[8];
  uint32_t version;
  uint32_t num_arrays;
  uint64_t numel;
  uint64_t subgroup_numel;
  uint64_t slot_bytes;
  uint64_t generation;
  uint32_t crc;  // CRC-32C of the bytes before it
  uint32_t pad;
};
static_assert(sizeof(Record) == 56, "Record layout");

struct SlotTrailer {
  char magic[8];
  uint64_t generation;
  uint64_t subgroup;
  uint64_t count;
  uint32_t data_crc;     // CRC-32C of arrays 0..K-1, count floats each
  uint32_t trailer_crc;  // CRC-32C of the bytes before it
};
static_assert(sizeof(SlotTrailer) == 40, "SlotTrailer layout");
constexpr uint64_t kTrailerBytes = 64;

uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

// Accumulates the time a scope takes into *sum.
class Timed {
 public:
  explicit Timed(double* sum)
      : sum_(sum), start_(std::chrono::steady_clock::now()) {}
  ~Timed() { *sum_ += seconds_since(start_); }

 private:
  double* sum_;
  std::chrono::steady_clock::time_point start_;
};

bool parse_record(const char* block, Record* out) {
  std::memcpy(out, block, sizeof(Record));
  if (std::memcmp(out->magic, kRecordMagic, 8) != 0) return false;
  if (out->crc != crc32c(0, block, offsetof(Record, crc))) return false;
  return out->version == kFormatVersion && out->generation > 0;
}

}  // namespace

struct SwapStore::Buffer {
  AlignedBuffer memory;
  size_t subgroup = 0;
  std::deque<IoTicket> tickets;  // submitted, not yet waited
  float* arrays[kMaxArrays] = {};
};

SwapStore::SwapStore(BlockDevice* device, const SwapStoreOptions& options)
    : device_(device), options_(options) {
  auto bad = [](const std::string& field, const std::string& value,
                const std::string& rule) {
    throw UsageError("SwapStoreOptions." + field + " = " + value + ": " + rule);
  };
  if (device == nullptr) throw UsageError("SwapStore: device is null");
  if (options.num_arrays < 1 || options.num_arrays > kMaxArrays) {
    bad("num_arrays", std::to_string(options.num_arrays),
        "must be in [1, " + std::to_string(kMaxArrays) + "]");
  }
  if (options.numel < 1) bad("numel", "0", "must be >= 1");
  if (options.subgroup_numel < 1) bad("subgroup_numel", "0", "must be >= 1");
  if (options.buffer_count < 2) {
    bad("buffer_count", std::to_string(options.buffer_count),
        "must be >= 2 (one buffer in the update, one in I/O)");
  }
  if (options.io_chunk_bytes < kBlockAlign ||
      options.io_chunk_bytes % kBlockAlign != 0 ||
      options.io_chunk_bytes > kMaxIoBytes) {
    bad("io_chunk_bytes", std::to_string(options.io_chunk_bytes),
        "must be a multiple of " + std::to_string(kBlockAlign) + " in [" +
            std::to_string(kBlockAlign) + ", " + std::to_string(kMaxIoBytes) +
            "]");
  }
  const uint64_t subgroup =
      std::min<uint64_t>(options.subgroup_numel, options.numel);
  options_.subgroup_numel = static_cast<size_t>(subgroup);
  num_subgroups_ =
      static_cast<size_t>((options.numel + subgroup - 1) / subgroup);
  array_stride_bytes_ = round_up(subgroup * sizeof(float), 64);
  slot_bytes_ = round_up(
      options.num_arrays * array_stride_bytes_ + kTrailerBytes, kBlockAlign);

  // Find the committed state, if any.
  const std::string where = "opening swap store on '" + device->name() + "': ";
  record_buffer_ = AlignedBuffer(kDataOffset);
  if (device->size() >= kDataOffset) {
    try {
      device->wait(device->submit_read(0, record_buffer_.data(), kDataOffset));
    } catch (const IoError& e) {
      throw IoError(where + "reading the superblock failed: " + e.what());
    }
    for (int copy = 0; copy < 2; ++copy) {
      Record r;
      if (!parse_record(record_buffer_.data() + copy * kRecordBytes, &r)) {
        continue;
      }
      if (r.num_arrays != options.num_arrays || r.numel != options.numel ||
          r.subgroup_numel != options_.subgroup_numel ||
          r.slot_bytes != slot_bytes_) {
        std::ostringstream os;
        os << where << "it holds a store of num_arrays=" << r.num_arrays
           << ", numel=" << r.numel << ", subgroup_numel=" << r.subgroup_numel
           << " (generation " << r.generation << "), but this one asks for "
           << "num_arrays=" << options.num_arrays << ", numel=" << options.numel
           << ", subgroup_numel=" << options_.subgroup_numel
           << ". Fix: open it with the same geometry, or use a fresh "
              "nvme_path (or delete the file) to start over";
        throw IoError(os.str());
      }
      if (r.generation > generation_) generation_ = r.generation;
    }
  }
  try {
    device->reserve(device_bytes());
  } catch (const IoError& e) {
    std::ostringstream os;
    os << where << "the store needs " << device_bytes()
       << " bytes (two copies of " << options.num_arrays << " arrays of "
       << options.numel << " floats, in " << num_subgroups_ << " sub-groups of "
       << slot_bytes_ << " bytes, plus " << kDataOffset
       << " bytes of superblock): " << e.what();
    throw IoError(os.str());
  }

  const size_t nbuf =
      std::min(options.buffer_count, std::max<size_t>(num_subgroups_, 2));
  buffers_.resize(nbuf);
  for (Buffer& b : buffers_) {
    b.memory = AlignedBuffer(slot_bytes_);
    for (size_t k = 0; k < options.num_arrays; ++k) {
      b.arrays[k] =
          reinterpret_cast<float*>(b.memory.data() + k * array_stride_bytes_);
    }
  }
}

SwapStore::~SwapStore() {
  // Narrow Note [Swap pass atomicity]'s indeterminate window to a crash:
  // best effort, the device may be failing.
  if (record_uncertain_) {
    try {
      invalidate_uncertain_record();
    } catch (...) {
    }
  }
}

uint64_t SwapStore::device_bytes() const {
  return kDataOffset + 2 * num_subgroups_ * slot_bytes_;
}

uint64_t SwapStore::buffer_bytes() const {
  return slot_bytes_ * buffers_.size();
}

uint64_t SwapStore::slot_offset(uint64_t copy, size_t subgroup) const {
  return kDataOffset + (copy * num_subgroups_ + subgroup) * slot_bytes_;
}

size_t SwapStore::subgroup_count(size_t subgroup) const {
  const uint64_t first = uint64_t{subgroup} * options_.subgroup_numel;
  return static_cast<size_t>(
      std::min<uint64_t>(options_.subgroup_numel, options_.numel - first));
}

uint32_t SwapStore::data_crc(const Buffer& b) const {
  const size_t count = subgroup_count(b.subgroup);
  uint32_t crc = 0;
  for (size_t k = 0; k < options_.num_arrays; ++k) {
    crc = crc32c(crc, b.arrays[k], count * sizeof(float));
  }
  return crc;
}

void SwapStore::seal(Buffer& b, uint64_t generation) const {
  SlotTrailer t;
  std::memcpy(t.magic, kSlotMagic, 8);
  t.generation = generation;
  t.subgroup = b.subgroup;
  t.count = subgroup_count(b.subgroup);
  t.data_crc = data_crc(b);
  t.trailer_crc = crc32c(0, &t, offsetof(SlotTrailer, trailer_crc));
  std::memcpy(b.memory.data() + options_.num_arrays * array_stride_bytes_, &t,
              sizeof(t));
}

void SwapStore::verify(const Buffer& b, uint64_t copy) const {
  SlotTrailer t;
  std::memcpy(&t, b.memory.data() + options_.num_arrays * array_stride_bytes_,
              sizeof(t));
  std::string problem;
  if (std::memcmp(t.magic, kSlotMagic, 8) != 0) {
    problem = "no slot trailer";
  } else if (t.trailer_crc !=
             crc32c(0, &t, offsetof(SlotTrailer, trailer_crc))) {
    problem = "trailer checksum mismatch";
  } else if (t.generation != generation_) {
    problem = "slot holds generation " + std::to_string(t.generation);
  } else if (t.subgroup != b.subgroup) {
    problem = "slot holds sub-group " + std::to_string(t.subgroup);
  } else if (t.count != subgroup_count(b.subgroup)) {
    problem = "slot holds " + std::to_string(t.count) + " elements";
  } else if (t.data_crc != data_crc(b)) {
    problem = "data checksum mismatch";
  } else {
    return;
  }
  std::ostringstream os;
  os << "corrupt sub-group " << b.subgroup << " (copy " << copy << " at offset "
     << slot_offset(copy, b.subgroup) << " of '" << device_->name()
     << "', committed generation " << generation_ << "): " << problem
     << ". The file was modified behind the store or the drive corrupted "
        "it; restore the optimizer state from a checkpoint";
  throw IoError(os.str());
}

void SwapStore::write_record(uint64_t generation, uint64_t copy) {
  char* block = record_buffer_.data();
  std::memset(block, 0, kRecordBytes);
  if (generation > 0) {
    Record r{};
    std::memcpy(r.magic, kRecordMagic, 8);
    r.version = kFormatVersion;
    r.num_arrays = static_cast<uint32_t>(options_.num_arrays);
    r.numel = options_.numel;
    r.subgroup_numel = options_.subgroup_numel;
    r.slot_bytes = slot_bytes_;
    r.generation = generation;
    std::memcpy(block, &r, sizeof(r));
    r.crc = crc32c(0, block, offsetof(Record, crc));
    std::memcpy(block, &r, sizeof(r));
  }
  device_->wait(
      device_->submit_write(copy * kRecordBytes, block, kRecordBytes));
  stats_.bytes_written += kRecordBytes;
}

void SwapStore::invalidate_uncertain_record() {
  // Zeros over the record slot a failed commit may have filled (the one
  // for generation_ + 1), made durable before anything else is written.
  write_record(0, (generation_ + 1) % 2);
  device_->flush();
  record_uncertain_ = false;
}

void SwapStore::update(const std::function<void(const SwapSubgroup&)>& fn) {
  update_pass("update", fn, /*commit=*/true);
}

void SwapStore::prepare_update(
    const std::function<void(const SwapSubgroup&)>& fn) {
  update_pass("prepare_update", fn, /*commit=*/false);
  prepared_ = true;
}

void SwapStore::update_pass(const char* what,
                            const std::function<void(const SwapSubgroup&)>& fn,
                            bool commit) {
  require_not_prepared(what);
  if (!has_state()) {
    throw UsageError(std::string("SwapStore::") + what + " on '" +
                     device_->name() +
                     "': the store has no committed state; initialise it "
                     "with write_all or write_arrays first");
  }
  run_pass(
      Mode::kUpdate,
      [&](Buffer& b) {
        const size_t count = subgroup_count(b.subgroup);
        fn(SwapSubgroup{b.subgroup,
                        uint64_t{b.subgroup} * options_.subgroup_numel, count,
                        b.arrays, options_.num_arrays});
      },
      commit);
}

void SwapStore::commit_prepared() {
  if (!prepared_)
    throw UsageError("SwapStore::commit_prepared on '" + device_->name() +
                     "': no prepared pass (prepare_update first)");
  prepared_ = false;
  try {
    commit_record();
  } catch (const IoError& e) {
    throw IoError("swap store on '" + device_->name() +
                  "': committing prepared generation " +
                  std::to_string(generation_ + 1) +
                  " failed; the store keeps generation " +
                  std::to_string(generation_) + " and stays usable. Cause: " +
                  e.what());
  }
}

void SwapStore::discard_prepared() {
  // The prepared sub-groups sit in the copy no record names; the next pass
  // overwrites them.
  prepared_ = false;
}

void SwapStore::require_not_prepared(const char* what) const {
  if (!prepared_) return;
  throw UsageError(std::string("SwapStore::") + what + " on '" +
                   device_->name() +
                   "': a prepared pass awaits commit_prepared() or "
                   "discard_prepared()");
}

void SwapStore::commit_record() {
  const uint64_t dst = (generation_ + 1) % 2;
  record_uncertain_ = true;
  write_record(generation_ + 1, dst);
  device_->flush();
  record_uncertain_ = false;
  ++generation_;
}

void SwapStore::write_all(const std::function<void(const SwapSubgroup&)>& fn) {
  require_not_prepared("write_all");
  run_pass(Mode::kWrite, [&](Buffer& b) {
    const size_t count = subgroup_count(b.subgroup);
    fn(SwapSubgroup{b.subgroup, uint64_t{b.subgroup} * options_.subgroup_numel,
                    count, b.arrays, options_.num_arrays});
  });
}

void SwapStore::read_all(
    const std::function<void(const SwapSubgroupView&)>& fn) {
  require_not_prepared("read_all");
  if (!has_state()) {
    throw UsageError("SwapStore::read_all on '" + device_->name() +
                     "': the store has no committed state");
  }
  run_pass(Mode::kRead, [&](Buffer& b) {
    const size_t count = subgroup_count(b.subgroup);
    fn(SwapSubgroupView{b.subgroup,
                        uint64_t{b.subgroup} * options_.subgroup_numel, count,
                        b.arrays, options_.num_arrays});
  });
}

void SwapStore::write_arrays(const float* const* arrays) {
  write_all([&](const SwapSubgroup& s) {
    for (size_t k = 0; k < s.num_arrays; ++k) {
      std::memcpy(s.arrays[k], arrays[k] + s.first, s.count * sizeof(float));
    }
  });
}

void SwapStore::read_arrays(float* const* arrays) {
  read_all([&](const SwapSubgroupView& s) {
    for (size_t k = 0; k < s.num_arrays; ++k) {
      std::memcpy(arrays[k] + s.first, s.arrays[k], s.count * sizeof(float));
    }
  });
}

// One run_pass's pipeline (Note [Swap pass atomicity]): which buffers are
// free, being read and being written, the sub-group read next, and where
// the pass is (for the error message). Reads go ahead as far as free
// buffers allow; writes are retired oldest first.
class SwapStore::Pass {
 public:
  Pass(SwapStore& store, uint64_t src, uint64_t dst)
      : store_(store), src_(src), dst_(dst), groups_(store.num_subgroups_) {
    for (size_t i = 0; i < store_.buffers_.size(); ++i) free_.push_back(i);
  }

  const std::string& where() const { return where_; }
  void set_where(std::string where) { where_ = std::move(where); }
  void at(const char* what, size_t subgroup) {
    where_ = std::string(what) + " sub-group " + std::to_string(subgroup) +
             " of " + std::to_string(groups_);
  }

  // The buffer holding sub-group g as read and verified; the read of g + 1
  // goes out before this returns (before the function runs on g).
  size_t read(size_t g) {
    while (!writing_.empty() && buffer_ready(store_.buffers_[writing_.front()]))
      retire_oldest_write();
    if (next_read_ == g && free_.empty()) retire_oldest_write();
    while (next_read_ < groups_ && !free_.empty()) start_read();
    const size_t current = reading_.front();
    reading_.pop_front();
    wait_buffer(store_.buffers_[current], IoOp::kRead);
    store_.verify(store_.buffers_[current], src_);
    if (next_read_ == g + 1 && next_read_ < groups_ && free_.empty())
      retire_oldest_write();
    while (next_read_ < groups_ && !free_.empty()) start_read();
    return current;
  }

  // A free buffer for sub-group g, zeroed (a pass that writes only).
  size_t zeroed(size_t g) {
    if (free_.empty()) retire_oldest_write();
    const size_t current = free_.front();
    free_.pop_front();
    Buffer& b = store_.buffers_[current];
    b.subgroup = g;
    std::memset(b.memory.data(), 0, b.memory.size());
    return current;
  }

  // Buffer i sealed for `generation` and its write submitted.
  void write(size_t i, uint64_t generation) {
    Buffer& b = store_.buffers_[i];
    store_.seal(b, generation);
    submit(b, IoOp::kWrite, dst_);
    writing_.push_back(i);
  }

  void release(size_t i) { free_.push_back(i); }

  void finish_writes() {
    while (!writing_.empty()) retire_oldest_write();
  }

 private:
  void submit(Buffer& b, IoOp op, uint64_t copy) {
    at(op == IoOp::kRead ? "reading" : "writing", b.subgroup);
    const uint64_t base = store_.slot_offset(copy, b.subgroup);
    const uint64_t slot_bytes = store_.slot_bytes_;
    for (uint64_t done = 0; done < slot_bytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(
          store_.options_.io_chunk_bytes, slot_bytes - done));
      char* p = b.memory.data() + done;
      b.tickets.push_back(
          op == IoOp::kRead ? store_.device_->submit_read(base + done, p, n)
                            : store_.device_->submit_write(base + done, p, n));
      done += n;
    }
    (op == IoOp::kRead ? store_.stats_.bytes_read
                       : store_.stats_.bytes_written) += slot_bytes;
  }

  void wait_buffer(Buffer& b, IoOp op) {
    at(op == IoOp::kRead ? "reading" : "writing", b.subgroup);
    Timed t(&store_.stats_.wait_seconds);
    while (!b.tickets.empty()) {
      const IoTicket ticket = b.tickets.front();
      b.tickets.pop_front();  // retired even if wait throws
      store_.device_->wait(ticket);
    }
  }

  bool buffer_ready(const Buffer& b) const {
    for (IoTicket t : b.tickets) {
      if (!store_.device_->poll(t)) return false;
    }
    return true;
  }

  void retire_oldest_write() {
    const size_t i = writing_.front();
    wait_buffer(store_.buffers_[i], IoOp::kWrite);
    writing_.pop_front();
    free_.push_back(i);
  }

  void start_read() {
    const size_t i = free_.front();
    free_.pop_front();
    store_.buffers_[i].subgroup = next_read_++;
    submit(store_.buffers_[i], IoOp::kRead, src_);
    reading_.push_back(i);
  }

  SwapStore& store_;
  const uint64_t src_;  // the copy read: generation_ % 2
  const uint64_t dst_;  // the copy written: (generation_ + 1) % 2
  const size_t groups_;
  std::deque<size_t> free_, reading_, writing_;
  size_t next_read_ = 0;
  std::string where_ = "start";
};

void SwapStore::run_pass(Mode mode, const std::function<void(Buffer&)>& body,
                         bool commit) {
  stats_ = SwapPassStats();
  const auto start = std::chrono::steady_clock::now();
  const bool reads = mode != Mode::kWrite;
  const bool writes = mode != Mode::kRead;
  Pass pass(*this, generation_ % 2, (generation_ + 1) % 2);
  try {
    if (writes && record_uncertain_) {
      pass.set_where("invalidating the uncertain commit record");
      Timed t(&stats_.wait_seconds);
      invalidate_uncertain_record();
    }
    for (size_t g = 0; g < num_subgroups_; ++g) {
      const size_t current = reads ? pass.read(g) : pass.zeroed(g);
      {
        pass.at("the function on", g);
        Timed t(&stats_.function_seconds);
        body(buffers_[current]);
      }
      if (writes) {
        pass.write(current, generation_ + 1);
      } else {
        pass.release(current);
      }
    }
    pass.finish_writes();
    if (writes) {
      Timed t(&stats_.wait_seconds);
      pass.set_where("flushing the new sub-groups");
      device_->flush();
      if (commit) {
        pass.set_where("committing generation " +
                       std::to_string(generation_ + 1));
        commit_record();
      }
    }
  } catch (...) {
    wait_every_transfer();
    stats_.seconds = seconds_since(start);
    rethrow_pass_error(mode, pass.where());
  }
  stats_.seconds = seconds_since(start);
}

void SwapStore::wait_every_transfer() {
  for (Buffer& b : buffers_) wait_ignoring_errors(b);
}

void SwapStore::wait_ignoring_errors(Buffer& b) {
  // Every transfer must finish before its buffer is reused or freed.
  while (!b.tickets.empty()) {
    const IoTicket ticket = b.tickets.front();
    b.tickets.pop_front();
    try {
      device_->wait(ticket);
    } catch (...) {
    }
  }
}

void SwapStore::rethrow_pass_error(Mode mode, const std::string& where) const {
  try {
    throw;
  } catch (const IoError& e) {
    const bool writes = mode != Mode::kRead;
    const char* name = mode == Mode::kUpdate  ? "update"
                       : mode == Mode::kWrite ? "write_all"
                                              : "read_all";
    std::ostringstream os;
    os << "swap store on '" << device_->name() << "': " << name;
    if (writes) {
      os << " (generation " << generation_ << " -> " << generation_ + 1 << ")";
    } else {
      os << " (generation " << generation_ << ")";
    }
    os << " failed at " << where << "; the store keeps generation "
       << generation_ << " and stays usable. Cause: " << e.what();
    throw IoError(os.str());
  }
}

void SwapStore::read_range(size_t array, uint64_t first, uint64_t count,
                           float* out) {
  std::ostringstream range;
  range << "read_range of array " << array << ", elements [" << first << ", "
        << first + count << ") on '" << device_->name() << "'";
  if (!has_state())
    throw UsageError("SwapStore::" + range.str() +
                     ": the store has no committed state");
  if (array >= options_.num_arrays || first > options_.numel ||
      count > options_.numel - first) {
    std::ostringstream os;
    os << "SwapStore::" << range.str() << ": outside the store's "
       << options_.num_arrays << " arrays of " << options_.numel
       << " elements";
    throw UsageError(os.str());
  }
  if (count == 0) return;
  const uint64_t src = generation_ % 2;
  const size_t sg = options_.subgroup_numel;
  const size_t begin = static_cast<size_t>(first / sg);
  const size_t end = static_cast<size_t>((first + count - 1) / sg) + 1;
  Buffer& b = buffers_[0];
  try {
    for (size_t s = begin; s < end; ++s) {
      b.subgroup = s;
      const uint64_t base = slot_offset(src, s);
      for (uint64_t done = 0; done < slot_bytes_;) {
        const size_t n = static_cast<size_t>(
            std::min<uint64_t>(options_.io_chunk_bytes, slot_bytes_ - done));
        b.tickets.push_back(
            device_->submit_read(base + done, b.memory.data() + done, n));
        done += n;
      }
      while (!b.tickets.empty()) {
        const IoTicket ticket = b.tickets.front();
        b.tickets.pop_front();  // retired even if wait throws
        device_->wait(ticket);
      }
      verify(b, src);
      const uint64_t s_first = uint64_t{s} * sg;
      const uint64_t lo = std::max(first, s_first);
      const uint64_t hi =
          std::min(first + count, s_first + subgroup_count(s));
      std::memcpy(out + (lo - first), b.arrays[array] + (lo - s_first),
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
  } catch (const IoError& e) {
    wait_ignoring_errors(b);
    std::ostringstream os;
    os << "swap store: " << range.str() << " (generation " << generation_
       << ") failed at sub-group " << b.subgroup << "; nothing changed. "
       << "Cause: " << e.what();
    throw IoError(os.str());
  }
}

}  // namespace zerostep
