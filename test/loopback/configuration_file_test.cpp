// A service and a Target opened from the shipped config/tcp.toml move bytes over 127.0.0.1.
#include "../source_root.hpp"
#include "fixture.hpp"

#include <asio/use_awaitable.hpp>

using Service = dma::asynchronous::FabricService<test::Payload>;

TEST_CASE("a service opened from config/tcp.toml writes into a target opened from it", "[loopback][configuration]") {
  const auto configuration = dma::Configuration::from_toml(test::source_root() + "/config/tcp.toml");
  test::RemoteBuffer remote(4096, std::byte{0}, configuration);
  asio::io_context io;
  Service service(io, configuration);
  CHECK(service.describe().credits <= 64);
  const auto bytes = test::pattern(4096, 3);

  auto future = asio::co_spawn(
      io,
      [&]() -> asio::awaitable<dma::Completion<test::Payload>> {
        auto request = remote.request(dma::Direction::ToPeer, test::Payload{bytes});  // named: see getting-started
        auto [ec, completion] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));
        co_return std::move(completion);
      },
      asio::use_future);
  REQUIRE(test::run_until(io, future));
  const auto completion = future.get();

  REQUIRE(completion.outcome.ok());
  CHECK(completion.outcome->bytes == 4096);
  CHECK(test::same(remote.memory(), bytes));
}
