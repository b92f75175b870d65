// The rank-order fold (Note [Reduction order] in sim/sim_world.h): the one
// way zerostep's own reductions combine W ranks' values, so that a backend
// that reduces in this order gives the simulator's bits.
//
//   out[i] = x0[i]; out[i] = out[i] (op) x1[i]; ...; out[i] (op) x{W-1}[i];
//   then out[i] / W for kAvg (a true division's bits, in the buffer's
//   dtype: Note [Finishing in the last pass]).
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
#include <type_traits>
#include <vector>

#include "comm/communicator.h"

namespace zerostep {
namespace rank_order {

// The passes of reduce(), each a plain elementwise loop over `f` (the op,
// chosen once per call, not per element). A pass folds up to four ranks,
// so it reads up to four input streams at once and the accumulator is
// read and written once per four ranks, not once per rank; the ops stay in
// rank order, (((acc (op) a) (op) b) (op) c) (op) d, so the bits are those
// of one rank per pass. The last pass applies `g`, kAvg's division (Note
// [Finishing in the last pass]); the others pass Identity.
struct Identity {
  template <typename T>
  T operator()(T x) const {
    return x;
  }
};

template <typename T, typename F, typename G>
void first_pass(T* __restrict out, const T* const* in, size_t k, size_t n, F f,
                G g) {
  const T* __restrict a = in[0];
  switch (k) {
    case 1:
      for (size_t i = 0; i < n; ++i) out[i] = g(a[i]);
      return;
    case 2: {
      const T* __restrict b = in[1];
      for (size_t i = 0; i < n; ++i) out[i] = g(f(a[i], b[i]));
      return;
    }
    case 3: {
      const T* __restrict b = in[1];
      const T* __restrict c = in[2];
      for (size_t i = 0; i < n; ++i) out[i] = g(f(f(a[i], b[i]), c[i]));
      return;
    }
    default: {
      const T* __restrict b = in[1];
      const T* __restrict c = in[2];
      const T* __restrict d = in[3];
      for (size_t i = 0; i < n; ++i)
        out[i] = g(f(f(f(a[i], b[i]), c[i]), d[i]));
      return;
    }
  }
}
template <typename T, typename F, typename G>
void fold_pass(T* __restrict acc, const T* const* in, size_t k, size_t n, F f,
               G g) {
  const T* __restrict a = in[0];
  switch (k) {
    case 1:
      for (size_t i = 0; i < n; ++i) acc[i] = g(f(acc[i], a[i]));
      return;
    case 2: {
      const T* __restrict b = in[1];
      for (size_t i = 0; i < n; ++i) acc[i] = g(f(f(acc[i], a[i]), b[i]));
      return;
    }
    case 3: {
      const T* __restrict b = in[1];
      const T* __restrict c = in[2];
      for (size_t i = 0; i < n; ++i)
        acc[i] = g(f(f(f(acc[i], a[i]), b[i]), c[i]));
      return;
    }
    default: {
      const T* __restrict b = in[1];
      const T* __restrict c = in[2];
      const T* __restrict d = in[3];
      for (size_t i = 0; i < n; ++i)
        acc[i] = g(f(f(f(f(acc[i], a[i]), b[i]), c[i]), d[i]));
      return;
    }
  }
}

// Note [Finishing in the last pass]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// kAvg is the rank-order sum divided by W (Note [Reduction order]). The
// division is applied to each element as the last pass writes it, not in
// a pass of its own: the element is rounded to its dtype after every
// addition either way, so the bits are the same, and the loop that reads
// and writes every element once more is gone.
//
// For a float or double and W a power of two the division is a
// multiplication by 1 / W, which is exact (W <= 2^31, far inside the
// exponent range): x * (1 / W) is the same real number as x / W, IEEE
// rounds both correctly to the same value, subnormals included, and a NaN
// or an infinity passes through either the same way. So the
// multiplication gives the division's bits, at a fraction of its cost.
// Any other W, and the integer types (whose division truncates), divide.
// docs/benchmarks.md as of fee84cc measures both changes.
//
// Calls fn(f, g) with op's fold `f` and its finish `g` for `world` ranks.
template <typename T, typename Fn>
void with_fold(ReduceOp op, size_t world, Fn&& fn) {
  const auto plus = [](T a, T b) { return a + b; };
  switch (op) {
    case ReduceOp::kSum:
      fn(plus, Identity{});
      return;
    case ReduceOp::kAvg:
      if constexpr (std::is_floating_point_v<T>) {
        if ((world & (world - 1)) == 0) {
          const T inverse = T{1} / static_cast<T>(world);
          fn(plus, [inverse](T x) { return x * inverse; });
          return;
        }
      }
      fn(plus, [w = static_cast<T>(world)](T x) { return x / w; });
      return;
    case ReduceOp::kMax:
      fn([](T a, T b) { return std::max(a, b); }, Identity{});
      return;
    case ReduceOp::kMin:
      fn([](T a, T b) { return std::min(a, b); }, Identity{});
      return;
  }
}

// The fold of `count` elements at `offset` of `inputs` into `out`, the
// last pass finished by `g`.
template <typename T, typename F, typename G>
void reduce_with(const std::vector<const T*>& inputs, size_t offset,
                 size_t count, T* __restrict out, F f, G g) {
  const size_t world = inputs.size();
  const T* in[4] = {};
  const auto take = [&](size_t r, size_t k) {
    for (size_t j = 0; j < k; ++j) in[j] = inputs[r + j] + offset;
  };
  size_t r = std::min<size_t>(world, 4);
  take(0, r);
  if (r == world) {
    first_pass(out, in, r, count, f, g);
    return;
  }
  first_pass(out, in, r, count, f, Identity{});
  while (r < world) {
    const size_t k = std::min<size_t>(world - r, 4);
    take(r, k);
    r += k;
    if (r == world)
      fold_pass(out, in, k, count, f, g);
    else
      fold_pass(out, in, k, count, f, Identity{});
  }
}

// Reduces `count` elements at element offset `offset` of every rank's
// input, in rank order, into `out`, which must not overlap any input. Long
// reductions are faster cut into cache-sized pieces (reduce_chunked, or the
// caller's own loop); the bits do not depend on the cut.
template <typename T>
void reduce(const std::vector<const T*>& inputs, size_t offset, size_t count,
            ReduceOp op, T* __restrict out) {
  with_fold<T>(op, inputs.size(), [&](auto f, auto g) {
    reduce_with(inputs, offset, count, out, f, g);
  });
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
