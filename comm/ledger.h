// Ledger: a record of every collective one rank issued, and
// RecordingCommunicator, a decorator that fills it around any backend.
//
// Bytes are counted per rank as the logical payload of the op:
//   all_reduce: the buffer; reduce_scatter: the full input (W chunks);
//   all_gather: the full output (W chunks); broadcast: the buffer;
//   barrier: 0.
// `wire_bytes` is what one rank sends under the ring algorithm:
//   all_reduce 2(W-1)/W·n, reduce_scatter and all_gather (W-1)/W·n,
//   broadcast n (root) — the β terms of the cost model in
//   docs/design/communication.md.
//
// Each entry keeps the call's label (comm/communicator.h): the ledger only
// records it; bytes_in() and count_in() group by its text.
//
// Thread safety: a Ledger is written by its rank's thread only; read it
// after the run (SimWorld::run joins every rank before returning).
#ifndef ZEROSTEP_COMM_LEDGER_H_
#define ZEROSTEP_COMM_LEDGER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"

namespace zerostep {

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier
};
const char* to_string(CollectiveKind kind);

struct LedgerEntry {
  int64_t seq = 0;  // calls recorded by this communicator before, from 0
  CollectiveKind kind = CollectiveKind::kBarrier;
  DType dtype = DType::kFloat32;
  size_t numel = 0;   // elements of the payload as defined above
  uint64_t bytes = 0;
  uint64_t wire_bytes = 0;
  const char* label = kBarrierLabel;  // the options' label, never null
  int world_size = 1;
};

class Ledger {
 public:
  void record(const LedgerEntry& e) { entries_.push_back(e); }
  const std::vector<LedgerEntry>& entries() const { return entries_; }
  void clear() { entries_.clear(); }

  uint64_t total_bytes() const;
  uint64_t total_wire_bytes() const;
  // Payload bytes and number of the entries whose label reads `label`.
  uint64_t bytes_in(std::string_view label) const;
  size_t count_in(std::string_view label) const;

 private:
  std::vector<LedgerEntry> entries_;
};

// Wraps `inner` (not owned; must outlive this) and records each call in
// `*ledger` (not owned) once the call has returned successfully (an
// asynchronous one when it is issued).
class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(Communicator* inner, Ledger* ledger)
      : inner_(inner), ledger_(ledger) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  bool overlaps_async() const override { return inner_->overlaps_async(); }
  bool reduce_scatter_accumulates() const override {
    return inner_->reduce_scatter_accumulates();
  }
  bool reads_device_memory() const override {
    return inner_->reads_device_memory();
  }

  void all_reduce(Buffer buf, const AllReduceOptions& opts) override;
  void reduce_scatter(Buffer input, Buffer output,
                      const ReduceScatterOptions& opts) override;
  std::shared_ptr<Work> all_reduce_async(Buffer buf,
                                         const AllReduceOptions& opts) override;
  std::shared_ptr<Work> all_gather_async(Buffer input, Buffer output,
                                         const AllGatherOptions& opts) override;
  std::shared_ptr<Work> reduce_scatter_async(
      Buffer input, Buffer output, const ReduceScatterOptions& opts) override;
  void all_gather(Buffer input, Buffer output,
                  const AllGatherOptions& opts) override;
  void broadcast(Buffer buf, const BroadcastOptions& opts) override;
  void barrier() override;

 private:
  void add(CollectiveKind kind, DType dtype, size_t numel, const char* label);

  Communicator* inner_;
  Ledger* ledger_;
  int64_t seq_ = 0;
};

}  // namespace zerostep

#endif  // ZEROSTEP_COMM_LEDGER_H_
