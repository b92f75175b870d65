#include "offload/adam_test_vectors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

namespace zerostep {

std::vector<float> normal(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, mag = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(b[i])));
  }
  return mag == 0.0 ? diff : diff / mag;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() ||
          std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::vector<Isa> every_isa() {
  return {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAuto};
}

std::vector<Isa> vector_isas() { return {Isa::kAvx2, Isa::kAvx512}; }

namespace {

// What the CPU needs for a path, as /proc/cpuinfo names it.
const char* needs(Isa isa) {
  return isa == Isa::kAvx512 ? "AVX-512F (cpuinfo flag avx512f)"
                             : "AVX2 (cpuinfo flag avx2)";
}

}  // namespace

std::string isa_skip_reason(Isa isa) {
  if (fused_adam_isa_supported(isa)) return "";
  return std::string("this CPU lacks ") + needs(isa) +
         " (or the OS does not enable its registers): the " +
         fused_adam_isa_name(isa) + " path did not run here; the " +
         fused_adam_isa() + " path (this CPU's best) ran in its own case";
}

std::string isa_case_name(const ::testing::TestParamInfo<Isa>& info) {
  return fused_adam_isa_name(info.param);
}

void PerIsaTest::SetUp() {
  const std::string why = isa_skip_reason(GetParam());
  if (!why.empty()) GTEST_SKIP() << why;
  RecordProperty("isa", GetParam() == Isa::kAuto
                            ? std::string("auto=") + fused_adam_isa()
                            : std::string(fused_adam_isa_name(GetParam())));
}

void PerMissingIsaTest::SetUp() {
  if (fused_adam_isa_supported(GetParam()))
    GTEST_SKIP() << "this CPU has " << needs(GetParam())
                 << ": no refusal of the " << fused_adam_isa_name(GetParam())
                 << " path to check here (its own case ran it)";
  RecordProperty("isa_refused", fused_adam_isa_name(GetParam()));
}

}  // namespace zerostep
