// The side channel's identity rule: a client's fabric address must name the host its RESP
// connection comes from, or a client could make the server connect to, read from and write into a
// third host (a tcp fabric address is a raw sockaddr the provider connects to on demand).
#pragma once

#include <asio/ip/address.hpp>

#include <cstdint>
#include <span>
#include <string>

namespace kv {

/// Empty when `fabric_address` (raw bytes in the endpoint's `addr_format`) names the same host as
/// `peer`, the RESP connection's remote address; otherwise why not. IPv4-mapped IPv6 addresses
/// compare as IPv4. Formats without an IP (FI_ADDR_EFA) cannot be checked and pass.
std::string check_same_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format,
                            const asio::ip::address& peer);

/// The IP a sockaddr fabric address names, as text ("10.0.0.7"), or "" for other formats.
std::string fabric_host(std::span<const std::uint8_t> fabric_address, std::uint32_t addr_format);

}  // namespace kv
