#include "dma/configuration.hpp"

#include <algorithm>

namespace dma {

std::string_view to_string(Provider provider) noexcept {
  switch (provider) {
    case Provider::tcp:
      return "tcp";
    case Provider::efa_direct:
      return "efa-direct";
  }
  return "unknown";
}

std::string_view provider_name(Provider provider) noexcept { return provider == Provider::efa_direct ? "efa" : "tcp"; }

std::optional<std::string_view> fabric_name(Provider provider) noexcept {
  if (provider == Provider::efa_direct) return "efa-direct";
  return std::nullopt;
}

std::string_view to_string(WaitMode mode) noexcept {
  switch (mode) {
    case WaitMode::fd:
      return "fd";
    case WaitMode::adaptive:
      return "adaptive";
    case WaitMode::busy_poll:
      return "busy-poll";
  }
  return "unknown";
}

std::size_t requested_in_flight(const Configuration& configuration, std::size_t provider_tx_size) noexcept {
  const std::size_t requested = std::max<std::size_t>(1, configuration.max_in_flight.value_or(64));
  return provider_tx_size == 0 ? requested : std::min(requested, provider_tx_size);
}

}  // namespace dma
