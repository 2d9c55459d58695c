/// @file
/// CRC-32C, the checksum of `want_checksum` transfers, hardware-accelerated through ISA-L.
#pragma once

#include <dma/export.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace dma {

/// CRC-32C (Castagnoli, reflected; iSCSI) of `bytes`, the value TransferDone::checksum carries:
/// "" → 0x00000000, "123456789" → 0xE3069283. Any thread; runs at memory speed (ISA-L).
DMA_EXPORT std::uint32_t checksum(std::span<const std::byte> bytes) noexcept;

}  // namespace dma
