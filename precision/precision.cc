#include "precision/precision.h"

#include <cmath>
#include <cstring>

namespace zerostep {

const char* to_string(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

std::optional<Precision> precision_from_string(const std::string& s) {
  if (s == "fp32" || s == "float32") return Precision::kFp32;
  if (s == "bf16" || s == "bfloat16") return Precision::kBf16;
  if (s == "fp16" || s == "float16") return Precision::kFp16;
  return std::nullopt;
}

uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Round to nearest even on the 16 bits dropped.
  const uint32_t bias = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + bias) >> 16);
}

float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

namespace {
// GCC's _Float16 conversion is IEEE round-to-nearest-even (F16C or
// software), overflow to ±inf, subnormals kept.
inline float round_fp16(float x) {
  return static_cast<float>(static_cast<_Float16>(x));
}
inline float round_bf16(float x) { return from_bf16_bits(to_bf16_bits(x)); }
}  // namespace

float round_to(Precision p, float x) {
  switch (p) {
    case Precision::kFp32:
      return x;
    case Precision::kBf16:
      return round_bf16(x);
    case Precision::kFp16:
      return round_fp16(x);
  }
  return x;
}

void round_in_place(Precision p, float* x, size_t n) {
  switch (p) {
    case Precision::kFp32:
      return;
    case Precision::kBf16:
      for (size_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
      return;
    case Precision::kFp16:
      for (size_t i = 0; i < n; ++i) x[i] = round_fp16(x[i]);
      return;
  }
}

void accumulate(float* acc, const float* g, size_t n, Precision grad_p,
                Precision acc_p) {
  if (grad_p == Precision::kFp32 && acc_p == Precision::kFp32) {
    for (size_t i = 0; i < n; ++i) acc[i] += g[i];
    return;
  }
  for (size_t i = 0; i < n; ++i)
    acc[i] = round_to(acc_p, acc[i] + round_to(grad_p, g[i]));
}

void accumulate_bf16(float* acc, const uint16_t* g, size_t n,
                     Precision acc_p) {
  if (acc_p == Precision::kFp32) {
    for (size_t i = 0; i < n; ++i) acc[i] += from_bf16_bits(g[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i)
    acc[i] = round_to(acc_p, acc[i] + from_bf16_bits(g[i]));
}

void to_bf16(const float* x, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = to_bf16_bits(x[i]);
}

}  // namespace zerostep
