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

// Reduces `count` elements at element offset `offset` of every rank's
// input, in rank order, into `out`, which must not overlap any input. Long
// reductions are faster cut into cache-sized pieces (reduce_chunked, or the
// caller's own loop); the bits do not depend on the cut.
template <typename T>
void reduce(const std::vector<const T*>& inputs, size_t offset, size_t count,
            ReduceOp op, T* __restrict out) {
  const size_t world = inputs.size();
  std::memcpy(out, inputs[0] + offset, count * sizeof(T));
  for (size_t r = 1; r < world; ++r) fold(out, inputs[r] + offset, count, op);
  if (op == ReduceOp::kAvg) {
    const T w = static_cast<T>(world);
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
