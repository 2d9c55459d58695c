/// @file
/// Errors: the library's own codes (errc, category "dma"), libfabric's codes (fabric_category(),
/// "libfabric"), and the broad conditions both compare equal to (condition, "dma.condition").
///
/// Every failure a completion or a setup call reports is a std::error_code of one of the first
/// two categories. Branch on a condition, or on std::errc, rather than on the exact code:
/// `if (outcome.error() == dma::condition::peer_unreachable)`, `if (ec == std::errc::timed_out)`.
#pragma once

#include <dma/export.hpp>

#include <string>
#include <system_error>

namespace dma {

/// Errors the library itself reports, in category(); libfabric's own codes use fabric_category().
/// Each one's message() says what failed in a sentence. Every errc converts implicitly to a
/// std::error_code (`ec == dma::errc::shutdown`), and those that belong to a condition compare equal
/// to it (listed with each condition).
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
  null_op_context,    ///< an entry without an operation; never produced: see Metrics::context_less_errors
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
  // Immediate data and write notifications.
  immediate_data_on_read,   ///< a FromPeer request carried immediate data (only writes carry it)
  immediate_data_too_wide,  ///< the immediate data needs more bytes than the provider's cq_data_size
  notifications_lost,       ///< the target's notification queue was full: notifications were dropped here
  // Segmented and gathered transfers.
  segment_lengths_differ,  ///< the local buffers and the remote segments do not total the same length
  no_remote_segment,       ///< Operands::remote_segments() named no segment
  remote_range_overflows,  ///< a remote segment's address + length wraps around
  // Connections.
  /// No connection within progress_deadline, while a plain TCP connection to the peer's address
  /// succeeds: something listens there, and libfabric's connection request was rejected or never
  /// answered. Most often the two ends speak different wire protocols: native tcp (libfabric 1.18
  /// and later) against rxm (`tcp;ofi_rxm`, libfabric 1.17; set Configuration::tcp_protocol to
  /// rxm on the newer end), or rxm with different eager limits. A peer whose process is frozen
  /// looks the same, since its kernel still accepts connections.
  connection_rejected,
};

/// Broad classes a caller can branch on: `if (ec == dma::condition::peer_unreachable)`. Codes of
/// both categories compare equal to the condition they belong to; a code belongs to at most one.
enum class condition {
  /// Any advertisement parse or validation failure: errc::advertisement_* and errc::address_*.
  invalid_advertisement = 1,
  /// The peer is gone, refused, or never made progress: errc::progress_deadline,
  /// errc::connection_refused, errc::connection_rejected, errc::peer_unreachable; libfabric's FI_ECONNREFUSED,
  /// FI_EHOSTUNREACH, FI_ENETUNREACH, FI_EADDRNOTAVAIL.
  peer_unreachable,
  /// The caller's context did not supply a usable operand, or the request asks for what its
  /// operation cannot carry: errc::no_source, errc::no_landing_buffer,
  /// errc::landing_buffer_too_small, errc::operand_range_overflows, errc::immediate_data_on_read,
  /// errc::immediate_data_too_wide, errc::segment_lengths_differ, errc::no_remote_segment,
  /// errc::remote_range_overflows.
  invalid_operand,
  /// The library gave the transfer up itself: errc::shutdown, errc::peer_removed. A cancellation
  /// through the handler's slot is asio::error::operation_aborted instead, which is not this.
  cancelled,
  /// The connection broke under the transfer, which may or may not have landed:
  /// errc::connection_lost; libfabric's FI_ECANCELED, FI_ENOTCONN, FI_ECONNRESET, FI_ECONNABORTED,
  /// EPIPE.
  connection_lost,
  /// The peer refused the access (bad key, range or rights): errc::remote_access_denied;
  /// libfabric's FI_EACCES, FI_EKEYREJECTED.
  remote_access_denied,
};

/// The category of the library's own codes (errc), named "dma". errc::timed_out compares equal
/// to std::errc::timed_out; the others to their condition, where they have one.
DMA_EXPORT const std::error_category& category() noexcept;
/// The category of libfabric's codes, named "libfabric", with fi_strerror() as the message. A code
/// below FI_ERRNO_OFFSET is an errno value and compares equal to the matching std::errc too (FI_EIO
/// and std::errc::io_error); connection, reachability and access codes compare equal to their
/// condition.
DMA_EXPORT const std::error_category& fabric_category() noexcept;
/// The category of the conditions (condition), named "dma.condition".
DMA_EXPORT const std::error_category& condition_category() noexcept;

/// The code for `e` in category(); what lets an errc convert to std::error_code.
DMA_EXPORT std::error_code make_error_code(errc e) noexcept;
/// The condition `c` in condition_category(); what lets a condition convert to
/// std::error_condition.
DMA_EXPORT std::error_condition make_error_condition(condition c) noexcept;

/// A libfabric return code as a std::error_code in fabric_category(): negative as libfabric's
/// functions return it (-FI_EAGAIN), or positive as completion-queue error entries carry it.
DMA_EXPORT std::error_code fabric_error(long long code) noexcept;

/// Throws std::system_error(ec, what) when ec is set; does nothing otherwise.
DMA_EXPORT void throw_if(const std::error_code& ec, const std::string& what);

}  // namespace dma

// dma::errc converts implicitly to std::error_code, and codes compare equal to a dma::condition.
// (Hidden from the reference, which cannot place a specialisation of a std template.)
/// @cond
template <>
struct std::is_error_code_enum<dma::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<dma::condition> : std::true_type {};
/// @endcond
