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

#if ZS_CRC_X86
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc,
                                                        const void* data,
                                                        size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return ~c32;
}
#endif

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = make_table();
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return ~c;
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
  if (crc32c_hardware()) return crc32c_sse42(crc, data, n);
#endif
  return crc32c_portable(crc, data, n);
}

}  // namespace zerostep
