// Striping over several endpoints (Configuration::endpoints) over tcp on 127.0.0.1: striped
// writes and reads land byte-exact and complete once, small transfers go to one endpoint, and
// peers, warm-ups and cancellation reach every endpoint.
#include "fixture.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>

using dma::Direction;
using Service = dma::asynchronous::FabricService<test::Payload>;

namespace {

dma::Configuration with_endpoints(std::size_t n, std::size_t threshold = 256 * 1024) {
  auto c = test::loopback_configuration();
  c.endpoints = n;
  c.stripe_threshold = threshold;
  return c;
}

}  // namespace

TEST_CASE("striping over 1, 2 and 4 endpoints lands byte-exact, with one completion and the right CRC",
          "[loopback][stripe]") {
  const std::size_t endpoints = GENERATE(std::size_t{1}, std::size_t{2}, std::size_t{4});
  CAPTURE(endpoints);
  constexpr std::size_t size = 16 * test::mib + 1234;  // not a multiple of anything
  test::RemoteBuffer remote(size + 4096);
  asio::io_context io;
  Service service(io, with_endpoints(endpoints));
  REQUIRE(service.endpoints() == endpoints);
  const auto addresses = service.endpoint_addresses();
  CHECK(std::set<std::vector<std::uint8_t>>(addresses.begin(), addresses.end()).size() == endpoints);

  const auto bytes = test::pattern(size, 3);
  auto write = remote.request(Direction::ToPeer, test::Payload{bytes}, 0, 100);
  write.want_checksum = true;
  int calls = 0;
  const auto written = test::await_one(io, service, std::move(write), &calls);
  INFO(written.outcome.message());
  REQUIRE(written.outcome.ok());
  CHECK(written.outcome->bytes == size);
  CHECK(written.outcome->checksum == dma::checksum(bytes));
  CHECK(std::equal(bytes.begin(), bytes.end(), remote.memory().begin() + 100));
  CHECK(remote.memory()[99] == std::byte{0});
  CHECK(remote.memory()[100 + size] == std::byte{0});

  auto read = remote.request(Direction::FromPeer, test::Payload{}, size, 100);
  read.want_checksum = true;
  const auto got = test::await_one(io, service, std::move(read), &calls);
  INFO(got.outcome.message());
  REQUIRE(got.outcome.ok());
  CHECK(got.outcome->checksum == dma::checksum(bytes));
  CHECK(test::same(got.caller_context.bytes, bytes));
  CHECK(calls == 2);

  const dma::Metrics m = service.metrics();
  CHECK(m.completed == 2 * endpoints);  // each part is a transfer of its endpoint
  CHECK(m.failed == 0);
  CHECK(m.posts_in_flight == 0);
  CHECK(service.outstanding() == 0);
}

TEST_CASE("transfers below the stripe threshold go to one endpoint, the least loaded", "[loopback][stripe]") {
  test::RemoteBuffer remote(64 * 1024);
  asio::io_context io;
  Service service(io, with_endpoints(4));
  int done = 0, ok = 0;
  for (int i = 0; i < 64; ++i) {
    service.submit(remote.request(Direction::ToPeer, test::Payload{test::pattern(1024, static_cast<unsigned>(i))}, 0,
                                  static_cast<std::uint64_t>(i) * 1024),
                   [&](std::error_code, dma::Completion<test::Payload> c) {
                     ++done;
                     if (c.outcome.ok()) ++ok;
                   });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (done < 64 && std::chrono::steady_clock::now() < deadline) {
    io.restart();
    io.run_for(std::chrono::milliseconds(10));
  }
  REQUIRE(done == 64);
  CHECK(ok == 64);
  CHECK(service.metrics().completed == 64);  // one part each: none was striped
  for (int i = 0; i < 64; ++i) {
    const auto expected = test::pattern(1024, static_cast<unsigned>(i));
    CHECK(std::equal(expected.begin(), expected.end(), remote.memory().begin() + i * 1024));
  }
}

TEST_CASE("add_peer warms every endpoint; a striped write with immediate data notifies once", "[loopback][stripe]") {
  test::RemoteBuffer remote(4 * test::mib);
  asio::io_context io;
  Service service(io, with_endpoints(3, test::mib));
  auto warmed = service.add_peer(1, remote.advertisement(), asio::use_future);
  REQUIRE(test::run_until(io, warmed));
  REQUIRE_NOTHROW(warmed.get());
  CHECK(service.metrics().completed == 3);  // one warm-up write per endpoint

  auto r = remote.request(Direction::ToPeer, test::Payload{test::pattern(4 * test::mib, 6)});
  r.immediate_data = 77;
  const auto done = test::await_one(io, service, std::move(r));
  REQUIRE(done.outcome.ok());
  std::promise<dma::WriteNotification> promise;
  auto future = promise.get_future();
  remote.target().async_wait_written([&](std::error_code ec, dma::WriteNotification n) {
    REQUIRE_FALSE(ec);
    promise.set_value(n);
  });
  REQUIRE(future.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(future.get().data == 77);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(remote.target().notifications_queued() == 0);

  auto inserted = service.add_peer(
      2, std::vector<std::uint8_t>(remote.advertisement().address.begin(), remote.advertisement().address.end()),
      asio::use_future);
  REQUIRE(test::run_until(io, inserted));
  REQUIRE_NOTHROW(inserted.get());
}

TEST_CASE("a striped write with immediate data notifies only once all its bytes have landed", "[loopback][stripe]") {
  constexpr std::size_t size = 16 * test::mib + 1234;
  constexpr int writes = 50;
  test::RemoteBuffer remote(size);
  asio::io_context io;
  Service service(io, with_endpoints(4));
  // Write w fills the whole buffer with the byte w + 1, so a byte of any earlier write left
  // anywhere when its notification arrives is seen.
  std::atomic<int> notified{0};
  std::atomic<int> early{0};
  remote.target().set_notification_callback([&](std::error_code ec, dma::WriteNotification n) {
    const auto& memory = remote.memory();
    // Every byte equals the first (one overlapping memcmp, fast under the sanitizers too), and
    // the first is this write's.
    const bool landed = memory[0] == static_cast<std::byte>(n.data + 1) &&
                        std::memcmp(memory.data(), memory.data() + 1, memory.size() - 1) == 0;
    if (ec || !landed) early.fetch_add(1);
    notified.fetch_add(1);
  });
  std::vector<std::byte> bytes(size);
  for (int w = 0; w < writes; ++w) {
    CAPTURE(w);
    std::memset(bytes.data(), w + 1, bytes.size());
    auto r = remote.request(Direction::ToPeer, test::Payload{bytes});
    r.immediate_data = static_cast<std::uint64_t>(w);
    const auto done = test::await_one(io, service, std::move(r));
    INFO(done.outcome.message());
    REQUIRE(done.outcome.ok());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (notified.load() < w + 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(notified.load() == w + 1);
  }
  CHECK(early.load() == 0);
  CHECK(remote.target().notifications_lost() == 0);
  CHECK(service.metrics().completed == writes * 5);  // four parts and the notifier each
}

TEST_CASE("a striped write that fails sends no notification", "[loopback][stripe]") {
  test::RemoteBuffer remote(4 * test::mib);
  asio::io_context io;
  Service service(io, with_endpoints(4));
  auto r = remote.request(Direction::ToPeer, test::Payload{test::pattern(4 * test::mib, 1)});
  r.immediate_data = 5;
  r.length = 4 * test::mib;
  r.remote_key += 1;  // every part is refused
  const auto done = test::await_one(io, service, std::move(r));
  REQUIRE_FALSE(done.outcome.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(remote.target().notifications_queued() == 0);
  CHECK(service.metrics().completed + service.metrics().failed == 4);  // the notifier never went out
  CHECK(service.outstanding() == 0);
}

TEST_CASE("a striped transfer to a frozen peer can be cancelled and completes once", "[loopback][stripe]") {
  test::RemoteBuffer remote(16 * test::mib);
  asio::io_context io;
  Service service(io, with_endpoints(2, test::mib));
  auto warmed = service.add_peer(1, remote.advertisement(), asio::use_future);
  REQUIRE(test::run_until(io, warmed));
  const auto [cancelled, calls] = test::cancel_while_frozen(
      io, service, remote, remote.request(Direction::ToPeer, test::Payload{test::pattern(16 * test::mib, 2)}));
  CHECK(cancelled.outcome.error() == asio::error::operation_aborted);
  CHECK(calls == 1);
  CHECK(service.outstanding() == 0);
}

TEST_CASE("endpoints outside 1 to 16 are refused", "[loopback][stripe]") {
  asio::io_context io;
  auto c = test::loopback_configuration();
  c.endpoints = GENERATE(std::size_t{0}, std::size_t{17});
  std::error_code ec;
  Service service(io.get_executor());
  service.open(c, ec);
  CHECK(ec == dma::errc::invalid_configuration);
  CHECK_FALSE(service.is_open());
}

TEST_CASE("the callback service stripes over several endpoints, with the CRC it computes on its pool",
          "[loopback][stripe][callback]") {
  constexpr int total = 8;
  constexpr std::size_t size = test::mib + 4321;
  test::RemoteBuffer remote(total * size);
  std::mutex mutex;
  std::vector<dma::Completion<test::Payload>> done;
  auto pool = std::make_shared<dma::Pool>(2);
  auto service = dma::FabricService<test::Payload>::start(
      with_endpoints(2),
      [&](std::span<dma::Completion<test::Payload>> batch) {
        std::lock_guard lock(mutex);
        for (auto& c : batch)
          done.push_back(std::move(c));
      },
      pool);
  REQUIRE(service->endpoints() == 2);
  const auto addresses = service->endpoint_addresses();
  REQUIRE(addresses.size() == 2);
  CHECK(addresses[0] != addresses[1]);

  std::vector<std::vector<std::byte>> sent;
  for (int i = 0; i < total; ++i) {
    sent.push_back(test::pattern(size, static_cast<unsigned>(i + 7)));
    auto request = remote.request(Direction::ToPeer, test::Payload{sent.back()}, 0, i * size);
    request.want_checksum = true;
    REQUIRE_FALSE(service->submit(std::move(request)));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto count = [&] {
    std::lock_guard lock(mutex);
    return done.size();
  };
  while (count() < total && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const dma::Metrics m = service->metrics();
  service.reset();

  REQUIRE(done.size() == total);
  std::set<std::uint32_t> crcs;
  for (const auto& c : done) {
    INFO(c.outcome.message());
    REQUIRE(c.outcome.ok());
    CHECK(c.outcome->bytes == size);
    REQUIRE(c.outcome->checksum.has_value());
    CHECK(*c.outcome->checksum == dma::checksum(c.caller_context.bytes));
    crcs.insert(*c.outcome->checksum);
  }
  CHECK(crcs.size() == total);
  for (int i = 0; i < total; ++i)
    CHECK(std::equal(sent[i].begin(), sent[i].end(), remote.memory().begin() + i * size));
  CHECK(m.completed == 2 * total);  // each part is a transfer of its endpoint
}
