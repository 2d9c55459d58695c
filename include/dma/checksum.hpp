#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace dma {

/// CRC-32C (Castagnoli, reflected; iSCSI): "" → 0x00000000, "123456789" → 0xE3069283.
std::uint32_t checksum(std::span<const std::byte> bytes) noexcept;

}  // namespace dma
