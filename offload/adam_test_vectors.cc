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

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (fused_adam_isa_supported(isa)) out.push_back(isa);
  return out;
}

}  // namespace zerostep
