#include "dma/configuration.hpp"

#include <algorithm>

namespace dma {

std::string_view to_string(Provider provider) noexcept {
  switch (provider) {
    case Provider::tcp:
      return "tcp";
    case Provider::efa_direct:
      return "efa-direct";
    case Provider::shm:
      return "shm";
  }
  return "unknown";
}

std::string_view provider_name(Provider provider) noexcept {
  switch (provider) {
    case Provider::efa_direct:
      return "efa";
    case Provider::shm:
      return "shm";
    case Provider::tcp:
      break;
  }
  return "tcp";
}

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

std::string_view to_string(TcpProtocol protocol) noexcept {
  switch (protocol) {
    case TcpProtocol::automatic:
      return "auto";
    case TcpProtocol::native:
      return "native";
    case TcpProtocol::rxm:
      return "rxm";
  }
  return "unknown";
}

template <>
std::optional<TcpProtocol> from_string<TcpProtocol>(std::string_view text) noexcept {
  for (const TcpProtocol protocol : {TcpProtocol::automatic, TcpProtocol::native, TcpProtocol::rxm}) {
    if (text == to_string(protocol)) return protocol;
  }
  return std::nullopt;
}

template <>
std::optional<Provider> from_string<Provider>(std::string_view text) noexcept {
  for (const Provider provider : {Provider::tcp, Provider::efa_direct, Provider::shm}) {
    if (text == to_string(provider)) return provider;
  }
  return std::nullopt;
}

template <>
std::optional<WaitMode> from_string<WaitMode>(std::string_view text) noexcept {
  for (const WaitMode mode : {WaitMode::fd, WaitMode::adaptive, WaitMode::busy_poll}) {
    if (text == to_string(mode)) return mode;
  }
  return std::nullopt;
}

std::size_t requested_in_flight(const Configuration& configuration, std::size_t provider_tx_size) noexcept {
  const std::size_t requested = std::max<std::size_t>(1, configuration.max_in_flight.value_or(64));
  return provider_tx_size == 0 ? requested : std::min(requested, provider_tx_size);
}

}  // namespace dma
