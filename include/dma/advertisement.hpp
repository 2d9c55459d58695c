/// @file
/// The peer's advertisement: `<address-hex> <rkey> <remote-addr>`, the Rust crate's wire form.
/// Advertisements are untrusted input: parse() checks syntax, validate_address() checks the address
/// against the endpoint's format before anything reaches fi_av_insert.
#pragma once

#include <dma/export.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace dma {

/// Longest advertisement text parse() looks at; longer input is rejected before parsing.
inline constexpr std::size_t max_advertisement_length = 512;

/// What a peer sends the server over the application's own channel so that the server can reach
/// one registered buffer: the peer's fabric address, the rkey and the remote address. The text
/// form is the Rust crate's, so peers written for it interoperate.
struct DMA_EXPORT Advertisement {
  std::vector<std::uint8_t> address;  ///< the peer's raw fabric address (fi_getname bytes)
  std::uint64_t remote_key = 0;       ///< the rkey of the peer's registration
  std::uint64_t remote_address = 0;   ///< VA on FI_MR_VIRT_ADDR providers, offset (usually 0) on tcp

  /// Parses text of exactly three fields separated by ASCII whitespace (a trailing newline is fine).
  /// Text longer than max_advertisement_length is errc::advertisement_too_long, any other field count
  /// errc::advertisement_arity, then as from_fields(). The throwing overload throws std::system_error
  /// naming the offending field and its value; the error_code overload returns an empty Advertisement.
  static Advertisement parse(std::string_view text);
  /// As parse(text), reporting a failure through `ec` (an errc, condition::invalid_advertisement).
  static Advertisement parse(std::string_view text, std::error_code& ec);
  /// Parses exactly three fields: hex address (either case), decimal rkey, decimal remote address.
  /// Errors: advertisement_arity, advertisement_too_long (the fields joined by single spaces are
  /// longer than max_advertisement_length), advertisement_hex, advertisement_integer. An empty address field is
  /// accepted, as the Rust crate does; validate_address() is what rejects it.
  static Advertisement from_fields(std::span<const std::string_view> fields);
  /// As from_fields(fields), reporting a failure through `ec` and returning an empty Advertisement.
  static Advertisement from_fields(std::span<const std::string_view> fields, std::error_code& ec);

  /// `<lowercase-hex> <rkey> <remote-addr>`; parse() gives back an equal Advertisement unless the
  /// address is empty (its text then has only two fields).
  std::string to_string() const;

  /// Same address bytes, rkey and remote address.
  friend bool operator==(const Advertisement&, const Advertisement&) = default;
};

/// Lowercase hex, two characters per byte, high nibble first.
DMA_EXPORT std::string encode_hex(std::span<const std::uint8_t> bytes);
/// Accepts either case; odd length or a non-hex character is errc::advertisement_hex.
DMA_EXPORT std::vector<std::uint8_t> decode_hex(std::string_view text, std::error_code& ec);
/// As decode_hex(text, ec); throws std::system_error instead.
DMA_EXPORT std::vector<std::uint8_t> decode_hex(std::string_view text);
/// A decimal u64 with the Rust crate's rules: optional leading '+', no sign '-', no whitespace.
DMA_EXPORT std::optional<std::uint64_t> parse_u64(std::string_view text) noexcept;

/// The length of an FI_ADDR_EFA address: efa's struct efa_ep_addr (GID, QPN, QKEY, pointer) in
/// libfabric 1.17 through 2.x. fi_av_insert reads exactly this many bytes, whatever it is given.
inline constexpr std::size_t efa_address_length = 32;

/// Checks a peer address against an endpoint's libfabric address format (fi_info::addr_format):
/// exact length, family, no port 0, no unspecified, multicast or broadcast address. FI_ADDR_EFA
/// addresses must be efa_address_length bytes. FI_ADDR_STR addresses (shm's names) must be "<scheme>://<name>"
/// with its terminating NUL, at most 128 bytes, printable, with no '/' in the name (address_length
/// or address_family). Returns the first problem found, or an empty error_code.
DMA_EXPORT std::error_code validate_address(std::span<const std::uint8_t> address, std::uint32_t addr_format) noexcept;

}  // namespace dma
