// The rank-order fold (Note [Reduction order] in sim/sim_world.h): the one
// way zerostep's own reductions combine W ranks' values, so that a backend
// that reduces in this order gives the simulator's bits.
//
//   out[i] = x0[i]; out[i] = out[i] (op) x1[i]; ...; out[i] (op) x{W-1}[i];
//   then out[i] / W for kAvg (a true division, in the buffer's dtype).
//
// Header-only templates without LibTorch: the simulator's reductions
// (sim/reduction.cc) and the gloo backend's reduce-scatter
// (comm/gloo_world.cc) both inline them into their loops.
#ifndef ZEROSTEP_COMM_RANK_ORDER_H_
#define ZEROSTEP_COMM_RANK_ORDER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/communicator.h"

namespace zerostep {
namespace rank_order {

// The passes of reduce(), each a plain elementwise loop over `f` (the op,
// chosen once per call, not per element). A pass folds up to four ranks,
// so it reads up to four input streams at once and the accumulator is
// read and written once per four ranks, not once per rank; the ops stay in
// rank order, (((acc (op) a) (op) b) (op) c) (op) d, so the bits are those
// of one rank per pass.
template <typename T, typename F>
void first_pass(T* __restrict out, const T* const* in, size_t k, size_t n,
                F f) {
  const T* __restrict a = in[0];
  const T* __restrict b = in[1];
  switch (k) {
    case 2:
      for (size_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
      return;
    case 3: {
      const T* __restrict c = in[2];
      for (size_t i = 0; i < n; ++i) out[i] = f(f(a[i], b[i]), c[i]);
      return;
    }
    default: {
      const T* __restrict c = in[2];
      const T* __restrict d = in[3];
      for (size_t i = 0; i < n; ++i) out[i] = f(f(f(a[i], b[i]), c[i]), d[i]);
      return;
    }
  }
}
template <typename T, typename F>
void fold_pass(T* __restrict acc, const T* const* in, size_t k, size_t n,
               F f) {
  const T* __restrict a = in[0];
  switch (k) {
    case 1:
      for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], a[i]);
      return;
    case 2: {
      const T* __restrict b = in[1];
      for (size_t i = 0; i < n; ++i) acc[i] = f(f(acc[i], a[i]), b[i]);
      return;
    }
    case 3: {
      const T* __restrict b = in[1];
      const T* __restrict c = in[2];
      for (size_t i = 0; i < n; ++i) acc[i] = f(f(f(acc[i], a[i]), b[i]), c[i]);
      return;
    }
    default: {
      const T* __restrict b = in[1];
      const T* __restrict c = in[2];
      const T* __restrict d = in[3];
      for (size_t i = 0; i < n; ++i)
        acc[i] = f(f(f(f(acc[i], a[i]), b[i]), c[i]), d[i]);
      return;
    }
  }
}

template <typename T, typename F>
void reduce_with(const std::vector<const T*>& inputs, size_t offset,
                 size_t count, T* __restrict out, F f) {
  const size_t world = inputs.size();
  if (world == 1) {
    std::memcpy(out, inputs[0] + offset, count * sizeof(T));
    return;
  }
  const T* in[4] = {};
  const auto take = [&](size_t r, size_t k) {
    for (size_t j = 0; j < k; ++j) in[j] = inputs[r + j] + offset;
  };
  size_t r = std::min<size_t>(world, 4);
  take(0, r);
  first_pass(out, in, r, count, f);
  while (r < world) {
    const size_t k = std::min<size_t>(world - r, 4);
    take(r, k);
    fold_pass(out, in, k, count, f);
    r += k;
  }
}

// Reduces `count` elements at element offset `offset` of every rank's
// input, in rank order, into `out`, which must not overlap any input. Long
// reductions are faster cut into cache-sized pieces (reduce_chunked, or the
// caller's own loop); the bits do not depend on the cut.
template <typename T>
void reduce(const std::vector<const T*>& inputs, size_t offset, size_t count,
            ReduceOp op, T* __restrict out) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      reduce_with(inputs, offset, count, out, [](T a, T b) { return a + b; });
      break;
    case ReduceOp::kMax:
      reduce_with(inputs, offset, count, out,
                  [](T a, T b) { return std::max(a, b); });
      break;
    case ReduceOp::kMin:
      reduce_with(inputs, offset, count, out,
                  [](T a, T b) { return std::min(a, b); });
      break;
  }
  if (op == ReduceOp::kAvg) {
    const T w = static_cast<T>(inputs.size());
    for (size_t i = 0; i < count; ++i) out[i] = out[i] / w;
  }
}

// The piece size of a long reduction (Note [Chunked reduction] in
// sim/reduction.cc): one piece of the output stays in L1 while every rank's
// piece is folded into it.
constexpr size_t kChunkBytes = 16 << 10;

// reduce() of [offset, offset + count), one kChunkBytes piece at a time
// (the same bits as one reduce() of the whole range); `out` receives
// element offset at out[0].
template <typename T>
void reduce_chunked(const std::vector<const T*>& inputs, size_t offset,
                    size_t count, ReduceOp op, T* __restrict out) {
  const size_t chunk = kChunkBytes / sizeof(T);
  for (size_t at = 0; at < count; at += chunk)
    reduce(inputs, offset + at, std::min(chunk, count - at), op, out + at);
}

// out[i] = out[i] + reduce(...)[i] for `count` elements (a reduce-scatter
// with ReduceScatterOptions::accumulate): each kChunkBytes piece is
// reduced into `tile` (kChunkBytes / sizeof(T) elements), then added, so
// the bits are those of reduce() into a scratch buffer followed by adding
// that buffer into `out`. `out` must not overlap any input or `tile`.
template <typename T>
void reduce_add_chunked(const std::vector<const T*>& inputs, size_t offset,
                        size_t count, ReduceOp op, T* __restrict out,
                        T* __restrict tile) {
  const size_t chunk = kChunkBytes / sizeof(T);
  for (size_t at = 0; at < count; at += chunk) {
    const size_t k = std::min(chunk, count - at);
    reduce(inputs, offset + at, k, op, tile);
    T* __restrict o = out + at;
    for (size_t i = 0; i < k; ++i) o[i] = o[i] + tile[i];
  }
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

}  // namespace rank_order
}  // namespace zerostep

#endif  // ZEROSTEP_COMM_RANK_ORDER_H_
