// SwapStore: K float arrays of n elements each (for Adam: the fp32 master
// parameters, exp_avg and exp_avg_sq of one rank's partition) kept on a
// BlockDevice (an NVMe file: offload/posix_block_device.h) and streamed
// through a bounded number of memory buffers, sub-group by sub-group, with
// the I/O overlapping the caller's computation. The engine's NVMe optimizer
// offload (issue 4: offload_optimizer.device = "nvme") is one SwapStore per
// rank; it holds no tensor and does no arithmetic itself.
//
// Usage (one optimizer step over a rank's partition; see Note [Parameters
// in memory] for the alternative where the parameters stay in memory):
//
//   auto device = PosixBlockDevice::open_in_directory(
//       nvme_path, "zerostep_rank" + std::to_string(rank) + ".swap");
//   SwapStoreOptions o;
//   o.num_arrays = 3;                 // params, exp_avg, exp_avg_sq
//   o.numel = partition_numel;
//   o.subgroup_numel = sub_group_size;   // default 1 Mi elements
//   o.buffer_count = 8;                   // the default
//   SwapStore store(device.get(), o);  // *device must outlive store
//   if (!store.has_state()) store.write_arrays(initial);  // params, 0, 0
//   ...
//   store.update([&](const SwapSubgroup& s) {   // every step
//     fused_adam_step(s.arrays[0], grads + s.first, s.arrays[1],
//                     s.arrays[2], s.count, hyper);
//   });                                       // committed when it returns
//
// Note [Swap pass atomicity]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// One pass (update, write_all, write_arrays) is all or nothing on the
// device. The device holds two superblock records (at offsets 0 and 4096)
// and two slots per sub-group (copy 0 and copy 1, each a contiguous region
// of all sub-groups). The committed state of generation g lives entirely in
// copy g % 2, described by the record in superblock g % 2: a CRC-32C'd
// block naming the geometry and g. A pass that produces generation g + 1
//   1. reads every sub-group from copy g % 2 (checking each slot's
//      trailer: generation, index and CRC-32C of its data),
//   2. writes every updated sub-group, with a new trailer, to copy
//      (g + 1) % 2, never touching copy g % 2,
//   3. flushes (fdatasync): all new slots are durable,
//   4. writes the record for g + 1 into superblock (g + 1) % 2, and
//   5. flushes again. Only then does update() return.
// Opening a device picks the valid record with the highest generation.
// Before step 4's record is durable, every valid record is g or older and
// copy g % 2 is untouched, so the old state is what a reader sees; a torn
// record fails its CRC and is ignored. After step 5, record g + 1 is
// durable and names slots made durable in step 3. So whichever operation
// fails or wherever the process or machine dies, the device holds the old
// state or the new one, never a mix (tested with offload/faulty_block_device.h:
// every fault at every operation index, crash and reopen).
//
// A failed pass throws (IoError, or the caller's own exception) after
// waiting for its I/O in flight, and the object stays at generation g: the
// next pass reads copy g % 2 again and rewrites copy (g + 1) % 2 from
// scratch. One case is indeterminate, as for any storage commit: if the
// record write of step 4 or the flush of step 5 reports an error, the drive
// may still have persisted the record. The pass throws and the object stays
// at g; a crash at that instant may come back at g or at g + 1 (each
// complete). Before it writes anything else, the next pass invalidates that
// record (writes zeros over it and flushes), so the object and the device
// agree again.
//
// Note [Parameters in memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The store's atomicity covers what it stores. A caller whose fp32
// parameters live in memory (num_arrays = 2: exp_avg, exp_avg_sq) must not
// update them in place inside the pass: a fault after sub-group i would
// leave the memory at step t + 1 and the moments at step t. Stage the new
// values and publish them after the commit:
//
//   store.update([&](const SwapSubgroup& s) {
//     float* p = staging + s.first;                 // caller-owned, n floats
//     std::memcpy(p, params + s.first, s.count * sizeof(float));
//     fused_adam_step(p, grads + s.first, s.arrays[0], s.arrays[1], s.count,
//                     hyper);
//   });
//   std::swap(params, staging);                      // only after commit
//
// If update() throws, params (and the store) are exactly as before the
// step, and the step can be retried or reported. Swapping two pointers
// costs nothing; a copy back is fine too. The function may run more than
// once for a sub-group only across passes (a retried step), never twice in
// one pass, and only ever on the committed state.
// The engine's optimizer (zero/optimizer.h Note [NVMe optimizer state])
// is such a caller with the staging one level up: it updates in place a
// copy the stage owns (Note [Transactional update]) and uses
// prepare_update(), so that the new moments count only once the stage's
// all-gather has succeeded too.
//
// Memory: buffer_count buffers of slot_bytes() (about num_arrays ×
// subgroup_numel × 4 bytes) each, allocated at construction; a pass
// allocates nothing. Device space: device_bytes() (two copies of the state
// plus 8 KiB), reserved at construction so that a full drive is reported
// then.
//
// Pipelining: sub-groups are processed in order 0, 1, ..., G-1 on the
// calling thread. Before the function runs on sub-group i, the read of
// i + 1 has been submitted (and of further sub-groups while buffers are
// free), and the writes of earlier sub-groups are in flight; with
// buffer_count = 3 the drive reads i + 1 and writes i - 1 while the
// function updates i. More buffers let reads run further ahead of writes
// that the drive queues behind them. The function may use threads of its
// own (fused_adam_step's threads option).
//
// DeepSpeed's offload_optimizer.buffer_count counts buffers of one state
// tensor's sub-group (its default 4 covers the tensors of one sub-group);
// a buffer here holds a whole sub-group of all K arrays. The same number
// therefore costs K times the memory here; the engine should document how
// it maps the key (e.g. buffer_count here = max(2, its value / K)).
//
// Thread safety: none; one thread uses a store at a time, and the device
// only through it. The functions passed to a pass must not call the store.
// *device must outlive the store.
#ifndef ZEROSTEP_OFFLOAD_SWAP_STORE_H_
#define ZEROSTEP_OFFLOAD_SWAP_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "offload/block_device.h"

namespace zerostep {

struct SwapStoreOptions {
  // Number of arrays K, in [1, SwapStore::kMaxArrays]. No default.
  size_t num_arrays = 0;
  // Elements n of each array, >= 1. No default.
  uint64_t numel = 0;
  // Elements of each array per sub-group: the unit read, updated and
  // written back (DeepSpeed's zero_optimization.sub_group_size). Default
  // 1 Mi elements (4 MiB per array).
  size_t subgroup_numel = size_t{1} << 20;
  // In-memory sub-group buffers, >= 2. 2: the read of i + 1 overlaps the
  // update of i, the write of i overlaps nothing; 3: the write of i - 1
  // overlaps too; more: reads further ahead while earlier writes are still
  // queued behind reads (Linux's mq-deadline serves reads first). Default
  // 8: with the default sub-group, 96 MiB for 3 arrays; docs/benchmarks.md
  // as of fee84cc has the measurements behind both defaults.
  size_t buffer_count = 8;
  // The largest single device operation: a sub-group's transfer is split
  // into pieces of this size (a multiple of kBlockAlign, at most
  // kMaxIoBytes) so that several are in flight. Default 2 MiB.
  size_t io_chunk_bytes = size_t{2} << 20;
};

// One sub-group handed to update()/write_all() functions.
struct SwapSubgroup {
  size_t index;          // sub-group number, 0-based
  uint64_t first;        // index in each array of this sub-group's element 0
  size_t count;          // elements of each array here (the last may be fewer)
  float* const* arrays;  // num_arrays pointers, count floats each, 64-byte
                         // aligned, valid only during the call
  size_t num_arrays;
};

// One sub-group handed to read_all() functions.
struct SwapSubgroupView {
  size_t index;
  uint64_t first;
  size_t count;
  const float* const* arrays;
  size_t num_arrays;
};

// What the last pass moved and where its time went.
struct SwapPassStats {
  uint64_t bytes_read = 0;      // device bytes read (slots and records)
  uint64_t bytes_written = 0;   // device bytes written (slots and records)
  double seconds = 0;           // the whole pass, commit included
  double function_seconds = 0;  // inside the caller's function
  double wait_seconds = 0;      // blocked on the device (wait, flush)
};

class SwapStore {
 public:
  static constexpr size_t kMaxArrays = 16;

  // Opens the store kept on *device. If the device holds a committed state
  // (a valid superblock record) with the same num_arrays, numel and
  // subgroup_numel, has_state() is true and generation() is its
  // generation; if it holds none (a new file, or one whose first write_all
  // never committed), has_state() is false. Reserves device_bytes() on the
  // device.
  // Throws UsageError for invalid options (naming the field and the rule);
  // IoError if the device holds a store of another geometry (naming both
  // and the fix), if reading the superblock fails, or if the device cannot
  // make room (ENOSPC names the device and the bytes needed). Allocates the
  // buffers (std::bad_alloc if memory is short).
  SwapStore(BlockDevice* device, const SwapStoreOptions& options);
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // Whether a state has been committed (by write_all/write_arrays, in this
  // or an earlier process).
  bool has_state() const { return generation_ > 0; }
  // The committed generation: 0 before the first commit, then +1 per
  // successful write_all/write_arrays/update.
  uint64_t generation() const { return generation_; }

  // Runs fn on every sub-group of the committed state, in order, and
  // commits the arrays as fn left them (Note [Swap pass atomicity]).
  // Returns once the new generation is durable. If fn or the device
  // throws, waits for the pass's I/O in flight and rethrows (device errors
  // as IoError naming the device, the pass, the sub-group and the cause);
  // the committed state and generation() are unchanged, and the store is
  // usable. UsageError (nothing done) if !has_state(). A sub-group whose
  // data fails its checksum on reading is IoError ("corrupt"): the device
  // was modified behind the store or the drive corrupted it.
  void update(const std::function<void(const SwapSubgroup&)>& fn);

  // Two-phase update, for a caller whose step must also succeed elsewhere
  // (a collective) before the new state may count: prepare_update() runs
  // update()'s pass through step 3 of Note [Swap pass atomicity] (the new
  // sub-groups are durable in the other copy) and stops before the commit
  // record. commit_prepared() writes and flushes the record (steps 4-5):
  // the prepared state becomes generation() + 1. discard_prepared() drops
  // it: the committed state never changed. While a pass is prepared, every
  // other pass is a UsageError. Errors: prepare_update as update() (nothing
  // prepared then); commit_prepared IoError (the prepared state is dropped,
  // the store stays at its generation, with the record uncertain exactly
  // as for a failed update()).
  void prepare_update(const std::function<void(const SwapSubgroup&)>& fn);
  void commit_prepared();
  void discard_prepared();
  bool has_prepared() const { return prepared_; }

  // Commits a whole new state: fn fills every sub-group (whose arrays it
  // receives zeroed) in order. Nothing is read. Errors and atomicity as
  // update(); allowed without a state (it creates the first one).
  void write_all(const std::function<void(const SwapSubgroup&)>& fn);

  // Runs fn on every sub-group of the committed state, in order, without
  // writing anything. Errors as update(); UsageError if !has_state().
  void read_all(const std::function<void(const SwapSubgroupView&)>& fn);

  // Whole-array helpers over write_all/read_all, for initialisation and
  // checkpoints: arrays[k] points to numel floats of array k.
  void write_arrays(const float* const* arrays);
  void read_arrays(float* const* arrays);

  // Copies elements [first, first + count) of array `array` of the
  // committed state into out[0, count): reads only the sub-groups that
  // overlap the range, one after another through the store's buffers, and
  // verifies each one's checksums as a pass does. Writes nothing to the
  // device and changes no state. UsageError (nothing read) if !has_state(),
  // array >= num_arrays or the range is outside [0, numel); IoError naming
  // the device, the range and the cause if a read fails or a sub-group is
  // corrupt (out is then undefined). count == 0 reads nothing. Used for
  // stage 3's parameter partitions (Note [NVMe parameter partitions] in
  // zero/stage3.h).
  void read_range(size_t array, uint64_t first, uint64_t count, float* out);

  const SwapStoreOptions& options() const { return options_; }
  size_t num_subgroups() const { return num_subgroups_; }
  // Bytes of one sub-group slot on the device and of one buffer in memory.
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Device space the store uses.
  uint64_t device_bytes() const;
  // Memory held in buffers.
  uint64_t buffer_bytes() const;
  const SwapPassStats& last_pass_stats() const { return stats_; }
  const BlockDevice& device() const { return *device_; }

 private:
  enum class Mode { kRead, kUpdate, kWrite };
  struct Buffer;
  class Pass;  // one run_pass's pipeline state

  // The pipeline of Note [Swap pass atomicity]; body runs on each
  // sub-group's buffer in order.
  // commit = false stops a writing pass before its record (prepared_).
  void run_pass(Mode mode, const std::function<void(Buffer&)>& body,
                bool commit = true);
  // After a failed pass: waits for every transfer still in flight (their
  // errors ignored), so that no buffer is reused or freed under one.
  void wait_every_transfer();
  // Waits for each of b's transfers in flight, ignoring their errors.
  void wait_ignoring_errors(Buffer& b);
  // Inside a catch block of run_pass: rethrows the error in flight, an
  // IoError as one naming the call, the generations and `where` the pass
  // failed.
  [[noreturn]] void rethrow_pass_error(Mode mode,
                                       const std::string& where) const;
  void require_not_prepared(const char* what) const;
  // update() and prepare_update(): `what` names the call in errors.
  void update_pass(const char* what,
                   const std::function<void(const SwapSubgroup&)>& fn,
                   bool commit);
  void commit_record();
  uint64_t slot_offset(uint64_t copy, size_t subgroup) const;
  size_t subgroup_count(size_t subgroup) const;
  uint32_t data_crc(const Buffer& b) const;
  // Writes b's trailer for `generation` / checks it against generation_.
  void seal(Buffer& b, uint64_t generation) const;
  void verify(const Buffer& b, uint64_t copy) const;
  // Writes the superblock record of `generation` (0: zeros) into `copy`.
  void write_record(uint64_t generation, uint64_t copy);
  void invalidate_uncertain_record();

  BlockDevice* device_;
  SwapStoreOptions options_;
  size_t num_subgroups_ = 0;
  uint64_t array_stride_bytes_ = 0;  // offset of array k+1 after array k
  uint64_t slot_bytes_ = 0;
  uint64_t generation_ = 0;
  // A commit record write or flush failed: the record slot for
  // generation_ + 1 may hold a valid record (Note [Swap pass atomicity]).
  bool record_uncertain_ = false;
  // prepare_update() succeeded; neither commit_prepared() nor
  // discard_prepared() has run since.
  bool prepared_ = false;
  std::vector<Buffer> buffers_;
  AlignedBuffer record_buffer_;  // superblock I/O
  SwapPassStats stats_;
};

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_SWAP_STORE_H_
