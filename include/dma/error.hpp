// Errors: libfabric codes in their own category, the library's own conditions in another.
#pragma once

#include <string>
#include <system_error>

namespace dma {

/// Errors the library itself reports (libfabric's codes use fabric_category()).
enum class errc {
  // Advertisement parsing and validation (untrusted input).
  advertisement_arity = 1,     ///< not exactly three fields
  advertisement_hex,           ///< address is not an even-length hex string
  advertisement_integer,       ///< rkey or remote address is not a decimal u64
  address_length,              ///< decoded address has the wrong length for the address format
  address_family,              ///< sockaddr family does not match the address format
  address_port_zero,           ///< port 0
  address_unspecified,         ///< 0.0.0.0 or ::
  address_multicast,           ///< multicast address
  address_broadcast,           ///< 255.255.255.255
  address_format_unsupported,  ///< the endpoint's address format cannot be validated
  advertisement_too_long,      ///< longer than max_advertisement_length, rejected before parsing
  // Operands.
  no_source,                 ///< a ToPeer context supplied no source bytes
  no_landing_buffer,         ///< a FromPeer context allocated no landing buffer
  landing_buffer_too_small,  ///< a FromPeer context allocated fewer bytes than asked
  operand_range_overflows,   ///< base + length overflows
  // Transfers.
  progress_deadline,  ///< no progress posting within progress_deadline (connected, transmit queue stuck)
  peer_removed,       ///< the peer was removed before the transfer could be posted
  shutdown,           ///< the service shut down before the transfer could finish
  null_op_context,    ///< the provider reported an error without an operation
  // Setup.
  no_provider,             ///< fi_getinfo matched nothing
  no_domain,               ///< no fabric domain with the configured interface name
  not_open,                ///< the service or target is not open
  zero_length_region,      ///< cannot register 0 bytes
  region_range_overflows,  ///< registered region's range overflows
  invalid_configuration,   ///< a configuration value is out of range
  av_insert_failed,        ///< fi_av_insert inserted fewer addresses than asked
  // Transfers: what happened to the peer or the transfer, as precisely as the provider tells.
  timed_out = 100,       ///< the transfer did not complete within its deadline (== std::errc::timed_out)
  connection_refused,    ///< no connection to the peer within progress_deadline (nothing listens, host down)
  connection_lost,       ///< the connection broke with the transfer on it (peer died or rejected it; see docs)
  peer_unreachable,      ///< the peer is marked unreachable: transfers fail at once until its back-off ends
  remote_access_denied,  ///< the peer refused the access: wrong key, range outside its region, access rights
};

/// Broad classes a caller can branch on: `if (ec == dma::condition::peer_unreachable)`.
enum class condition {
  invalid_advertisement = 1,  ///< any advertisement parse or validation failure
  peer_unreachable,           ///< the peer is gone, refused, or never made progress
  invalid_operand,            ///< the caller's context did not supply a usable operand
  cancelled,                  ///< the library cancelled it (shutdown, removal)
  connection_lost,            ///< the connection broke under the transfer; it may or may not have landed
  remote_access_denied,       ///< the peer refused the access (bad key, range or rights)
};

const std::error_category& category() noexcept;         ///< the library's own codes (errc)
const std::error_category& fabric_category() noexcept;  ///< libfabric codes, message from fi_strerror
const std::error_category& condition_category() noexcept;

std::error_code make_error_code(errc e) noexcept;
std::error_condition make_error_condition(condition c) noexcept;

/// A libfabric return code (negative, as functions return it, or positive, as CQ entries carry it).
std::error_code fabric_error(long long code) noexcept;

/// Throws std::system_error(ec, what) when ec is set.
void throw_if(const std::error_code& ec, const std::string& what);

}  // namespace dma

template <>
struct std::is_error_code_enum<dma::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<dma::condition> : std::true_type {};
