// Asio's completion tokens mean what Asio says with submit(): its signature starts with
// std::error_code, so redirect_error, use_future, as_tuple, the awaitable operators and
// parallel_group treat a failed transfer as a failure. Against live Targets over tcp.
#include "fixture.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/experimental/parallel_group.hpp>
#include <asio/redirect_error.hpp>
#include <asio/strand.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <future>
#include <tuple>
#include <type_traits>
#include <variant>

namespace {

using Service = dma::asynchronous::FabricService<test::Payload>;

// A write the peer's Target refuses: a key it never issued. The connection breaks under it.
dma::TransferRequest<test::Payload> refused_write(const test::RemoteBuffer& remote) {
  auto request = remote.request(dma::Direction::ToPeer, test::Payload{test::pattern(4096, 1)});
  request.remote_key ^= 0x5a5a5a5a;
  return request;
}

// A read that carries immediate data: refused at acceptance, before anything is sent.
dma::TransferRequest<test::Payload> refused_read(const test::RemoteBuffer& remote) {
  auto request = remote.request(dma::Direction::FromPeer, test::Payload{}, 4096);
  request.immediate_data = 7;
  return request;
}

dma::TransferRequest<test::Payload> good_write(const test::RemoteBuffer& remote, std::uint64_t client_id) {
  auto request = remote.request(dma::Direction::ToPeer, test::Payload{test::pattern(4096, 2)});
  request.client_id = client_id;
  return request;
}

template <typename T>
T run_coroutine(asio::io_context& io, asio::awaitable<T> coroutine) {
  auto future = asio::co_spawn(io, std::move(coroutine), asio::use_future);
  REQUIRE(test::run_until(io, future, std::chrono::seconds(60)));
  return future.get();
}

}  // namespace

TEST_CASE("redirect_error sets ec when a transfer fails, and the context comes back", "[loopback][asio]") {
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  Service service(io, test::loopback_configuration());
  auto [ec, completion] =
      run_coroutine(io, [&]() -> asio::awaitable<std::tuple<std::error_code, dma::Completion<test::Payload>>> {
        std::error_code error;
        auto done = co_await service.submit(refused_write(remote), asio::redirect_error(asio::use_awaitable, error));
        co_return std::make_tuple(error, std::move(done));
      }());
  CHECK(ec);
  CHECK(ec == completion.outcome.error());
  CHECK(completion.caller_context.bytes.size() == 4096);  // handed back on failure too
}

// Asio 1.22's any_io_executor::target<T>() does not check T: the service must not take a strand or
// a thread pool's executor for an io_context's.
TEST_CASE("a service on a strand, or on a thread pool's executor, transfers", "[loopback][asio]") {
  test::RemoteBuffer remote(4096);
  SECTION("a strand of an io_context, in an any_io_executor") {
    asio::io_context io;
    Service service(asio::any_io_executor(asio::make_strand(io)), test::loopback_configuration());
    auto done = service.submit(good_write(remote, 1), asio::use_future);
    REQUIRE(test::run_until(io, done, std::chrono::seconds(60)));
    CHECK(done.get().outcome.ok());
  }
  SECTION("a thread pool's executor") {
    asio::thread_pool pool(1);
    {
      Service service(asio::any_io_executor(pool.get_executor()), test::loopback_configuration());
      auto done = service.submit(good_write(remote, 2), asio::use_future);
      REQUIRE(done.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
      const auto completion = done.get();
      CHECK(completion.outcome.ok());
      CHECK(completion.outcome->bytes == 4096);
    }
    pool.join();
  }
}

TEST_CASE("as_tuple gives (ec, completion)", "[loopback][asio]") {
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  Service service(io, test::loopback_configuration());
  auto [ec, completion] =
      run_coroutine(io, [&]() -> asio::awaitable<std::tuple<std::error_code, dma::Completion<test::Payload>>> {
        auto result = co_await service.submit(good_write(remote, 1), dma::compat::as_tuple(asio::use_awaitable));
        static_assert(std::tuple_size_v<decltype(result)> == 2);
        co_return result;
      }());
  CHECK_FALSE(ec);
  CHECK(completion.outcome.ok());
  CHECK(completion.outcome->bytes == 4096);
}

TEST_CASE("use_future throws std::system_error when a transfer fails", "[loopback][asio]") {
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  Service service(io, test::loopback_configuration());
  auto refused = service.submit(refused_read(remote), asio::use_future);
  REQUIRE(test::run_until(io, refused));
  try {
    refused.get();
    FAIL("a refused transfer's future returned a value");
  } catch (const std::system_error& e) {
    CHECK(e.code() == dma::errc::immediate_data_on_read);
  }
  auto good = service.submit(good_write(remote, 1), asio::use_future);
  REQUIRE(test::run_until(io, good));
  CHECK(good.get().outcome.ok());
}

TEST_CASE("submit(bad) || submit(good) returns the good one", "[loopback][asio]") {
  using namespace asio::experimental::awaitable_operators;
  asio::io_context io;
  test::RemoteBuffer refusing(4096);
  test::RemoteBuffer remote(4096);
  Service service(io, test::loopback_configuration());
  auto refused = refused_write(refusing);
  refused.client_id = 1;
  auto result = run_coroutine(
      io, [&]() -> asio::awaitable<std::variant<dma::Completion<test::Payload>, dma::Completion<test::Payload>>> {
        co_return co_await (service.submit(std::move(refused)) || service.submit(good_write(remote, 2)));
      }());
  REQUIRE(result.index() == 1);
  CHECK(std::get<1>(result).outcome.ok());
  CHECK(test::same(remote.memory(), test::pattern(4096, 2)));
}

TEST_CASE("parallel_group's wait_for_one_error cancels the sibling of a failed transfer", "[loopback][asio]") {
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  test::RemoteBuffer frozen(4096);
  Service service(io, test::loopback_configuration());
  frozen.pause();  // a write to it stays in flight until it is cancelled
  auto group = asio::experimental::make_parallel_group(service.submit(refused_read(remote), dma::compat::deferred),
                                                       service.submit(good_write(frozen, 2), dma::compat::deferred));
  auto future = group.async_wait(
      asio::experimental::wait_for_one_error(),
      asio::use_future([](std::array<std::size_t, 2> order, std::error_code ec1, dma::Completion<test::Payload>,
                          std::error_code ec2, dma::Completion<test::Payload> sibling) {
        return std::make_tuple(order, ec1, ec2, sibling.outcome.error());
      }));
  REQUIRE(test::run_until(io, future, std::chrono::seconds(60)));
  auto [order, ec1, ec2, sibling_error] = future.get();
  frozen.resume();
  CHECK(order[0] == 0);
  CHECK(ec1 == dma::errc::immediate_data_on_read);
  CHECK(ec2 == asio::error::operation_aborted);
  CHECK(sibling_error == asio::error::operation_aborted);
}

TEST_CASE("as_default_on_t changes submit's default token", "[loopback][asio]") {
  using TupleService = dma::compat::as_tuple_t<asio::use_awaitable_t<>>::as_default_on_t<Service>;
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  TupleService service(io.get_executor(), test::loopback_configuration());
  auto [ec, completion] =
      run_coroutine(io, [&]() -> asio::awaitable<std::tuple<std::error_code, dma::Completion<test::Payload>>> {
        auto result = co_await service.submit(good_write(remote, 1));  // no token: the tuple default
        static_assert(std::is_same_v<decltype(result), std::tuple<std::error_code, dma::Completion<test::Payload>>>);
        co_return result;
      }());
  CHECK_FALSE(ec);
  CHECK(completion.outcome.ok());

  // A service converts to one with another default, as Asio's as_default_on does.
  auto awaiting = asio::use_awaitable_t<>::as_default_on(std::move(service));
  CHECK(awaiting.is_open());
  CHECK_FALSE(service.is_open());
}

TEST_CASE("a coroutine on io_context::executor_type awaits submit, add_peer and async_wait_written",
          "[loopback][asio]") {
  using Executor = asio::io_context::executor_type;
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  dma::asynchronous::FabricService<test::Payload, Executor> service(io.get_executor(), test::loopback_configuration());
  auto future = asio::co_spawn(
      io,
      [&]() -> asio::awaitable<std::size_t, Executor> {
        co_await service.add_peer(1, remote.advertisement());
        auto done = co_await service.submit(good_write(remote, 1));
        co_return done.outcome->bytes;
      },
      asio::use_future);
  REQUIRE(test::run_until(io, future, std::chrono::seconds(60)));
  CHECK(future.get() == 4096);
}

TEST_CASE("a Target's async_wait_written defaults to use_awaitable", "[loopback][asio]") {
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  Service service(io, test::loopback_configuration());
  auto request = good_write(remote, 1);
  request.immediate_data = 42;
  auto written = service.submit(std::move(request), asio::use_future);
  REQUIRE(test::run_until(io, written));
  CHECK(written.get().outcome.ok());
  asio::io_context waiter;
  auto notification = asio::co_spawn(
      waiter,
      [&]() -> asio::awaitable<std::uint64_t> { co_return (co_await remote.target().async_wait_written()).data; },
      asio::use_future);
  REQUIRE(test::run_until(waiter, notification));
  CHECK(notification.get() == 42);
}

TEST_CASE("total cancellation ends a queued transfer and leaves a posted one alone", "[loopback][asio][cancel]") {
  asio::io_context io;
  test::RemoteBuffer remote(4096);
  auto configuration = test::loopback_configuration();
  configuration.max_in_flight = 1;  // the second transfer waits for the first's credit
  Service service(io, configuration);
  auto warmed = service.add_peer(1, remote.advertisement(), asio::use_future);
  REQUIRE(test::run_until(io, warmed));
  warmed.get();
  remote.pause();
  asio::cancellation_signal posted_signal, queued_signal;
  std::optional<std::error_code> posted, queued;
  service.submit(good_write(remote, 1),
                 asio::bind_cancellation_slot(posted_signal.slot(), [&](std::error_code ec, auto) { posted = ec; }));
  service.submit(good_write(remote, 1),
                 asio::bind_cancellation_slot(queued_signal.slot(), [&](std::error_code ec, auto) { queued = ec; }));
  // Bounded: until the first is posted (the second then waits for its credit).
  for (int i = 0; i < 2000 && service.metrics().posts_in_flight == 0; ++i)
    test::run_for(io, std::chrono::milliseconds(10));
  REQUIRE(service.metrics().posts_in_flight == 1);
  queued_signal.emit(asio::cancellation_type::total);
  posted_signal.emit(asio::cancellation_type::total);
  for (int i = 0; i < 2000 && !queued; ++i)
    test::run_for(io, std::chrono::milliseconds(10));
  REQUIRE(queued);
  CHECK(*queued == asio::error::operation_aborted);
  test::run_for(io, std::chrono::milliseconds(100));
  CHECK_FALSE(posted);  // total cannot be honoured once posted: it goes on
  remote.resume();
  for (int i = 0; i < 2000 && !posted; ++i)
    test::run_for(io, std::chrono::milliseconds(10));
  REQUIRE(posted);
  CHECK_FALSE(*posted);
}
