#include "offload/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace zerostep {
namespace {

// Check values from RFC 3720 (iSCSI), appendix B.4, and the CRC catalogue.
TEST(Crc32cTest, KnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(0, digits.data(), digits.size()), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(0, digits.data(), digits.size()), 0xE3069283u);

  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  for (auto* f : {&crc32c, &crc32c_portable}) {
    EXPECT_EQ(f(0, zeros.data(), 32), 0x8A9136AAu);
    EXPECT_EQ(f(0, ones.data(), 32), 0x62A8AB43u);
    EXPECT_EQ(f(0, up.data(), 32), 0x46DD794Eu);
    EXPECT_EQ(f(0, down.data(), 32), 0x113FDB5Cu);
    EXPECT_EQ(f(0, nullptr, 0), 0u);
  }
}

// The instruction path (when the CPU has it) and the table agree on every
// length and alignment, and both can be continued piecewise.
TEST(Crc32cTest, HardwareMatchesPortableAndChains) {
  std::mt19937 rng(7);
  std::vector<unsigned char> data(3 * 4096 * 3 + 100);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t start = 0; start < 9; ++start) {
    // Around the hardware path's three-stripe blocks of 3 x 4096 bytes.
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 4090, 12287, 12288, 12289,
                     24576, 3 * 4096 * 3 + 91}) {
      const uint32_t want = crc32c_portable(0, data.data() + start, n);
      ASSERT_EQ(crc32c(0, data.data() + start, n), want)
          << "start " << start << " n " << n;
      for (size_t cut : {size_t{0}, n / 3, n}) {
        const uint32_t head = crc32c(0, data.data() + start, cut);
        EXPECT_EQ(crc32c(head, data.data() + start + cut, n - cut), want);
      }
    }
  }
  std::printf("crc32c_hardware=%d\n", crc32c_hardware() ? 1 : 0);
}

}  // namespace
}  // namespace zerostep
