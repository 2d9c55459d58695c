#include "dma/advertisement.hpp"

#include "dma/error.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstring>

namespace dma {
namespace {

constexpr std::size_t field_count = 3;
constexpr std::array<const char*, field_count> field_names = {"address", "remote key", "remote address"};
// Rust's split_whitespace, restricted to ASCII (the wire form is ASCII).
constexpr std::string_view whitespace = " \t\n\v\f\r";
constexpr std::size_t quoted_limit = 64;
constexpr std::size_t text_address_limit = 128;

using Fields = std::array<std::string_view, field_count>;

/// Why an advertisement was rejected, kept cheap so the error_code overloads build no strings.
struct Fault {
  errc code{};
  std::size_t field = 0;  ///< the offending field, for hex and integer faults
  std::size_t count = 0;  ///< characters (too long) or fields (arity)
};

// Untrusted text ends up in exception messages: keep it short and printable.
std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (const char c : text.substr(0, quoted_limit))
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > quoted_limit) out += "...";
  return out + '"';
}

std::string describe(const Fault& fault, std::span<const std::string_view> fields) {
  switch (fault.code) {
    case errc::advertisement_too_long:
      return "advertisement of " + std::to_string(fault.count) + " characters";
    case errc::advertisement_arity:
      return "advertisement with " + std::to_string(fault.count) + " fields";
    default:
      return std::string("advertisement ") + field_names[fault.field] + ' ' + quoted(fields[fault.field]);
  }
}

int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<Fault> decode_fields(std::span<const std::string_view> fields, Advertisement& out) {
  if (fields.size() != field_count) return Fault{errc::advertisement_arity, 0, fields.size()};
  // The same bound as parse(): the fields joined by single spaces.
  std::size_t length = fields.size() - 1;
  for (const auto field : fields)
    length += std::min(field.size(), max_advertisement_length + 1);
  if (length > max_advertisement_length) return Fault{errc::advertisement_too_long, 0, length};
  std::error_code ec;
  out.address = decode_hex(fields[0], ec);
  if (ec) return Fault{errc::advertisement_hex, 0};
  const auto remote_key = parse_u64(fields[1]);
  if (!remote_key) return Fault{errc::advertisement_integer, 1};
  const auto remote_address = parse_u64(fields[2]);
  if (!remote_address) return Fault{errc::advertisement_integer, 2};
  out.remote_key = *remote_key;
  out.remote_address = *remote_address;
  return std::nullopt;
}

// Keeps counting past three fields so that an arity error can say how many there were.
std::size_t split_fields(std::string_view text, Fields& fields) noexcept {
  std::size_t count = 0;
  for (std::size_t begin = text.find_first_not_of(whitespace); begin != std::string_view::npos;) {
    const std::size_t end = std::min(text.find_first_of(whitespace, begin), text.size());
    if (count < fields.size()) fields[count] = text.substr(begin, end - begin);
    ++count;
    begin = text.find_first_not_of(whitespace, end);
  }
  return count;
}

std::optional<Fault> parse_text(std::string_view text, Fields& fields, Advertisement& out) {
  if (text.size() > max_advertisement_length) return Fault{errc::advertisement_too_long, 0, text.size()};
  const std::size_t count = split_fields(text, fields);
  if (count != field_count) return Fault{errc::advertisement_arity, 0, count};
  return decode_fields(fields, out);
}

Advertisement report(const std::optional<Fault>& fault, Advertisement&& parsed, std::error_code& ec) {
  if (!fault) {
    ec.clear();
    return std::move(parsed);
  }
  ec = make_error_code(fault->code);
  return {};
}

template <typename Sockaddr>
bool copy_exact(std::span<const std::uint8_t> address, Sockaddr& out) noexcept {
  if (address.size() != sizeof(Sockaddr)) return false;
  std::memcpy(&out, address.data(), sizeof(Sockaddr));
  return true;
}

std::error_code check_ipv4(std::uint32_t host_order) noexcept {
  if (host_order == INADDR_ANY) return make_error_code(errc::address_unspecified);
  if ((host_order & 0xf0000000U) == 0xe0000000U) return make_error_code(errc::address_multicast);
  if (host_order == INADDR_BROADCAST) return make_error_code(errc::address_broadcast);
  return {};
}

bool all_zero(const std::uint8_t* begin, const std::uint8_t* end) noexcept {
  return std::all_of(begin, end, [](std::uint8_t byte) { return byte == 0; });
}

std::error_code check_ipv6(const in6_addr& ip) noexcept {
  const std::uint8_t* const b = ip.s6_addr;
  // A mapped address reaches the IPv4 host, so it must pass the IPv4 rules (::ffff:255.255.255.255).
  if (all_zero(b, b + 10) && b[10] == 0xff && b[11] == 0xff) {
    std::uint32_t network_order = 0;
    std::memcpy(&network_order, b + 12, sizeof(network_order));
    return check_ipv4(ntohl(network_order));
  }
  if (all_zero(b, b + 16)) return make_error_code(errc::address_unspecified);
  if (b[0] == 0xff) return make_error_code(errc::address_multicast);
  return {};
}

std::error_code validate_in(std::span<const std::uint8_t> address) noexcept {
  sockaddr_in in{};
  if (!copy_exact(address, in)) return make_error_code(errc::address_length);
  if (in.sin_family != AF_INET) return make_error_code(errc::address_family);
  if (in.sin_port == 0) return make_error_code(errc::address_port_zero);
  return check_ipv4(ntohl(in.sin_addr.s_addr));
}

std::error_code validate_in6(std::span<const std::uint8_t> address) noexcept {
  sockaddr_in6 in6{};
  if (!copy_exact(address, in6)) return make_error_code(errc::address_length);
  if (in6.sin6_family != AF_INET6) return make_error_code(errc::address_family);
  if (in6.sin6_port == 0) return make_error_code(errc::address_port_zero);
  return check_ipv6(in6.sin6_addr);
}

// FI_SOCKADDR says only "some struct sockaddr": the family inside decides which rules apply.
std::error_code validate_sockaddr(std::span<const std::uint8_t> address) noexcept {
  sa_family_t family{};
  constexpr std::size_t offset = offsetof(sockaddr, sa_family);
  if (address.size() < offset + sizeof(family)) return make_error_code(errc::address_length);
  std::memcpy(&family, address.data() + offset, sizeof(family));
  if (family == AF_INET) return validate_in(address);
  if (family == AF_INET6) return validate_in6(address);
  return make_error_code(errc::address_family);
}

// FI_ADDR_STR, as shm's names are: "<scheme>://<name>" and its NUL, printable, no further '/'.
// shm hands the part after "://" to shm_open; the length limit is far above any name shm makes
// (fi_shm://dma-<pid>-<16 hex digits>:<uid>:<index> from this library, fi_shm://<pid>:<uid>:<index>
// from a peer at libfabric's defaults, fi_ns://<port>) and far below what an advertisement can carry.
std::error_code validate_text(std::span<const std::uint8_t> address) noexcept {
  if (address.size() < 2 || address.size() > text_address_limit || address.back() != 0) {
    return make_error_code(errc::address_length);
  }
  const std::string_view text(reinterpret_cast<const char*>(address.data()), address.size() - 1);
  const auto separator = text.find("://");
  if (separator == std::string_view::npos || separator == 0 || separator + 3 == text.size()) {
    return make_error_code(errc::address_family);
  }
  const bool scheme_ok = std::all_of(text.begin(), text.begin() + separator, [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
  const auto name = text.substr(separator + 3);
  const bool name_ok = std::all_of(name.begin(), name.end(), [](char c) { return c > 0x20 && c < 0x7f && c != '/'; });
  return scheme_ok && name_ok ? std::error_code{} : make_error_code(errc::address_family);
}

}  // namespace

Advertisement Advertisement::parse(std::string_view text) {
  Fields fields;
  Advertisement parsed;
  if (const auto fault = parse_text(text, fields, parsed)) {
    throw std::system_error(make_error_code(fault->code), describe(*fault, fields));
  }
  return parsed;
}

Advertisement Advertisement::parse(std::string_view text, std::error_code& ec) {
  Fields fields;
  Advertisement parsed;
  const auto fault = parse_text(text, fields, parsed);
  return report(fault, std::move(parsed), ec);
}

Advertisement Advertisement::from_fields(std::span<const std::string_view> fields) {
  Advertisement parsed;
  if (const auto fault = decode_fields(fields, parsed)) {
    throw std::system_error(make_error_code(fault->code), describe(*fault, fields));
  }
  return parsed;
}

Advertisement Advertisement::from_fields(std::span<const std::string_view> fields, std::error_code& ec) {
  Advertisement parsed;
  const auto fault = decode_fields(fields, parsed);
  return report(fault, std::move(parsed), ec);
}

std::string Advertisement::to_string() const {
  return encode_hex(address) + ' ' + std::to_string(remote_key) + ' ' + std::to_string(remote_address);
}

std::string encode_hex(std::span<const std::uint8_t> bytes) {
  constexpr std::string_view digits = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const std::uint8_t byte : bytes) {
    text += digits[byte >> 4];
    text += digits[byte & 0x0f];
  }
  return text;
}

std::vector<std::uint8_t> decode_hex(std::string_view text, std::error_code& ec) {
  ec.clear();
  if (text.size() % 2 != 0) {
    ec = make_error_code(errc::advertisement_hex);
    return {};
  }
  std::vector<std::uint8_t> bytes(text.size() / 2);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const int high = hex_value(text[2 * i]);
    const int low = hex_value(text[2 * i + 1]);
    if (high < 0 || low < 0) {
      ec = make_error_code(errc::advertisement_hex);
      return {};
    }
    bytes[i] = static_cast<std::uint8_t>(high << 4 | low);
  }
  return bytes;
}

std::vector<std::uint8_t> decode_hex(std::string_view text) {
  std::error_code ec;
  auto bytes = decode_hex(text, ec);
  throw_if(ec, "decode_hex of " + quoted(text));
  return bytes;
}

std::optional<std::uint64_t> parse_u64(std::string_view text) noexcept {
  // Rust's u64::from_str takes one '+'; from_chars takes none, so "+" and "++1" still fail below.
  if (text.starts_with('+')) text.remove_prefix(1);
  std::uint64_t value = 0;
  const char* const end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error != std::errc{} || stop != end) return std::nullopt;
  return value;
}

std::error_code validate_address(std::span<const std::uint8_t> address, std::uint32_t addr_format) noexcept {
  switch (addr_format) {
    case FI_SOCKADDR:
      return validate_sockaddr(address);
    case FI_SOCKADDR_IN:
      return validate_in(address);
    case FI_SOCKADDR_IN6:
      return validate_in6(address);
    // efa's GID/QPN/QKEY carry no host semantics to check here; the peer table compares identity.
    case FI_ADDR_EFA:
      return address.size() == efa_address_length ? std::error_code{} : make_error_code(errc::address_length);
    case FI_ADDR_STR:
      return validate_text(address);
    default:
      return make_error_code(errc::address_format_unsupported);
  }
}

}  // namespace dma
