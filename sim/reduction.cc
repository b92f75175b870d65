#include "sim/reduction.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace zerostep {
namespace {

// acc[i] = op(acc[i], x[i]); the op is chosen once per call, not per
// element, so each loop is a plain elementwise pass.
template <typename T>
void fold(T* __restrict acc, const T* __restrict x, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], x[i]);
      return;
  }
}

// Note [Chunked reduction]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The reductions walk the buffer in chunks of kChunkBytes and finish each
// chunk (every rank folded in, kAvg's division, the write-back) before
// starting the next. The accumulator chunk stays in L1 and each rank's
// chunk is read once, so memory traffic is one read of every input and
// one write of every output, instead of a pass over the whole buffer per
// rank. Each element is still acc = x0; acc = acc (op) x1; ...; then / W
// (Note [Reduction order]): chunking only changes which elements are
// interleaved, never the operations or their order on any one element, so
// the result is the same bits as the unchunked fold.
constexpr size_t kChunkBytes = 16 << 10;

// Reduces `count` elements at element offset `offset` of every rank's
// input, in rank order (Note [Reduction order]), into `out`, which must not
// overlap any input. The caller chunks (Note [Chunked reduction]).
template <typename T>
void reduce_rank_order(const std::vector<const T*>& inputs, size_t offset,
                       size_t count, ReduceOp op, T* __restrict out) {
  const size_t world = inputs.size();
  std::memcpy(out, inputs[0] + offset, count * sizeof(T));
  for (size_t r = 1; r < world; ++r) fold(out, inputs[r] + offset, count, op);
  if (op == ReduceOp::kAvg) {
    const T w = static_cast<T>(world);
    for (size_t i = 0; i < count; ++i) out[i] = out[i] / w;
  }
}

// `n` elements of `*scratch`, grown if needed.
template <typename T>
T* scratch_of(std::vector<unsigned char>* scratch, size_t n) {
  if (scratch->size() < n * sizeof(T)) scratch->resize(n * sizeof(T));
  return reinterpret_cast<T*>(scratch->data());
}

template <typename T>
std::vector<const T*> data_of(const std::vector<Buffer>& bufs) {
  std::vector<const T*> data(bufs.size());
  for (size_t r = 0; r < bufs.size(); ++r)
    data[r] = static_cast<const T*>(bufs[r].data);
  return data;
}

template <typename T>
void all_reduce_typed(const std::vector<Buffer>& bufs, ReduceOp op,
                      std::vector<unsigned char>* scratch) {
  // The inputs are the outputs: each chunk is reduced into scratch from
  // every rank's unmodified chunk, then copied back to every rank, while
  // those lines are still in cache (Note [Chunked reduction]).
  const size_t n = bufs[0].numel;
  const size_t chunk = std::min(n, kChunkBytes / sizeof(T));
  T* acc = scratch_of<T>(scratch, chunk);
  const std::vector<const T*> in = data_of<T>(bufs);
  for (size_t begin = 0; begin < n; begin += chunk) {
    const size_t count = std::min(chunk, n - begin);
    reduce_rank_order<T>(in, begin, count, op, acc);
    for (const Buffer& b : bufs)
      std::memcpy(static_cast<T*>(b.data) + begin, acc, count * sizeof(T));
  }
}

template <typename T>
void reduce_scatter_typed(const std::vector<Buffer>& inputs,
                          const std::vector<Buffer>& outputs, ReduceOp op) {
  // Outputs do not overlap inputs: each output chunk is its own
  // accumulator (Note [Chunked reduction]).
  const size_t n = outputs[0].numel;
  const size_t chunk = std::max<size_t>(1, kChunkBytes / sizeof(T));
  const std::vector<const T*> in = data_of<T>(inputs);
  for (size_t r = 0; r < outputs.size(); ++r) {
    T* out = static_cast<T*>(outputs[r].data);
    for (size_t begin = 0; begin < n; begin += chunk)
      reduce_rank_order<T>(in, r * n + begin, std::min(chunk, n - begin), op,
                           out + begin);
  }
}

template <typename T>
void all_gather_typed(const std::vector<Buffer>& inputs,
                      const std::vector<Buffer>& outputs,
                      std::vector<unsigned char>* scratch) {
  const size_t n = inputs[0].numel;
  const size_t w = inputs.size();
  // Stage first: an input may be a slice of its rank's output.
  T* staged = scratch_of<T>(scratch, n * w);
  for (size_t q = 0; q < w; ++q)
    std::memcpy(staged + q * n, inputs[q].data, n * sizeof(T));
  for (const Buffer& out : outputs)
    std::memcpy(out.data, staged, n * w * sizeof(T));
}

// Calls fn(T{}) for the element type of `dtype`.
template <typename Fn>
void with_type(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      fn(float{});
      return;
    case DType::kFloat64:
      fn(double{});
      return;
    case DType::kInt64:
      fn(int64_t{});
      return;
  }
}

}  // namespace

void all_reduce_in_rank_order(const std::vector<Buffer>& bufs, ReduceOp op,
                              std::vector<unsigned char>* scratch) {
  with_type(bufs[0].dtype, [&](auto tag) {
    all_reduce_typed<decltype(tag)>(bufs, op, scratch);
  });
}

void reduce_scatter_in_rank_order(const std::vector<Buffer>& inputs,
                                  const std::vector<Buffer>& outputs,
                                  ReduceOp op) {
  with_type(inputs[0].dtype, [&](auto tag) {
    reduce_scatter_typed<decltype(tag)>(inputs, outputs, op);
  });
}

void all_gather_in_rank_order(const std::vector<Buffer>& inputs,
                              const std::vector<Buffer>& outputs,
                              std::vector<unsigned char>* scratch) {
  with_type(inputs[0].dtype, [&](auto tag) {
    all_gather_typed<decltype(tag)>(inputs, outputs, scratch);
  });
}

void broadcast_from_root(const std::vector<Buffer>& bufs, int root) {
  const Buffer& from = bufs[root];
  for (size_t r = 0; r < bufs.size(); ++r)
    if (static_cast<int>(r) != root)
      std::memcpy(bufs[r].data, from.data, from.bytes());
}

void move_collective_data(CollectiveKind kind, ReduceOp op, int root,
                          const std::vector<Buffer>& inputs,
                          const std::vector<Buffer>& outputs,
                          std::vector<unsigned char>* scratch) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      all_reduce_in_rank_order(inputs, op, scratch);
      return;
    case CollectiveKind::kReduceScatter:
      reduce_scatter_in_rank_order(inputs, outputs, op);
      return;
    case CollectiveKind::kAllGather:
      all_gather_in_rank_order(inputs, outputs, scratch);
      return;
    case CollectiveKind::kBroadcast:
      broadcast_from_root(inputs, root);
      return;
    case CollectiveKind::kBarrier:
      return;
  }
}

}  // namespace zerostep
