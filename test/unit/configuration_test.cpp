#include <dma/checksum.hpp>
#include <dma/configuration.hpp>
#include <dma/peer_address.hpp>
#include <dma/transfer.hpp>

#include <cstring>
#include <string>

#include "../catch.hpp"
#include "hints.hpp"

TEST_CASE("the configuration defaults are the Rust crate's", "[configuration]") {
  const dma::Configuration configuration;
  CHECK(configuration.providers == std::vector<dma::Provider>{dma::Provider::tcp});
  CHECK(configuration.interfaces.empty());
  CHECK_FALSE(configuration.bind);
  CHECK_FALSE(configuration.max_in_flight);
  CHECK(configuration.progress_deadline == std::chrono::seconds(1));
}

TEST_CASE("the in-flight cap is max(1, max_in_flight or 64) clamped to a non-zero tx size", "[configuration]") {
  dma::Configuration configuration;
  CHECK(dma::requested_in_flight(configuration, 0) == 64);
  CHECK(dma::requested_in_flight(configuration, 16) == 16);
  configuration.max_in_flight = 0;
  CHECK(dma::requested_in_flight(configuration, 0) == 1);
  configuration.max_in_flight = 4096;
  CHECK(dma::requested_in_flight(configuration, 2048) == 2048);
}

TEST_CASE("providers have the seed's names", "[configuration]") {
  CHECK(dma::to_string(dma::Provider::tcp) == "tcp");
  CHECK(dma::to_string(dma::Provider::efa_direct) == "efa-direct");
  CHECK(dma::provider_name(dma::Provider::efa_direct) == "efa");
  CHECK(dma::fabric_name(dma::Provider::efa_direct) == "efa-direct");
  CHECK_FALSE(dma::fabric_name(dma::Provider::tcp));
  CHECK(dma::to_string(dma::Provider::shm) == "shm");
  CHECK(dma::provider_name(dma::Provider::shm) == "shm");
  CHECK_FALSE(dma::fabric_name(dma::Provider::shm));
}

TEST_CASE("CRC-32C matches the known check values", "[checksum]") {
  const std::string check = "123456789";
  CHECK(dma::checksum(std::as_bytes(std::span(check))) == 0xE3069283u);
  CHECK(dma::checksum({}) == 0u);
}

TEST_CASE("CRC-32C detects a single bit flip and is order sensitive", "[checksum]") {
  std::vector<std::byte> bytes(4096, std::byte{0xab});
  const auto base = dma::checksum(bytes);
  bytes[1000] ^= std::byte{0x01};
  CHECK(dma::checksum(bytes) != base);
  const std::string ab = "ab", ba = "ba";
  CHECK(dma::checksum(std::as_bytes(std::span(ab))) != dma::checksum(std::as_bytes(std::span(ba))));
}

TEST_CASE("a cacheable span refuses an overflowing range and knows what it contains", "[operands]") {
  CHECK_FALSE(dma::CacheableSpan::make(UINTPTR_MAX - 2, 4));
  const auto span = dma::CacheableSpan::make(100, 50);
  REQUIRE(span);
  CHECK(span->contains(100, 150));
  CHECK(span->contains(120, 130));
  CHECK_FALSE(span->contains(99, 120));
  CHECK_FALSE(span->contains(140, 151));
}

TEST_CASE("a byte vector is its own operand and allocate resizes it", "[operands]") {
  std::vector<std::uint8_t> v = {1, 2, 3};
  auto source = dma::Operands<std::vector<std::uint8_t>>::source(v);
  REQUIRE(source);
  CHECK(source->size() == 3);
  auto landing = dma::Operands<std::vector<std::uint8_t>>::allocate(v, 10);
  REQUIRE(landing);
  CHECK(landing->size() == 10);
  CHECK(v.size() == 10);
  CHECK(v[0] == 1);  // resize keeps what was there, as the Rust crate's Vec does
}

TEST_CASE("a context without operand members supports neither direction", "[operands]") {
  struct Nothing {};
  Nothing n;
  STATIC_REQUIRE_FALSE(dma::WriteContext<Nothing>);
  STATIC_REQUIRE_FALSE(dma::ReadContext<Nothing>);
  STATIC_REQUIRE_FALSE(dma::TransferContext<Nothing>);
  CHECK_FALSE(dma::Operands<Nothing>::cacheable_span(n));
}

TEST_CASE("the operand members a context has decide which directions it serves", "[operands]") {
  struct WriteOnly {
    std::span<const std::byte> source() const { return {}; }
  };
  struct ReadOnly {
    std::span<std::byte> allocate(std::size_t) { return {}; }
  };
  struct Gather {
    std::vector<std::span<const std::byte>> sources() const { return {}; }
  };
  STATIC_REQUIRE(dma::WriteContext<WriteOnly>);
  STATIC_REQUIRE_FALSE(dma::ReadContext<WriteOnly>);
  STATIC_REQUIRE(dma::TransferContext<WriteOnly>);
  STATIC_REQUIRE(dma::ReadContext<ReadOnly>);
  STATIC_REQUIRE_FALSE(dma::WriteContext<ReadOnly>);
  STATIC_REQUIRE(dma::WriteContext<Gather>);
  STATIC_REQUIRE(dma::TransferContext<std::vector<std::uint8_t>>);
  STATIC_REQUIRE(dma::ReadContext<std::vector<std::byte>>);
}

TEST_CASE("operand members returning optionals map none to unsupported", "[operands]") {
  struct Maybe {
    std::optional<std::span<const std::byte>> source() const { return std::nullopt; }
  };
  CHECK_FALSE(dma::Operands<Maybe>::source(Maybe{}));
}

TEST_CASE("a peer address is held inline and an oversized one is flagged, not truncated", "[operands]") {
  const std::vector<std::uint8_t> bytes = {2, 0, 0x30, 0x39, 127, 0, 0, 1};
  dma::PeerAddress address = bytes;
  CHECK(address.size() == bytes.size());
  CHECK(std::equal(address.begin(), address.end(), bytes.begin()));
  CHECK_FALSE(address.oversized());
  const std::vector<std::uint8_t> huge(dma::PeerAddress::capacity + 1, 7);
  dma::PeerAddress too_long = huge;
  CHECK(too_long.oversized());
  CHECK(too_long.empty());
  CHECK_FALSE(too_long == dma::PeerAddress{});
}

TEST_CASE("tcp RDM is rxm only before libfabric 1.18; only 1.17's rxm has an eager limit of its own",
          "[configuration]") {
  CHECK(dma::detail::tcp_rdm_is_rxm_only(FI_VERSION(1, 17)));
  CHECK_FALSE(dma::detail::tcp_rdm_is_rxm_only(FI_VERSION(1, 18)));
  CHECK_FALSE(dma::detail::tcp_rdm_is_rxm_only(FI_VERSION(2, 1)));
  CHECK_FALSE(dma::detail::tcp_rdm_is_rxm_only(FI_VERSION(2, 6)));
  CHECK(dma::detail::rxm_eager_limit_is_its_own_setting(FI_VERSION(1, 17)));
  CHECK_FALSE(dma::detail::rxm_eager_limit_is_its_own_setting(FI_VERSION(2, 6)));
}
