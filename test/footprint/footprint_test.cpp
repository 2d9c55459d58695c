// Resident memory of Targets and an idle service, measured in this process. Bounds are loose
// (memory is not timing): they catch provider pools sized for messaging, ~70 MB per endpoint.
#include "../catch.hpp"

#include "../../tools/common/resident_memory.hpp"
#include "hints.hpp"

#include <dma/dma.hpp>

#include <asio/io_context.hpp>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

// AddressSanitizer's redzones, quarantine and shadow pages inflate every allocation, so the bounds
// are the library's own only in an unsanitized build; under it they are loosened four times.
#if defined(__SANITIZE_ADDRESS__)
constexpr std::size_t bound_scale = 4;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr std::size_t bound_scale = 4;
#else
constexpr std::size_t bound_scale = 1;
#endif
#else
constexpr std::size_t bound_scale = 1;
#endif

// Read before any test opens an endpoint: whether the user's environment already sizes rxm.
const bool user_sized_rxm = std::getenv("FI_OFI_RXM_BUFFER_SIZE") != nullptr;

dma::Configuration loopback() {
  dma::Configuration configuration;
  configuration.bind = "127.0.0.1";
  return configuration;
}

struct Context {
  std::vector<std::byte> bytes = std::vector<std::byte>(64, std::byte{0x5a});
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t n) {
    bytes.resize(n);
    return bytes;
  }
};

/// Resident bytes that opening `count` Targets with a 4 KiB region each, and one 64-byte write
/// into each from a service, add to this process. The write matters: providers size some pools
/// at a connection's first use, not at open (native tcp's transfer pool, libfabric 1.18 and later).
std::size_t targets_cost(std::size_t count) {
  asio::io_context io;
  dma::asynchronous::FabricService<Context> service(io, loopback());
  std::vector<std::unique_ptr<dma::Target>> targets;
  std::vector<std::vector<std::byte>> memory(count, std::vector<std::byte>(4096));
  std::vector<dma::Target::Region> regions;
  const std::size_t before = dma::tools::trimmed_resident_bytes();
  for (std::size_t i = 0; i < count; ++i) {
    targets.push_back(std::make_unique<dma::Target>(io, loopback()));
    regions.push_back(targets.back()->expose(memory[i]));
  }
  std::size_t written = 0;
  for (const auto& region : regions) {
    dma::TransferRequest<Context> request;
    request.client_id = 1;
    request.set_peer(region.advertisement(), 0);
    request.direction = dma::Direction::ToPeer;
    service.submit(std::move(request), [&](std::error_code, dma::Completion<Context> c) {
      CHECK(c.outcome.ok());
      ++written;
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (written < count && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(std::chrono::milliseconds(10));
  }
  REQUIRE(written == count);
  const std::size_t after = dma::tools::trimmed_resident_bytes();
  return after > before ? after - before : 0;
}

/// The variable that sizes the provider's largest per-connection pool, as the slim buffers set it.
const char* slim_variable() {
  return dma::detail::tcp_rdm_is_rxm_only(fi_version()) ? "FI_OFI_RXM_BUFFER_SIZE" : "FI_TCP_MAX_RX_SIZE";
}

}  // namespace

// First in this file, so that the service also pays for libfabric's initialisation.
TEST_CASE("an idle service takes at most 8 MB beyond the process's baseline", "[footprint]") {
  const std::size_t before = dma::tools::trimmed_resident_bytes();
  asio::io_context io;
  dma::asynchronous::FabricService<Context> service(io, loopback());
  const std::size_t after = dma::tools::trimmed_resident_bytes();
  INFO("the service added " << (after - before) / 1024 << " KiB");
  CHECK(after - before <= 8 * mib * bound_scale);
}

TEST_CASE("five Targets with 4 KiB regions take at most 60 MB resident", "[footprint]") {
  const std::size_t cost = targets_cost(5);
  INFO("five Targets added " << cost / 1024 << " KiB");
  CHECK(cost <= 60 * mib * bound_scale);
}

TEST_CASE("the process settings cannot change once an endpoint has opened", "[footprint]") {
  (void)targets_cost(1);
  CHECK(dma::process_settings().slim_buffers);
  CHECK_FALSE(dma::set_process_settings(dma::ProcessSettings{.slim_buffers = false}));
  CHECK(dma::process_settings().slim_buffers);
  if (!user_sized_rxm) {
    REQUIRE(std::getenv(slim_variable()) != nullptr);
    CHECK(std::string(std::getenv(slim_variable())) == "1024");
  }
}

// Run with FI_OFI_RXM_BUFFER_SIZE=2048 in the environment (meson: footprint-user-env).
TEST_CASE("a value the user set in the environment is kept", "[.user-env]") {
  REQUIRE(std::getenv("FI_OFI_RXM_BUFFER_SIZE") != nullptr);
  const std::string users = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
  (void)targets_cost(1);
  CHECK(std::string(std::getenv("FI_OFI_RXM_BUFFER_SIZE")) == users);
  CHECK(std::string(std::getenv("FI_OFI_RXM_MSG_RX_SIZE")) == "128");
}

// In a process of its own (meson: footprint-slim-off): the setting is read at the first open.
TEST_CASE("with the slim buffers turned off, the provider's own pool sizes apply", "[.slim-off]") {
  REQUIRE(dma::set_process_settings(dma::ProcessSettings{.slim_buffers = false}));
  if (user_sized_rxm) return;  // the user's environment decides, not the setting
  const std::size_t cost = targets_cost(1);
  INFO("one Target added " << cost / 1024 << " KiB");
  CHECK(std::getenv("FI_OFI_RXM_BUFFER_SIZE") == nullptr);
  CHECK(std::getenv("FI_OFI_RXM_MSG_RX_SIZE") == nullptr);
  CHECK(std::getenv("FI_TCP_MAX_RX_SIZE") == nullptr);
  // The slim buffers are what makes the difference: rxm's pools (1.17) take about 68 MiB per
  // Target, native tcp's transfer pool (1.18 and later) about 16 MiB at the first connection.
  CHECK(cost > 10 * mib);
}
