// Precision: the floating-point formats of mixed-precision training, as
// rounding rules on float32 values (no LibTorch).
//
// Note [Precision model]
// ~~~~~~~~~~~~~~~~~~~~~~
// zerostep keeps every gradient and master weight the stages touch in
// float32 containers. A lower precision is a rounding rule applied at the
// points where real hardware would store in that format:
//   - each backward's gradient is rounded to the compute format (bf16:
//     LibTorch produced it in bf16 already; fp16: emulated here, since this
//     CPU build of LibTorch cannot run fp16 matmuls),
//   - the window's accumulation is rounded to grad_accum_dtype after every
//     add (fp32 by default: no rounding),
//   - bf16 model weights are the master weights rounded to bf16 after each
//     update.
// Rounding is IEEE round-to-nearest-even, the rule LibTorch's and CUDA's
// conversions use; fp16 values beyond 65504 become ±inf, which is what the
// fp16 loss scaler detects as overflow. The values are bit-exact to what a
// format-native implementation computes for each stored value; the bytes
// moved and held are float32's (docs/design/engine.md).
//
// Thread safety: pure functions.
#ifndef ZEROSTEP_PRECISION_PRECISION_H_
#define ZEROSTEP_PRECISION_PRECISION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace zerostep {

enum class Precision { kFp32, kBf16, kFp16 };

// "fp32", "bf16", "fp16".
const char* to_string(Precision p);
// Accepts DeepSpeed's spellings: fp32/float32, bf16/bfloat16, fp16/float16
// (case-insensitive by the caller); nullopt otherwise.
std::optional<Precision> precision_from_string(const std::string& s);

// x rounded to the nearest value of format p (ties to even); NaN stays NaN,
// fp16 overflow gives ±inf.
float round_to(Precision p, float x);
// bf16 bit pattern of x (round to nearest even; NaN → quiet NaN), and back.
uint16_t to_bf16_bits(float x);
float from_bf16_bits(uint16_t b);

// x[i] = round_to(p, x[i]) for i < n (nothing for kFp32).
void round_in_place(Precision p, float* x, size_t n);
// acc[i] = round_to(acc_p, acc[i] + round_to(grad_p, g[i])).
void accumulate(float* acc, const float* g, size_t n, Precision grad_p,
                Precision acc_p);
// The same with bf16 gradients given as bit patterns.
void accumulate_bf16(float* acc, const uint16_t* g, size_t n, Precision acc_p);
// out[i] = to_bf16_bits(x[i]).
void to_bf16(const float* x, uint16_t* out, size_t n);

}  // namespace zerostep

#endif  // ZEROSTEP_PRECISION_PRECISION_H_
