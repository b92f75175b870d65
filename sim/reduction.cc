#include "sim/reduction.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/rank_order.h"

namespace zerostep {
namespace {

// Note [Chunked reduction]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The reductions walk the buffer in chunks of kChunkBytes and finish each
// chunk (every rank folded in, kAvg's division in the last pass, the
// write-back) before starting the next. (An all-reduce of 2 to 4 ranks
// needs no accumulator: Note [In-place all-reduce].) The accumulator chunk
// stays in L1 and each rank's chunk is read once, so memory traffic is one read
// of every input and one write of every output, instead of a pass over the
// whole buffer per rank. Each element is still acc = x0; acc = acc (op) x1;
// ...; then / W (Note [Reduction order]): chunking only changes which elements
// are interleaved, never the operations or their order on any one element, so
// the result is the same bits as the unchunked fold. Within a chunk,
// rank_order::reduce folds up to four ranks per pass over the accumulator
// (four input streams read at once), again without changing any element's
// operations or their order.
using rank_order::kChunkBytes;

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

// Note [Parallel reduction]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// An all-reduce or reduce-scatter walks an index space of elements: for
// an all-reduce the n elements of every buffer (element i reduces every
// rank's element i into every rank's element i), for a reduce-scatter the
// W * n elements of every input (element i reduces every rank's input
// element i into element i % n of output i / n). That space is cut into
// parts of kPartBytes, a whole number of chunks (Note [Chunked reduction]:
// where the chunks fall never changes the bits). A part reads only its own
// indices of the inputs and writes only its own indices of the outputs, so
// the parts are disjoint: they may run on different threads at once, in
// any order, and every element is still reduced by one thread with the
// fold of Note [Reduction order], so the result is the same bits as one
// thread walking the whole space. The simulator hands the parts out to the
// rank threads (Note [Sim collective] in sim/sim_world.h). A collective of
// one part (at most kPartBytes of index space) is not worth the extra
// rendezvous: it runs on one thread, as before.
constexpr size_t kPartBytes = 256 << 10;
static_assert(kPartBytes % kChunkBytes == 0, "a part is whole chunks");

// Note [In-place all-reduce]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// An all-reduce of up to four ranks whose buffers do not overlap folds
// each element and writes the result to every rank in one loop: it reads
// every buffer once and writes every buffer once, as a memcpy of each
// would, with no accumulator between. Each element still gets exactly the
// operations of Note [Reduction order], in rank order, and every rank the
// same bits; an element is read from every rank before any rank's copy of
// it is written. More ranks, buffers that overlap (two ranks passing the
// same memory), and buffers of more than kInPlaceMaxBytes take the chunked
// path below. The last is measured, not derived: at 64 MiB per rank and
// world 4, far past the caches, the in-place loop ran at 0.4-0.7x the
// chunked path's speed on an AMD EPYC when the buffers lay 64 MiB + 4 KiB
// apart, and about as fast or faster when they lay 64 MiB + 36 KiB apart;
// at 1 to 16 MiB it ran 1.2-2.2x faster (docs/benchmarks.md as of
// fee84cc). The simulator does not choose where the ranks' buffers lie,
// so large ones take the path that was fast on every layout tried. Which
// path runs never changes the bits.
constexpr size_t kInPlaceMaxBytes = size_t{16} << 20;

template <typename T, typename F, typename G>
void all_reduce_in_place(const std::vector<Buffer>& bufs, size_t begin,
                         size_t end, F f, G g) {
  const size_t n = end - begin;
  const auto at = [&](size_t r) {
    return static_cast<T*>(bufs[r].data) + begin;
  };
  switch (bufs.size()) {
    case 2: {
      T* __restrict a = at(0);
      T* __restrict b = at(1);
      for (size_t i = 0; i < n; ++i) {
        const T x = g(f(a[i], b[i]));
        a[i] = x;
        b[i] = x;
      }
      return;
    }
    case 3: {
      T* __restrict a = at(0);
      T* __restrict b = at(1);
      T* __restrict c = at(2);
      for (size_t i = 0; i < n; ++i) {
        const T x = g(f(f(a[i], b[i]), c[i]));
        a[i] = x;
        b[i] = x;
        c[i] = x;
      }
      return;
    }
    default: {
      T* __restrict a = at(0);
      T* __restrict b = at(1);
      T* __restrict c = at(2);
      T* __restrict d = at(3);
      for (size_t i = 0; i < n; ++i) {
        const T x = g(f(f(f(a[i], b[i]), c[i]), d[i]));
        a[i] = x;
        b[i] = x;
        c[i] = x;
        d[i] = x;
      }
      return;
    }
  }
}

// Whether no two of the buffers share a byte (compared as integers: the
// buffers are distinct objects, which pointer comparison does not order).
bool disjoint(const std::vector<Buffer>& bufs) {
  for (size_t r = 0; r < bufs.size(); ++r) {
    const auto a = reinterpret_cast<uintptr_t>(bufs[r].data);
    for (size_t q = r + 1; q < bufs.size(); ++q) {
      const auto b = reinterpret_cast<uintptr_t>(bufs[q].data);
      if (a < b + bufs[q].bytes() && b < a + bufs[r].bytes()) return false;
    }
  }
  return true;
}

// Elements [begin, end) of an all-reduce's index space, in place (Note
// [In-place all-reduce]) or else chunk by chunk: each chunk is reduced
// into `acc` (one chunk of scratch) from every rank's unmodified chunk,
// then copied back to every rank while those lines are still in cache
// (Note [Chunked reduction]); the inputs are the outputs.
template <typename T>
void all_reduce_range(const std::vector<Buffer>& bufs, ReduceOp op,
                      size_t begin, size_t end,
                      std::vector<unsigned char>* scratch) {
  const size_t world = bufs.size();
  rank_order::with_fold<T>(op, world, [&](auto f, auto g) {
    if (world >= 2 && world <= 4 && bufs[0].bytes() <= kInPlaceMaxBytes &&
        disjoint(bufs)) {
      all_reduce_in_place<T>(bufs, begin, end, f, g);
      return;
    }
    const size_t chunk = kChunkBytes / sizeof(T);
    T* __restrict acc = scratch_of<T>(scratch, std::min(chunk, end - begin));
    const std::vector<const T*> in = data_of<T>(bufs);
    for (size_t at = begin; at < end; at += chunk) {
      const size_t count = std::min(chunk, end - at);
      rank_order::reduce_with(in, at, count, acc, f, g);
      for (const Buffer& b : bufs)
        std::memcpy(static_cast<T*>(b.data) + at, acc, count * sizeof(T));
    }
  });
}

// Elements [begin, end) of a reduce-scatter's index space. Outputs do not
// overlap inputs: each output chunk is its own accumulator. A chunk never
// crosses from one output into the next.
// With `accumulate` (ReduceScatterOptions::accumulate) each chunk is
// reduced into `tile` and added to the output (rank_order::reduce_add_chunked).
template <typename T>
void reduce_scatter_range(const std::vector<Buffer>& inputs,
                          const std::vector<Buffer>& outputs, ReduceOp op,
                          bool accumulate, size_t begin, size_t end, T* tile) {
  const size_t n = outputs[0].numel;
  const size_t chunk = kChunkBytes / sizeof(T);
  const std::vector<const T*> in = data_of<T>(inputs);
  for (size_t at = begin; at < end;) {
    const size_t owner = at / n, offset = at - owner * n;
    const size_t count = std::min({chunk, end - at, n - offset});
    T* out = static_cast<T*>(outputs[owner].data) + offset;
    if (accumulate)
      rank_order::reduce_add_chunked<T>(in, at, count, op, out, tile);
    else
      rank_order::reduce<T>(in, at, count, op, out);
    at += count;
  }
}

// The size of a reduction's index space (Note [Parallel reduction]), in
// elements.
size_t index_space(CollectiveKind kind, const std::vector<Buffer>& inputs,
                   const std::vector<Buffer>& outputs) {
  return kind == CollectiveKind::kAllReduce
             ? inputs[0].numel
             : outputs[0].numel * outputs.size();
}

// Reduces elements [begin, end) of the index space of an all-reduce or
// reduce-scatter.
template <typename T>
void reduce_range(CollectiveKind kind, ReduceOp op, bool accumulate,
                  const std::vector<Buffer>& inputs,
                  const std::vector<Buffer>& outputs, size_t begin, size_t end,
                  std::vector<unsigned char>* scratch) {
  if (kind == CollectiveKind::kAllReduce) {
    all_reduce_range<T>(inputs, op, begin, end, scratch);
  } else {
    const size_t chunk = std::min(end - begin, kChunkBytes / sizeof(T));
    reduce_scatter_range<T>(
        inputs, outputs, op, accumulate, begin, end,
        accumulate ? scratch_of<T>(scratch, chunk) : nullptr);
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

}  // namespace

void all_reduce_in_rank_order(const std::vector<Buffer>& bufs, ReduceOp op,
                              std::vector<unsigned char>* scratch) {
  rank_order::with_type(bufs[0].dtype, [&](auto tag) {
    reduce_range<decltype(tag)>(CollectiveKind::kAllReduce, op, false, bufs,
                                bufs, 0, bufs[0].numel, scratch);
  });
}

void reduce_scatter_in_rank_order(const std::vector<Buffer>& inputs,
                                  const std::vector<Buffer>& outputs,
                                  ReduceOp op, bool accumulate,
                                  std::vector<unsigned char>* scratch) {
  std::vector<unsigned char> own;
  rank_order::with_type(inputs[0].dtype, [&](auto tag) {
    reduce_range<decltype(tag)>(
        CollectiveKind::kReduceScatter, op, accumulate, inputs, outputs, 0,
        index_space(CollectiveKind::kReduceScatter, inputs, outputs),
        scratch != nullptr ? scratch : &own);
  });
}

size_t reduction_parts(CollectiveKind kind, const std::vector<Buffer>& inputs,
                       const std::vector<Buffer>& outputs) {
  if (kind != CollectiveKind::kAllReduce &&
      kind != CollectiveKind::kReduceScatter)
    return 1;
  const size_t part = kPartBytes / dtype_size(inputs[0].dtype);
  return std::max<size_t>(1, (index_space(kind, inputs, outputs) + part - 1) /
                                 part);
}

void reduce_part_in_rank_order(CollectiveKind kind, ReduceOp op,
                               const std::vector<Buffer>& inputs,
                               const std::vector<Buffer>& outputs, size_t part,
                               std::vector<unsigned char>* scratch,
                               bool accumulate) {
  rank_order::with_type(inputs[0].dtype, [&](auto tag) {
    using T = decltype(tag);
    const size_t total = index_space(kind, inputs, outputs);
    const size_t size = kPartBytes / sizeof(T);
    const size_t begin = std::min(total, part * size);
    reduce_range<T>(kind, op, accumulate, inputs, outputs, begin,
                    std::min(total, begin + size), scratch);
  });
}

void all_gather_in_rank_order(const std::vector<Buffer>& inputs,
                              const std::vector<Buffer>& outputs,
                              std::vector<unsigned char>* scratch) {
  rank_order::with_type(inputs[0].dtype, [&](auto tag) {
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
                          std::vector<unsigned char>* scratch,
                          bool accumulate) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      all_reduce_in_rank_order(inputs, op, scratch);
      return;
    case CollectiveKind::kReduceScatter:
      reduce_scatter_in_rank_order(inputs, outputs, op, accumulate, scratch);
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
