// CRC-32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41, reflected),
// the checksum of the swap store's sub-group slots and superblocks. Uses the
// SSE4.2 crc32 instruction when the CPU has it (chosen at run time; the
// library is built for baseline x86-64) and a table otherwise; both give
// the same value (tested).
//
// Thread safety: pure functions.
#ifndef ZEROSTEP_OFFLOAD_CRC32C_H_
#define ZEROSTEP_OFFLOAD_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace zerostep {

// The CRC-32C of data[0, n) continuing from `crc` (0 to start):
// crc32c(crc32c(0, a, i), a + i, n - i) == crc32c(0, a, n).
// crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);

// The table implementation, whatever the CPU (for tests).
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

// Whether crc32c uses the SSE4.2 instruction on this CPU.
bool crc32c_hardware();

}  // namespace zerostep

#endif  // ZEROSTEP_OFFLOAD_CRC32C_H_
