#include "offload/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define ZS_CRC_X86 1
#else
#define ZS_CRC_X86 0
#endif

namespace zerostep {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? kPolyReflected : 0);
    table[i] = c;
  }
  return table;
}

// The raw register update (no pre/post inversion) over n bytes.
uint32_t raw_portable(uint32_t c, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c;
}

#if ZS_CRC_X86
// The crc32 instruction has a latency of 3 cycles and a throughput of 1,
// so one dependency chain runs at a third of its speed. The hardware path
// therefore runs three chains over three adjacent blocks of kStripe bytes
// and joins them (Intel, "Fast CRC Computation for iSCSI Polynomial Using
// CRC32 Instruction", 2011). The raw CRC is linear: for blocks A, B, C of
// kStripe bytes,
//   raw(c, A B C) = shift(shift(raw(c, A)) ^ raw(0, B)) ^ raw(0, C),
// where shift(x) = raw(x, kStripe zero bytes), a linear map of x that
// ShiftTable applies by four byte lookups.
constexpr size_t kStripe = 4096;

struct ShiftTable {
  uint32_t t[4][256];
  ShiftTable() {
    static const unsigned char zeros[kStripe] = {};
    uint32_t basis[32];  // shift of each single bit
    for (int b = 0; b < 32; ++b) {
      basis[b] = raw_portable(1u << b, zeros, kStripe);
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int b = 0; b < 8; ++b) {
          if (v & (1u << b)) r ^= basis[8 * k + b];
        }
        t[k][v] = r;
      }
    }
  }
  uint32_t shift(uint32_t x) const {
    return t[0][x & 0xFF] ^ t[1][(x >> 8) & 0xFF] ^ t[2][(x >> 16) & 0xFF] ^
           t[3][x >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t raw_sse42(uint32_t c32,
                                                     const unsigned char* p,
                                                     size_t n) {
  static const ShiftTable shift;
  uint64_t c = c32;
  while (n >= 3 * kStripe) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p + kStripe + i, 8);
      std::memcpy(&w2, p + 2 * kStripe + i, 8);
      c = _mm_crc32_u64(c, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    c = shift.shift(shift.shift(static_cast<uint32_t>(c)) ^
                    static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}
#endif

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  return ~raw_portable(~crc, static_cast<const unsigned char*>(data), n);
}

bool crc32c_hardware() {
#if ZS_CRC_X86
  static const bool supported = __builtin_cpu_supports("sse4.2");
  return supported;
#else
  return false;
#endif
}

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
#if ZS_CRC_X86
  if (crc32c_hardware()) {
    return ~raw_sse42(~crc, static_cast<const unsigned char*>(data), n);
  }
#endif
  return crc32c_portable(crc, data, n);
}

}  // namespace zerostep
