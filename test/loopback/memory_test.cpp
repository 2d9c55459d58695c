// Local registration on tcp, forced: per-transfer registrations, the cache, MemoryRegion lifetimes.
// The fixture first: it includes <dma/config.hpp>, which sets up the standard library before Asio
// reads its configuration (docs/design.md, "What the library exports").
#include "fixture.hpp"

#include <asio/use_awaitable.hpp>

namespace {

dma::Configuration forced() {
  auto configuration = test::loopback_configuration();
  configuration.force_local_registration = true;
  return configuration;
}

// A slice of a buffer the test owns, optionally promising the whole buffer as cacheable.
struct Slice {
  std::span<std::byte> bytes;
  std::optional<dma::CacheableSpan> span;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t) const { return bytes; }
  std::optional<dma::CacheableSpan> cacheable_span() const { return span; }
};

template <typename Context>
dma::Completion<Context> run_one(asio::io_context& io, dma::asynchronous::FabricService<Context>& service,
                                 dma::TransferRequest<Context> request) {
  auto future = service.submit(std::move(request), test::completion_future());
  REQUIRE(test::run_until(io, future));
  return future.get();
}

}  // namespace

TEST_CASE("forcing local registration on tcp registers each uncached operand", "[loopback][memory]") {
  test::RemoteBuffer remote(4 * 4096);
  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io, forced());
  REQUIRE(service.describe().requires_local_mr);
  for (unsigned i = 0; i < 4; ++i) {
    auto completion = run_one(
        io, service, remote.request(dma::Direction::ToPeer, test::Payload{test::pattern(4096, i)}, 0, i * 4096));
    REQUIRE(completion.outcome.ok());
  }
  CHECK(service.metrics().registrations == 4);
  CHECK(service.metrics().cache_entries == 0);  // no span, nothing cached
  for (unsigned i = 0; i < 4; ++i) {
    const auto expected = test::pattern(4096, i);
    CHECK(std::equal(expected.begin(), expected.end(), remote.memory().begin() + i * 4096));
  }
}

TEST_CASE("a cacheable span is registered once and serves every operand inside it", "[loopback][memory]") {
  test::RemoteBuffer remote(64 * 1024);
  asio::io_context io;
  dma::asynchronous::FabricService<Slice> service(io, forced());
  std::vector<std::byte> buffer = test::pattern(64 * 1024, 3);
  const auto span = dma::CacheableSpan::make(reinterpret_cast<std::uintptr_t>(buffer.data()), buffer.size());
  for (std::size_t i = 0; i < 16; ++i) {
    auto request =
        remote.request(dma::Direction::ToPeer, Slice{std::span(buffer).subspan(i * 4096, 4096), span}, 0, i * 4096);
    REQUIRE(run_one(io, service, std::move(request)).outcome.ok());
  }
  const auto metrics = service.metrics();
  CHECK(metrics.registrations == 1);
  CHECK(metrics.cache_misses == 1);
  CHECK(metrics.cache_hits == 15);
  CHECK(test::same(remote.memory(), buffer));

  // After invalidate, the next operand registers again.
  dma::invalidate(span->base, span->end);
  auto request = remote.request(dma::Direction::ToPeer, Slice{std::span(buffer).first(4096), span});
  REQUIRE(run_one(io, service, std::move(request)).outcome.ok());
  CHECK(service.metrics().registrations == 2);
}

TEST_CASE("reads into a cacheable span land through the cached registration", "[loopback][memory]") {
  test::RemoteBuffer remote(8 * 4096);
  const auto served = test::pattern(8 * 4096, 11);
  std::copy(served.begin(), served.end(), remote.memory().begin());
  asio::io_context io;
  dma::asynchronous::FabricService<Slice> service(io, forced());
  std::vector<std::byte> landing(8 * 4096);
  const auto span = dma::CacheableSpan::make(reinterpret_cast<std::uintptr_t>(landing.data()), landing.size());
  for (std::size_t i = 0; i < 8; ++i) {
    auto request = remote.request(dma::Direction::FromPeer, Slice{std::span(landing).subspan(i * 4096, 4096), span},
                                  4096, i * 4096);
    REQUIRE(run_one(io, service, std::move(request)).outcome.ok());
  }
  CHECK(service.metrics().registrations == 1);
  CHECK(test::same(landing, served));
}

TEST_CASE("operands inside a registered MemoryRegion need no registration of their own", "[loopback][memory]") {
  test::RemoteBuffer remote(4 * 4096);
  asio::io_context io;
  dma::asynchronous::FabricService<Slice> service(io, forced());
  auto future = service.register_region(test::pattern(4 * 4096, 5), asio::use_future);
  REQUIRE(test::run_until(io, future));
  auto region = future.get();
  REQUIRE(region.length() == 4 * 4096);
  CHECK(service.metrics().registrations == 1);
  for (std::size_t i = 0; i < 4; ++i) {
    auto request =
        remote.request(dma::Direction::ToPeer, Slice{region.bytes().subspan(i * 4096, 4096), {}}, 0, i * 4096);
    REQUIRE(run_one(io, service, std::move(request)).outcome.ok());
  }
  CHECK(service.metrics().registrations == 1);
  CHECK(service.metrics().cache_hits == 4);
  CHECK(test::same(remote.memory(), region.storage()));
}

TEST_CASE("registering nothing fails with zero_length_region", "[loopback][memory]") {
  asio::io_context io;
  dma::asynchronous::FabricService<Slice> service(io, forced());
  auto future = service.register_region(std::vector<std::byte>{}, asio::use_future);
  REQUIRE(test::run_until(io, future));
  try {
    future.get();
    FAIL("registered 0 bytes");
  } catch (const std::system_error& error) {
    CHECK(error.code() == dma::errc::zero_length_region);
  }
}

TEST_CASE("dropping a MemoryRegion while a transfer from it is in flight neither crashes nor closes it early",
          "[loopback][memory]") {
  constexpr std::size_t size = 64 << 20;  // tcp moves this in tens of milliseconds, not in one
  test::RemoteBuffer remote(size);
  asio::io_context io;
  dma::asynchronous::FabricService<Slice> service(io, forced());
  auto registered = service.register_region(test::pattern(size, 8), asio::use_future);
  REQUIRE(test::run_until(io, registered));
  auto region = registered.get();
  const auto expected = region.storage();

  // The context holds only a view, not a copy of the region: the registration must keep it alive.
  auto transfer =
      service.submit(remote.request(dma::Direction::ToPeer, Slice{region.bytes(), {}}), test::completion_future());
  // Run the service just until the write is posted; without the initiator's progress it cannot finish.
  for (int i = 0; i < 5000 && service.metrics().posted < 1; ++i) {
    io.restart();
    io.run_for(std::chrono::milliseconds(1));
  }
  if (transfer.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    FAIL("completed before it was seen posted: " << transfer.get().outcome.message());
  }
  INFO("eagain " << service.metrics().eagain << " failed " << service.metrics().failed << " hits "
                 << service.metrics().cache_hits << " misses " << service.metrics().cache_misses);
  REQUIRE(service.metrics().posted == 1);
  region = {};  // the last copy: retired at once, closed only after the transfer
  CHECK(service.metrics().cache_entries == 0);
  CHECK(transfer.wait_for(std::chrono::seconds(0)) != std::future_status::ready);

  REQUIRE(test::run_until(io, transfer));
  CHECK(transfer.get().outcome.ok());
  CHECK(std::equal(expected.begin(), expected.end(), remote.memory().begin()));
}

TEST_CASE("the callback service registers a region and writes from it", "[loopback][memory][callback]") {
  test::RemoteBuffer remote(4096);
  std::promise<dma::Outcome> done;
  auto service = dma::FabricService<Slice>::start(
      forced(), [&](std::span<dma::Completion<Slice>> batch) { done.set_value(batch[0].outcome); }, nullptr);
  auto region = service->register_region(test::pattern(4096, 2));
  auto request = remote.request(dma::Direction::ToPeer, Slice{region.bytes(), {}});
  request.want_checksum = true;
  REQUIRE_FALSE(service->submit(std::move(request)));
  auto outcome = done.get_future();
  REQUIRE(outcome.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  const auto result = outcome.get();
  REQUIRE(result.ok());
  CHECK(result->checksum == dma::checksum(region.storage()));
  CHECK(test::same(remote.memory(), region.storage()));
  CHECK(service->metrics().registrations == 1);
}
