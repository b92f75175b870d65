// Test vectors and comparisons shared by the Adam tests of offload/
// (fused_adam_test) and zero/ (optimizer_test). Testonly.
//
// Thread safety: pure functions.
#ifndef ZEROSTEP_OFFLOAD_ADAM_TEST_VECTORS_H_
#define ZEROSTEP_OFFLOAD_ADAM_TEST_VECTORS_H_

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
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

// Note [A case per ISA]
// ~~~~~~~~~~~~~~~~~~~~~
// A test that claims "every ISA" runs one case per kernel path,
// EveryIsa/<Suite>.<Case>/<isa>, on a PerIsaTest fixture. A path this CPU
// lacks is a skip (GTEST_SKIP, so tools/test_skips.py lists it) whose reason
// names what the CPU lacks and the path that runs here instead; a path
// that runs records it as the case's XML property "isa" ("auto" as
// "auto=avx2"). A loop over the supported ISAs only would pass on a CPU
// without AVX-512 as if its AVX-512 path had been checked.

// Every kernel path, in case order: scalar, avx2, avx512, auto.
std::vector<Isa> every_isa();
// The vector paths: avx2, avx512.
std::vector<Isa> vector_isas();
// "" when `isa` runs on this CPU, otherwise the reason it cannot.
std::string isa_skip_reason(Isa isa);
// The case name suffix: fused_adam_isa_name() ("scalar", "avx2", ...).
std::string isa_case_name(const ::testing::TestParamInfo<Isa>& info);

// Fixture of a case per ISA (Note [A case per ISA]): SetUp() skips where
// the ISA does not run and otherwise records it.
class PerIsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override;
};

// Fixture of a case per vector ISA that checks the refusal of an ISA this
// CPU lacks: SetUp() skips where the CPU has it (nothing to refuse).
class PerMissingIsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override;
};

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_ADAM_TEST_VECTORS_H_
