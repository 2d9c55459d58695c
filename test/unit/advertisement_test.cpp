#include "dma/advertisement.hpp"

#include "dma/error.hpp"

#include "../catch.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

using dma::Advertisement;
using dma::errc;
using Bytes = std::vector<std::uint8_t>;

Advertisement from(std::initializer_list<std::string_view> fields, std::error_code& ec) {
  return Advertisement::from_fields(std::span<const std::string_view>(fields.begin(), fields.size()), ec);
}

Advertisement from(std::initializer_list<std::string_view> fields) {
  return Advertisement::from_fields(std::span<const std::string_view>(fields.begin(), fields.size()));
}

std::error_code from_fields_error(std::initializer_list<std::string_view> fields) {
  std::error_code ec;
  from(fields, ec);
  return ec;
}

std::error_code parse_error(std::string_view text) {
  std::error_code ec;
  Advertisement::parse(text, ec);
  return ec;
}

template <typename Call>
std::system_error thrown_by(Call&& call) {
  try {
    call();
  } catch (const std::system_error& error) {
    return error;
  }
  FAIL("no std::system_error was thrown");
  return std::system_error(std::error_code{});
}

bool contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

template <typename Sockaddr>
Bytes bytes_of(const Sockaddr& address) {
  Bytes bytes(sizeof(Sockaddr));
  std::memcpy(bytes.data(), &address, sizeof(Sockaddr));
  return bytes;
}

Bytes ipv4(const char* ip, std::uint16_t port, sa_family_t family = AF_INET) {
  sockaddr_in in{};
  in.sin_family = family;
  in.sin_port = htons(port);
  REQUIRE(inet_pton(AF_INET, ip, &in.sin_addr) == 1);
  return bytes_of(in);
}

Bytes ipv6(const char* ip, std::uint16_t port, sa_family_t family = AF_INET6) {
  sockaddr_in6 in6{};
  in6.sin6_family = family;
  in6.sin6_port = htons(port);
  REQUIRE(inet_pton(AF_INET6, ip, &in6.sin6_addr) == 1);
  return bytes_of(in6);
}

std::error_code validate(const Bytes& address, std::uint32_t format) { return dma::validate_address(address, format); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// from_fields

TEST_CASE("the seed's test vector parses to its address, rkey and remote address", "[advertisement]") {
  const Advertisement parsed = from({"01007fffab", "42", "139638282147448"});
  CHECK(parsed.address == Bytes{0x01, 0x00, 0x7f, 0xff, 0xab});
  CHECK(parsed.remote_key == 42);
  CHECK(parsed.remote_address == 0x7f0012345678);
}

TEST_CASE("an uppercase or mixed-case hex address parses like the lowercase one", "[advertisement]") {
  const Advertisement lower = from({"01007fffab", "42", "7"});
  CHECK(from({"01007FFFAB", "42", "7"}) == lower);
  CHECK(from({"01007fFfAb", "42", "7"}) == lower);
}

TEST_CASE("an advertisement with two fields is rejected as arity", "[advertisement]") {
  CHECK(from_fields_error({"01007fffab", "42"}) == errc::advertisement_arity);
  CHECK(parse_error("01007fffab 42") == errc::advertisement_arity);
}

TEST_CASE("an advertisement with four fields is rejected as arity", "[advertisement]") {
  CHECK(from_fields_error({"01007fffab", "42", "0", "0"}) == errc::advertisement_arity);
  CHECK(parse_error("01007fffab 42 0 0") == errc::advertisement_arity);
}

TEST_CASE("an advertisement with no fields is rejected as arity", "[advertisement]") {
  CHECK(from_fields_error({}) == errc::advertisement_arity);
  CHECK(parse_error("") == errc::advertisement_arity);
  CHECK(parse_error(" \t\n") == errc::advertisement_arity);
}

TEST_CASE("an address of odd length is rejected as hex", "[advertisement]") {
  CHECK(from_fields_error({"01007fffa", "42", "0"}) == errc::advertisement_hex);
  CHECK(from_fields_error({"1", "42", "0"}) == errc::advertisement_hex);
}

TEST_CASE("an address with a non-hex character is rejected as hex", "[advertisement]") {
  CHECK(from_fields_error({"01007fffag", "42", "0"}) == errc::advertisement_hex);
  CHECK(from_fields_error({"0x0100", "42", "0"}) == errc::advertisement_hex);
  CHECK(from_fields_error({"01\xc3\xa9", "42", "0"}) == errc::advertisement_hex);
  CHECK(from_fields_error({"01 0", "42", "0"}) == errc::advertisement_hex);
}

TEST_CASE("an empty address field is accepted, as the seed does", "[advertisement]") {
  std::error_code ec = dma::make_error_code(errc::advertisement_hex);
  const Advertisement parsed = from({"", "42", "0"}, ec);
  CHECK_FALSE(ec);
  CHECK(parsed.address.empty());
  CHECK(parsed.remote_key == 42);
}

TEST_CASE("a negative rkey or remote address is rejected as integer", "[advertisement]") {
  CHECK(from_fields_error({"01", "-42", "0"}) == errc::advertisement_integer);
  CHECK(from_fields_error({"01", "42", "-1"}) == errc::advertisement_integer);
  CHECK(from_fields_error({"01", "-0", "0"}) == errc::advertisement_integer);
}

TEST_CASE("an integer with whitespace inside or around it is rejected as integer", "[advertisement]") {
  CHECK(from_fields_error({"01", "4 2", "0"}) == errc::advertisement_integer);
  CHECK(from_fields_error({"01", " 42", "0"}) == errc::advertisement_integer);
  CHECK(from_fields_error({"01", "42", "0\n"}) == errc::advertisement_integer);
}

TEST_CASE("an integer above UINT64_MAX is rejected as integer", "[advertisement]") {
  CHECK(from_fields_error({"01", "18446744073709551616", "0"}) == errc::advertisement_integer);
  CHECK(from_fields_error({"01", "0", "99999999999999999999999"}) == errc::advertisement_integer);
}

TEST_CASE("an integer of exactly UINT64_MAX is accepted", "[advertisement]") {
  const Advertisement parsed = from({"01", "18446744073709551615", "18446744073709551615"});
  CHECK(parsed.remote_key == UINT64_MAX);
  CHECK(parsed.remote_address == UINT64_MAX);
}

TEST_CASE("an integer with one leading plus is accepted", "[advertisement]") {
  const Advertisement parsed = from({"01", "+42", "+139638282147448"});
  CHECK(parsed.remote_key == 42);
  CHECK(parsed.remote_address == 0x7f0012345678);
}

TEST_CASE("an empty field where an integer belongs is rejected as integer", "[advertisement]") {
  CHECK(from_fields_error({"01", "", "0"}) == errc::advertisement_integer);
  CHECK(from_fields_error({"01", "0", ""}) == errc::advertisement_integer);
}

TEST_CASE("the hex check comes before the integer checks", "[advertisement]") {
  CHECK(from_fields_error({"zz", "-1", "-1"}) == errc::advertisement_hex);
}

TEST_CASE("a failed from_fields returns an empty advertisement", "[advertisement]") {
  std::error_code ec;
  const Advertisement parsed = from({"01007fffab", "42", "x"}, ec);
  CHECK(ec == errc::advertisement_integer);
  CHECK(parsed == Advertisement{});
}

TEST_CASE("a successful from_fields clears a stale error_code", "[advertisement]") {
  std::error_code ec = dma::make_error_code(errc::advertisement_arity);
  from({"01", "1", "2"}, ec);
  CHECK_FALSE(ec);
}

TEST_CASE("throwing from_fields names the offending field and its value", "[advertisement]") {
  SECTION("arity") {
    const auto error = thrown_by([] { from({"01", "42"}); });
    CHECK(error.code() == errc::advertisement_arity);
    CHECK(contains(error.what(), "2 fields"));
  }
  SECTION("hex") {
    const auto error = thrown_by([] { from({"0g", "42", "0"}); });
    CHECK(error.code() == errc::advertisement_hex);
    CHECK(contains(error.what(), "address \"0g\""));
  }
  SECTION("remote key") {
    const auto error = thrown_by([] { from({"01", "-42", "0"}); });
    CHECK(error.code() == errc::advertisement_integer);
    CHECK(contains(error.what(), "remote key \"-42\""));
  }
  SECTION("remote address") {
    const auto error = thrown_by([] { from({"01", "42", "18446744073709551616"}); });
    CHECK(error.code() == errc::advertisement_integer);
    CHECK(contains(error.what(), "remote address \"18446744073709551616\""));
  }
}

TEST_CASE("an exception message shows untrusted text shortened and printable", "[advertisement]") {
  const std::string long_field(300, 'q');
  const auto error = thrown_by([&] { from({long_field, "1", "2"}); });
  const std::string what = error.what();
  CHECK(contains(what, std::string(64, 'q') + "...\""));
  CHECK_FALSE(contains(what, std::string(65, 'q')));

  const auto control = thrown_by([] { from({"01", "4\x1b[2J", "0"}); });
  CHECK_FALSE(contains(control.what(), "\x1b"));
}

// ---------------------------------------------------------------------------------------------
// parse

TEST_CASE("parse splits on spaces, tabs and a trailing newline", "[advertisement]") {
  const Advertisement expected = from({"01007fffab", "42", "139638282147448"});
  CHECK(Advertisement::parse("01007fffab 42 139638282147448") == expected);
  CHECK(Advertisement::parse("01007fffab\t42\t139638282147448\n") == expected);
  CHECK(Advertisement::parse("  01007fffab   42 \t 139638282147448\r\n") == expected);
}

TEST_CASE("parse rejects text longer than max_advertisement_length as too long", "[advertisement]") {
  std::string text = "01 42 0";
  text.resize(dma::max_advertisement_length + 1, ' ');
  std::error_code ec;
  const Advertisement parsed = Advertisement::parse(text, ec);
  CHECK(ec == errc::advertisement_too_long);
  CHECK(parsed == Advertisement{});
  CHECK(ec.message() == "advertisement is longer than 512 characters");
  CHECK(ec == dma::condition::invalid_advertisement);
}

TEST_CASE("parse accepts text of exactly max_advertisement_length", "[advertisement]") {
  std::string text = "01 42 0";
  text.resize(dma::max_advertisement_length, ' ');
  std::error_code ec;
  const Advertisement parsed = Advertisement::parse(text, ec);
  CHECK_FALSE(ec);
  CHECK(parsed.address == Bytes{0x01});
}

TEST_CASE("parse rejects an over-long text before looking at its fields", "[advertisement]") {
  const std::string text(dma::max_advertisement_length + 1, 'z');
  CHECK(parse_error(text) == errc::advertisement_too_long);
}

TEST_CASE("parse reports the field errors of from_fields", "[advertisement]") {
  CHECK(parse_error("01007fffa 42 0") == errc::advertisement_hex);
  CHECK(parse_error("01007fffab -42 0") == errc::advertisement_integer);
  CHECK(parse_error("01007fffab 42 18446744073709551616") == errc::advertisement_integer);
}

TEST_CASE("throwing parse names what failed and with which value", "[advertisement]") {
  SECTION("too long") {
    const auto error = thrown_by([] { Advertisement::parse(std::string(600, '0')); });
    CHECK(error.code() == errc::advertisement_too_long);
    CHECK(contains(error.what(), "600 characters"));
  }
  SECTION("arity") {
    const auto error = thrown_by([] { Advertisement::parse("a b c d e"); });
    CHECK(error.code() == errc::advertisement_arity);
    CHECK(contains(error.what(), "5 fields"));
  }
  SECTION("integer") {
    const auto error = thrown_by([] { Advertisement::parse("01 +  0"); });
    CHECK(error.code() == errc::advertisement_integer);
    CHECK(contains(error.what(), "remote key \"+\""));
  }
}

// ---------------------------------------------------------------------------------------------
// to_string

TEST_CASE("to_string writes lowercase hex and decimal integers", "[advertisement]") {
  const Advertisement advertisement{{0x01, 0x00, 0x7f, 0xff, 0xAB}, 42, 0x7f0012345678};
  CHECK(advertisement.to_string() == "01007fffab 42 139638282147448");
}

TEST_CASE("an advertisement survives to_string and parse", "[advertisement]") {
  const Advertisement advertisement{{0xde, 0xad, 0xbe, 0xef, 0x00, 0x10}, UINT64_MAX, 0};
  CHECK(Advertisement::parse(advertisement.to_string()) == advertisement);
  const Advertisement uppercase = Advertisement::parse("DEADBEEF0010 18446744073709551615 0");
  CHECK(uppercase.to_string() == "deadbeef0010 18446744073709551615 0");
}

TEST_CASE("an advertisement with an empty address does not survive to_string and parse", "[advertisement]") {
  const Advertisement advertisement{{}, 42, 0};
  CHECK(parse_error(advertisement.to_string()) == errc::advertisement_arity);
}

// ---------------------------------------------------------------------------------------------
// encode_hex, decode_hex, parse_u64

TEST_CASE("every byte value survives encode_hex and decode_hex", "[advertisement]") {
  Bytes all(256);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<std::uint8_t>(i);
  const std::string text = dma::encode_hex(all);
  CHECK(text.size() == 512);
  CHECK(text.substr(0, 8) == "00010203");
  CHECK(text.substr(text.size() - 4) == "feff");
  CHECK(dma::decode_hex(text) == all);
}

TEST_CASE("decode_hex of an empty string is an empty vector", "[advertisement]") {
  std::error_code ec = dma::make_error_code(errc::advertisement_hex);
  CHECK(dma::decode_hex("", ec).empty());
  CHECK_FALSE(ec);
}

TEST_CASE("throwing decode_hex reports hex with the offending text", "[advertisement]") {
  const auto error = thrown_by([] { dma::decode_hex("abc"); });
  CHECK(error.code() == errc::advertisement_hex);
  CHECK(contains(error.what(), "\"abc\""));
}

TEST_CASE("parse_u64 follows Rust's u64 rules", "[advertisement]") {
  CHECK(dma::parse_u64("0") == 0U);
  CHECK(dma::parse_u64("007") == 7U);
  CHECK(dma::parse_u64("+7") == 7U);
  CHECK(dma::parse_u64("18446744073709551615") == UINT64_MAX);
  CHECK_FALSE(dma::parse_u64(""));
  CHECK_FALSE(dma::parse_u64("+"));
  CHECK_FALSE(dma::parse_u64("-"));
  CHECK_FALSE(dma::parse_u64("-0"));
  CHECK_FALSE(dma::parse_u64("++7"));
  CHECK_FALSE(dma::parse_u64("+-7"));
  CHECK_FALSE(dma::parse_u64(" 7"));
  CHECK_FALSE(dma::parse_u64("7 "));
  CHECK_FALSE(dma::parse_u64("7x"));
  CHECK_FALSE(dma::parse_u64("0x10"));
  CHECK_FALSE(dma::parse_u64("1e3"));
  CHECK_FALSE(dma::parse_u64("18446744073709551616"));
}

TEST_CASE("every advertisement error is an invalid_advertisement", "[advertisement]") {
  for (const errc code :
       {errc::advertisement_arity, errc::advertisement_hex, errc::advertisement_integer, errc::advertisement_too_long,
        errc::address_length, errc::address_family, errc::address_port_zero, errc::address_unspecified,
        errc::address_multicast, errc::address_broadcast, errc::address_format_unsupported}) {
    CHECK(dma::make_error_code(code) == dma::condition::invalid_advertisement);
  }
}

// ---------------------------------------------------------------------------------------------
// validate_address

TEST_CASE("a 127.0.0.1 sockaddr_in with a port is a valid address", "[advertisement]") {
  const Bytes address = ipv4("127.0.0.1", 4242);
  CHECK_FALSE(validate(address, FI_SOCKADDR_IN));
  CHECK_FALSE(validate(address, FI_SOCKADDR));
}

TEST_CASE("the seed's dead-peer bytes are a valid sockaddr_in", "[advertisement]") {
  if constexpr (std::endian::native == std::endian::little) {
    const Bytes dead_peer{2, 0, 0, 1, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(dead_peer == ipv4("127.0.0.1", 1));
    CHECK_FALSE(validate(dead_peer, FI_SOCKADDR_IN));
  }
}

TEST_CASE("a global or loopback sockaddr_in6 with a port is a valid address", "[advertisement]") {
  for (const char* ip : {"::1", "2001:db8::1", "fe80::1", "::ffff:127.0.0.1"}) {
    CAPTURE(ip);
    const Bytes address = ipv6(ip, 4242);
    CHECK_FALSE(validate(address, FI_SOCKADDR_IN6));
    CHECK_FALSE(validate(address, FI_SOCKADDR));
  }
}

TEST_CASE("a sockaddr_in of the wrong length is rejected as address_length", "[advertisement]") {
  Bytes address = ipv4("127.0.0.1", 4242);
  address.push_back(0);
  CHECK(validate(address, FI_SOCKADDR_IN) == errc::address_length);
  address.resize(15);
  CHECK(validate(address, FI_SOCKADDR_IN) == errc::address_length);
  CHECK(validate({}, FI_SOCKADDR_IN) == errc::address_length);
}

TEST_CASE("a sockaddr_in6 of the wrong length is rejected as address_length", "[advertisement]") {
  Bytes address = ipv6("::1", 4242);
  REQUIRE(address.size() == 28);
  address.pop_back();
  CHECK(validate(address, FI_SOCKADDR_IN6) == errc::address_length);
  CHECK(validate(ipv4("127.0.0.1", 4242), FI_SOCKADDR_IN6) == errc::address_length);
}

TEST_CASE("an IPv6 family in an FI_SOCKADDR_IN address is rejected as address_family", "[advertisement]") {
  CHECK(validate(ipv4("127.0.0.1", 4242, AF_INET6), FI_SOCKADDR_IN) == errc::address_family);
}

TEST_CASE("an IPv4 family in an FI_SOCKADDR_IN6 address is rejected as address_family", "[advertisement]") {
  CHECK(validate(ipv6("::1", 4242, AF_INET), FI_SOCKADDR_IN6) == errc::address_family);
}

TEST_CASE("a sockaddr_in with port 0 is rejected as address_port_zero", "[advertisement]") {
  CHECK(validate(ipv4("127.0.0.1", 0), FI_SOCKADDR_IN) == errc::address_port_zero);
}

TEST_CASE("a sockaddr_in6 with port 0 is rejected as address_port_zero", "[advertisement]") {
  CHECK(validate(ipv6("::1", 0), FI_SOCKADDR_IN6) == errc::address_port_zero);
}

TEST_CASE("0.0.0.0 is rejected as address_unspecified", "[advertisement]") {
  CHECK(validate(ipv4("0.0.0.0", 4242), FI_SOCKADDR_IN) == errc::address_unspecified);
}

TEST_CASE("the IPv6 address :: is rejected as address_unspecified", "[advertisement]") {
  CHECK(validate(ipv6("::", 4242), FI_SOCKADDR_IN6) == errc::address_unspecified);
}

TEST_CASE("an IPv4 multicast address is rejected as address_multicast", "[advertisement]") {
  for (const char* ip : {"224.0.0.1", "239.255.255.255"}) {
    CAPTURE(ip);
    CHECK(validate(ipv4(ip, 4242), FI_SOCKADDR_IN) == errc::address_multicast);
  }
}

TEST_CASE("the addresses just outside 224.0.0.0/4 are not multicast", "[advertisement]") {
  CHECK_FALSE(validate(ipv4("223.255.255.255", 4242), FI_SOCKADDR_IN));
  CHECK_FALSE(validate(ipv4("240.0.0.1", 4242), FI_SOCKADDR_IN));
}

TEST_CASE("an IPv6 multicast address is rejected as address_multicast", "[advertisement]") {
  for (const char* ip : {"ff02::1", "ff0e::1234"}) {
    CAPTURE(ip);
    CHECK(validate(ipv6(ip, 4242), FI_SOCKADDR_IN6) == errc::address_multicast);
  }
}

TEST_CASE("255.255.255.255 is rejected as address_broadcast", "[advertisement]") {
  CHECK(validate(ipv4("255.255.255.255", 4242), FI_SOCKADDR_IN) == errc::address_broadcast);
}

TEST_CASE("an IPv4-mapped :: address is rejected as address_unspecified", "[advertisement]") {
  CHECK(validate(ipv6("::ffff:0.0.0.0", 4242), FI_SOCKADDR_IN6) == errc::address_unspecified);
}

TEST_CASE("an IPv4-mapped multicast address is rejected as address_multicast", "[advertisement]") {
  CHECK(validate(ipv6("::ffff:224.0.0.1", 4242), FI_SOCKADDR_IN6) == errc::address_multicast);
}

TEST_CASE("an IPv4-mapped broadcast address is rejected as address_broadcast", "[advertisement]") {
  CHECK(validate(ipv6("::ffff:255.255.255.255", 4242), FI_SOCKADDR_IN6) == errc::address_broadcast);
}

TEST_CASE("port 0 is found before the address itself", "[advertisement]") {
  CHECK(validate(ipv4("0.0.0.0", 0), FI_SOCKADDR_IN) == errc::address_port_zero);
}

TEST_CASE("an efa address must be exactly 32 bytes", "[advertisement]") {
  CHECK_FALSE(validate(Bytes(32, 0xab), FI_ADDR_EFA));
  CHECK_FALSE(validate(Bytes(32, 0x00), FI_ADDR_EFA));
  CHECK(validate(Bytes(31, 0xab), FI_ADDR_EFA) == errc::address_length);
  CHECK(validate(Bytes(33, 0xab), FI_ADDR_EFA) == errc::address_length);
  CHECK(validate({}, FI_ADDR_EFA) == errc::address_length);
}

TEST_CASE("an FI_SOCKADDR address is checked by the family inside it", "[advertisement]") {
  CHECK(validate(ipv4("224.0.0.1", 4242), FI_SOCKADDR) == errc::address_multicast);
  CHECK(validate(ipv6("::", 4242), FI_SOCKADDR) == errc::address_unspecified);
  CHECK(validate(ipv4("127.0.0.1", 0), FI_SOCKADDR) == errc::address_port_zero);
}

TEST_CASE("an FI_SOCKADDR address whose length does not fit its family is rejected as address_length",
          "[advertisement]") {
  Bytes as_ipv6 = ipv4("127.0.0.1", 4242);
  as_ipv6.resize(sizeof(sockaddr_in6));
  CHECK(validate(as_ipv6, FI_SOCKADDR) == errc::address_length);
  Bytes short_ipv6 = ipv6("::1", 4242);
  short_ipv6.resize(sizeof(sockaddr_in));
  CHECK(validate(short_ipv6, FI_SOCKADDR) == errc::address_length);
  CHECK(validate(Bytes{0x02}, FI_SOCKADDR) == errc::address_length);
  CHECK(validate({}, FI_SOCKADDR) == errc::address_length);
}

TEST_CASE("an FI_SOCKADDR address of another family is rejected as address_family", "[advertisement]") {
  sockaddr_un local{};
  local.sun_family = AF_UNIX;
  CHECK(validate(bytes_of(local), FI_SOCKADDR) == errc::address_family);
  CHECK(validate(Bytes(16, 0), FI_SOCKADDR) == errc::address_family);
}

namespace {
Bytes text(std::string_view name, bool terminated = true) {
  Bytes bytes(name.begin(), name.end());
  if (terminated) bytes.push_back(0);
  return bytes;
}
}  // namespace

TEST_CASE("an shm name is accepted as an FI_ADDR_STR address", "[advertisement]") {
  CHECK_FALSE(validate(text("fi_shm://4242:0:0"), FI_ADDR_STR));
  CHECK_FALSE(validate(text("fi_ns://9228"), FI_ADDR_STR));
}

TEST_CASE("an FI_ADDR_STR address without its NUL, empty or too long is rejected as address_length",
          "[advertisement]") {
  CHECK(validate(text("fi_shm://4242:0:0", false), FI_ADDR_STR) == errc::address_length);
  CHECK(validate({}, FI_ADDR_STR) == errc::address_length);
  CHECK(validate(text("fi_shm://" + std::string(120, 'a')), FI_ADDR_STR) == errc::address_length);
}

TEST_CASE("an FI_ADDR_STR address that is not scheme://name, or names a path, is rejected as address_family",
          "[advertisement]") {
  CHECK(validate(text("4242:0:0"), FI_ADDR_STR) == errc::address_family);
  CHECK(validate(text("fi_shm://"), FI_ADDR_STR) == errc::address_family);
  CHECK(validate(text("://4242"), FI_ADDR_STR) == errc::address_family);
  CHECK(validate(text("fi_shm://../../etc/passwd"), FI_ADDR_STR) == errc::address_family);
  CHECK(validate(text("fi_shm://a b"), FI_ADDR_STR) == errc::address_family);
  CHECK(validate(text("FI_SHM://4242"), FI_ADDR_STR) == errc::address_family);
  Bytes inner_nul = text("fi_shm://42");
  inner_nul[10] = 0;
  CHECK(validate(inner_nul, FI_ADDR_STR) == errc::address_family);
}

TEST_CASE("an address format other than sockaddr, efa and text is rejected as address_format_unsupported",
          "[advertisement]") {
  const Bytes address = ipv4("127.0.0.1", 4242);
  for (const std::uint32_t format :
       {std::uint32_t{FI_FORMAT_UNSPEC}, std::uint32_t{FI_SOCKADDR_IB}, std::uint32_t{FI_ADDR_PSMX}, 0xffffU}) {
    CAPTURE(format);
    CHECK(validate(address, format) == errc::address_format_unsupported);
  }
}

TEST_CASE("a parsed advertisement's address can be validated", "[advertisement]") {
  const Bytes address = ipv4("127.0.0.1", 4242);
  const Advertisement advertisement{address, 7, 0};
  const Advertisement parsed = Advertisement::parse(advertisement.to_string());
  CHECK(parsed.address == address);
  CHECK_FALSE(dma::validate_address(parsed.address, FI_SOCKADDR_IN));
}

TEST_CASE("from_fields refuses fields longer together than parse() would take, before decoding", "[advertisement]") {
  const std::string long_hex(dma::max_advertisement_length, 'a');
  const std::string at_limit(dma::max_advertisement_length - 4, 'a');  // + " 1 2" is exactly the limit
  CHECK(from_fields_error({long_hex, "1", "2"}) == errc::advertisement_too_long);
  CHECK(from_fields_error({at_limit, "1", "2"}) != errc::advertisement_too_long);
  CHECK(parse_error(long_hex + " 1 2") == errc::advertisement_too_long);
}
