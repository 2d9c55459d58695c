#include "fabric_host.hpp"

#include <netinet/in.h>
#include <rdma/fabric.h>

#include <cstring>
#include <optional>

namespace kv {
namespace {

asio::ip::address normalise(const asio::ip::address& address) {
  if (address.is_v6() && address.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
  }
  return address;
}

std::optional<asio::ip::address> ip_of(std::span<const std::uint8_t> bytes, std::uint32_t addr_format) {
  if (addr_format == FI_SOCKADDR_IN && bytes.size() == sizeof(sockaddr_in)) {
    sockaddr_in in{};
    std::memcpy(&in, bytes.data(), sizeof in);
    if (in.sin_family != AF_INET) return std::nullopt;
    return asio::ip::address_v4(ntohl(in.sin_addr.s_addr));
  }
  if (addr_format == FI_SOCKADDR_IN6 && bytes.size() == sizeof(sockaddr_in6)) {
    sockaddr_in6 in6{};
    std::memcpy(&in6, bytes.data(), sizeof in6);
    if (in6.sin6_family != AF_INET6) return std::nullopt;
    asio::ip::address_v6::bytes_type raw;
    std::memcpy(raw.data(), &in6.sin6_addr, raw.size());
    return asio::ip::address_v6(raw);
  }
  return std::nullopt;
}

}  // namespace

std::string check_same_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format,
                            const asio::ip::address& peer) {
  if (addr_format != FI_SOCKADDR_IN && addr_format != FI_SOCKADDR_IN6) return {};
  const auto ip = ip_of(fabric_address, addr_format);
  if (!ip) return "the fabric address is not a socket address of the server's format";
  if (normalise(*ip) != normalise(peer)) {
    return "the fabric address names host " + normalise(*ip).to_string() + ", but the connection comes from " +
           normalise(peer).to_string();
  }
  return {};
}

std::string fabric_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format) {
  const auto ip = ip_of(fabric_address, addr_format);
  return ip ? normalise(*ip).to_string() : std::string();
}

}  // namespace kv
