// Test vectors and comparisons shared by the Adam tests of offload/
// (fused_adam_test) and zero/ (optimizer_test). Testonly.
//
// Thread safety: pure functions.
#ifndef ZEROSTEP_OFFLOAD_ADAM_TEST_VECTORS_H_
#define ZEROSTEP_OFFLOAD_ADAM_TEST_VECTORS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "offload/fused_adam.h"

namespace zerostep {

// n draws of N(0, scale²) from std::mt19937(seed).
std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.0f);

// max|a - b| / max|b| (max|a - b| when b is all zero).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b);

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);

// The state of one Adam run: parameters normal(n, seed), both moments zero.
struct AdamState {
  std::vector<float> p, m, v;
  AdamState(size_t n, uint32_t seed)
      : p(normal(n, seed)), m(n, 0.0f), v(n, 0.0f) {}
};

// The kernel's instruction sets this CPU supports, scalar first.
std::vector<Isa> available_isas();

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_ADAM_TEST_VECTORS_H_
