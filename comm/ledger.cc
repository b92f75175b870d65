#include "comm/ledger.h"

#include "common/errors.h"

namespace zerostep {

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "?";
}

uint64_t Ledger::total_bytes() const {
  uint64_t total = 0;
  for (const LedgerEntry& e : entries_) total += e.bytes;
  return total;
}

uint64_t Ledger::total_wire_bytes() const {
  uint64_t total = 0;
  for (const LedgerEntry& e : entries_) total += e.wire_bytes;
  return total;
}

uint64_t Ledger::bytes_in(std::string_view label) const {
  uint64_t total = 0;
  for (const LedgerEntry& e : entries_)
    if (e.label == label) total += e.bytes;
  return total;
}

size_t Ledger::count_in(std::string_view label) const {
  size_t n = 0;
  for (const LedgerEntry& e : entries_)
    if (e.label == label) ++n;
  return n;
}

void RecordingCommunicator::add(CollectiveKind kind, DType dtype, size_t numel,
                                const char* label) {
  ZS_CHECK(label != nullptr);
  LedgerEntry e;
  e.seq = seq_++;
  e.kind = kind;
  e.dtype = dtype;
  e.numel = numel;
  e.bytes = numel * dtype_size(dtype);
  e.label = label;
  const uint64_t w = static_cast<uint64_t>(world_size());
  switch (kind) {
    case CollectiveKind::kAllReduce:
      e.wire_bytes = 2 * (w - 1) * e.bytes / w;
      break;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
      e.wire_bytes = (w - 1) * e.bytes / w;
      break;
    case CollectiveKind::kBroadcast:
      e.wire_bytes = w > 1 ? e.bytes : 0;
      break;
    case CollectiveKind::kBarrier:
      e.wire_bytes = 0;
      break;
  }
  e.world_size = world_size();
  ledger_->record(e);
}

void RecordingCommunicator::all_reduce(Buffer buf,
                                       const AllReduceOptions& opts) {
  inner_->all_reduce(buf, opts);
  add(CollectiveKind::kAllReduce, buf.dtype, buf.numel, opts.label);
}

void RecordingCommunicator::reduce_scatter(Buffer input, Buffer output,
                                           const ReduceScatterOptions& opts) {
  inner_->reduce_scatter(input, output, opts);
  add(CollectiveKind::kReduceScatter, input.dtype, input.numel, opts.label);
}

std::shared_ptr<Work> RecordingCommunicator::all_reduce_async(
    Buffer buf, const AllReduceOptions& opts) {
  std::shared_ptr<Work> work = inner_->all_reduce_async(buf, opts);
  add(CollectiveKind::kAllReduce, buf.dtype, buf.numel, opts.label);
  return work;
}

std::shared_ptr<Work> RecordingCommunicator::reduce_scatter_async(
    Buffer input, Buffer output, const ReduceScatterOptions& opts) {
  std::shared_ptr<Work> work = inner_->reduce_scatter_async(input, output, opts);
  add(CollectiveKind::kReduceScatter, input.dtype, input.numel, opts.label);
  return work;
}

std::shared_ptr<Work> RecordingCommunicator::all_gather_async(
    Buffer input, Buffer output, const AllGatherOptions& opts) {
  std::shared_ptr<Work> work = inner_->all_gather_async(input, output, opts);
  add(CollectiveKind::kAllGather, output.dtype, output.numel, opts.label);
  return work;
}

void RecordingCommunicator::all_gather(Buffer input, Buffer output,
                                       const AllGatherOptions& opts) {
  inner_->all_gather(input, output, opts);
  add(CollectiveKind::kAllGather, output.dtype, output.numel, opts.label);
}

void RecordingCommunicator::broadcast(Buffer buf,
                                      const BroadcastOptions& opts) {
  inner_->broadcast(buf, opts);
  add(CollectiveKind::kBroadcast, buf.dtype, buf.numel, opts.label);
}

void RecordingCommunicator::barrier() {
  inner_->barrier();
  add(CollectiveKind::kBarrier, DType::kFloat32, 0, kBarrierLabel);
}

}  // namespace zerostep
