#include "dma/checksum.hpp"

#include <isa-l/crc.h>

#include <climits>

namespace dma {

std::uint32_t checksum(std::span<const std::byte> bytes) noexcept {
  // ISA-L's crc32_iscsi neither pre- nor post-inverts; CRC-32C does both.
  std::uint32_t crc = 0xFFFFFFFFu;
  const auto* data = reinterpret_cast<unsigned char*>(const_cast<std::byte*>(bytes.data()));
  std::size_t left = bytes.size();
  while (left > 0) {
    const int chunk = left > static_cast<std::size_t>(INT_MAX) ? INT_MAX : static_cast<int>(left);
    crc = crc32_iscsi(const_cast<unsigned char*>(data), chunk, crc);
    data += chunk;
    left -= static_cast<std::size_t>(chunk);
  }
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace dma
