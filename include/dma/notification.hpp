/// @file
/// What a Target hears of a write that carried immediate data (TransferFields::immediate_data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace dma {

/// One peer's write with immediate data, as the Target's completion queue reported it once the
/// bytes had landed.
struct WriteNotification {
  /// The writer's TransferFields::immediate_data. With errc::notifications_lost: how many
  /// notifications were dropped at this place in the order.
  std::uint64_t data = 0;
  /// The bytes written, where the provider reports them; none where it does
  /// not (`tcp;ofi_rxm`, libfabric 1.17; native tcp on 1.18 and later reports it).
  std::optional<std::size_t> length;
};

}  // namespace dma
