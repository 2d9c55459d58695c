// Segmented and gathered transfers over tcp on 127.0.0.1: transfers longer than a post may be
// (Configuration::max_segment_bytes), gathers and scatters over several local buffers (beyond
// tcp's iov_limit of 4), several remote segments, and what a failing segment does.
#include "fixture.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>

#include <mutex>

using dma::Direction;

namespace {

dma::Configuration with_segments(std::size_t bytes) {
  auto c = test::loopback_configuration();
  c.max_segment_bytes = bytes;
  return c;
}

/// A context with several local buffers and, optionally, several remote segments.
struct Lists {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<std::span<const std::byte>> views;
  std::vector<std::span<std::byte>> landings;
  std::vector<dma::RemoteSegment> remote;

  Lists() = default;
  explicit Lists(std::vector<std::vector<std::byte>> b) : buffers(std::move(b)) { refresh(); }
  Lists(Lists&& other) noexcept = default;
  Lists& operator=(Lists&& other) noexcept = default;

  // The spans point into `buffers`' heap storage, which a move keeps.
  void refresh() {
    views.assign(buffers.begin(), buffers.end());
    landings.assign(buffers.begin(), buffers.end());
  }
  std::span<const std::span<const std::byte>> sources() const { return views; }
  std::span<const std::span<std::byte>> landing() { return landings; }
  std::optional<std::span<const dma::RemoteSegment>> remote_segments() const {
    if (remote.empty()) return std::nullopt;
    return std::span<const dma::RemoteSegment>(remote);
  }
  std::vector<std::byte> joined() const {
    std::vector<std::byte> all;
    for (const auto& b : buffers)
      all.insert(all.end(), b.begin(), b.end());
    return all;
  }
};

/// A single buffer that may name several remote segments.
struct Split {
  std::vector<std::byte> bytes;
  std::vector<dma::RemoteSegment> remote;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t n) {
    bytes.resize(n);
    return bytes;
  }
  std::span<const dma::RemoteSegment> remote_segments() const { return remote; }
};

std::vector<std::vector<std::byte>> buffers_of(std::size_t count, unsigned seed) {
  std::vector<std::vector<std::byte>> buffers;
  for (std::size_t i = 0; i < count; ++i)
    buffers.push_back(test::pattern(1000 + 337 * i, seed + static_cast<unsigned>(i)));
  return buffers;
}

}  // namespace

TEST_CASE("a 64 MiB write and read in 1 MiB segments land byte-exact, with one completion and the right CRC",
          "[loopback][segments]") {
  constexpr std::size_t size = 64 * test::mib;
  test::RemoteBuffer remote(size);
  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io, with_segments(test::mib));
  const auto bytes = test::pattern(size, 11);
  const std::uint32_t crc = dma::checksum(bytes);

  auto write = remote.request(Direction::ToPeer, test::Payload{bytes});
  write.want_checksum = true;
  int calls = 0;
  const auto written = test::await_one(io, service, std::move(write), &calls);
  INFO(written.outcome.message());
  REQUIRE(written.outcome.ok());
  CHECK(written.outcome->bytes == size);
  CHECK(written.outcome->checksum == crc);
  CHECK(test::same(remote.memory(), bytes));

  auto read = remote.request(Direction::FromPeer, test::Payload{}, size);
  read.want_checksum = true;
  const auto got = test::await_one(io, service, std::move(read), &calls);
  INFO(got.outcome.message());
  REQUIRE(got.outcome.ok());
  CHECK(got.outcome->bytes == size);
  CHECK(got.outcome->checksum == crc);
  CHECK(test::same(got.caller_context.bytes, bytes));

  CHECK(calls == 2);
  const dma::Metrics m = service.metrics();
  CHECK(m.segmented == 2);
  CHECK(m.posted == 2 * 64);
  CHECK(m.completed == 2);
  CHECK(m.failed == 0);
  CHECK(m.latency.count() == 2);
  CHECK(m.posts_in_flight == 0);
}

TEST_CASE("a failing middle segment fails the transfer once, after all its segments came back",
          "[loopback][segments]") {
  test::RemoteBuffer remote(4 * test::mib);
  asio::io_context io;
  dma::asynchronous::FabricService<Split> service(io, with_segments(test::mib));
  const auto& adv = remote.advertisement();
  Split split{test::pattern(3 * test::mib, 4), {}};
  split.remote = {dma::RemoteSegment::of(adv, 0, test::mib), dma::RemoteSegment::of(adv, test::mib, test::mib),
                  dma::RemoteSegment::of(adv, 2 * test::mib, test::mib)};
  split.remote[1].remote_key += 1;  // the peer refuses this one
  auto r = remote.request(Direction::ToPeer, std::move(split));

  int calls = 0;
  std::size_t in_flight = 99;
  const auto failed = test::await_one(io, service, std::move(r), &calls, &in_flight);
  INFO(failed.outcome.message());
  REQUIRE_FALSE(failed.outcome.ok());
  CHECK((failed.outcome.error() == dma::condition::connection_lost ||
         failed.outcome.error() == dma::condition::remote_access_denied));
  CHECK(in_flight == 0);  // every post of it was back before its completion ran

  // Nothing else arrives for it, and the service goes on.
  test::run_for(io, std::chrono::milliseconds(300));
  CHECK(calls == 1);
  CHECK(service.outstanding() == 0);
  const dma::Metrics m = service.metrics();
  CHECK(m.failed == 1);
  CHECK(m.completed == 0);

  Split good{test::pattern(2 * test::mib, 5), {}};
  good.remote = {dma::RemoteSegment::of(adv, 0, test::mib), dma::RemoteSegment::of(adv, 2 * test::mib, test::mib)};
  const auto expected = good.bytes;
  const auto ok = test::await_one(io, service, remote.request(Direction::ToPeer, std::move(good)), &calls);
  INFO(ok.outcome.message());
  REQUIRE(ok.outcome.ok());
  CHECK(std::equal(expected.begin(), expected.begin() + test::mib, remote.memory().begin()));
  CHECK(std::equal(expected.begin() + test::mib, expected.end(), remote.memory().begin() + 2 * test::mib));
}

TEST_CASE("a gather of 1 to 9 buffers lands byte-exact, and a scatter reads it back", "[loopback][segments]") {
  test::RemoteBuffer remote(64 * 1024);
  asio::io_context io;
  const bool forced = GENERATE(false, true);
  auto configuration = test::loopback_configuration();
  configuration.force_local_registration = forced;
  dma::asynchronous::FabricService<Lists> service(io, configuration);
  CAPTURE(forced, service.describe().iov_limit);

  std::size_t registrations = 0;
  for (std::size_t count = 1; count <= 9; ++count) {
    CAPTURE(count);
    // Each gather is longer than the one before, so the byte past it is still the initial 0.
    Lists gather(buffers_of(count, static_cast<unsigned>(count)));
    const auto all = gather.joined();
    auto write = remote.request(Direction::ToPeer, std::move(gather), 0, 100);
    write.want_checksum = true;
    const auto written = test::await_one(io, service, std::move(write));
    INFO(written.outcome.message());
    REQUIRE(written.outcome.ok());
    CHECK(written.outcome->bytes == all.size());
    CHECK(written.outcome->checksum == dma::checksum(all));
    CHECK(std::equal(all.begin(), all.end(), remote.memory().begin() + 100));
    CHECK(remote.memory()[99] == std::byte{0});
    CHECK(remote.memory()[100 + all.size()] == std::byte{0});

    // Scatter it back into buffers of other sizes; the last one is longer than what is left.
    std::vector<std::vector<std::byte>> landing;
    for (std::size_t left = all.size(), i = 0; left > 0; ++i) {
      const std::size_t n = std::min<std::size_t>(left + (left < 1500 ? 64 : 0), 700 + 211 * i);
      landing.emplace_back(n, std::byte{0xee});
      left -= std::min(n, left);
    }
    auto read = remote.request(Direction::FromPeer, Lists(std::move(landing)), all.size(), 100);
    read.want_checksum = true;
    const auto got = test::await_one(io, service, std::move(read));
    INFO(got.outcome.message());
    REQUIRE(got.outcome.ok());
    CHECK(got.outcome->checksum == dma::checksum(all));
    const auto back = got.caller_context.joined();
    REQUIRE(back.size() >= all.size());
    CHECK(std::equal(all.begin(), all.end(), back.begin()));
    CHECK(std::all_of(back.begin() + static_cast<std::ptrdiff_t>(all.size()), back.end(),
                      [](std::byte b) { return b == std::byte{0xee}; }));  // past the length: untouched
    registrations = service.metrics().registrations;
  }
  const dma::Metrics m = service.metrics();
  CHECK(m.failed == 0);
  CHECK(m.segmented == 18);
  CHECK(m.posted > 18);  // 5 to 9 buffers take more than one post at iov_limit 4
  if (forced) {
    CHECK(registrations >= 45);  // a registration per buffer written (1 + ... + 9) at least
  } else {
    CHECK(registrations == 0);
  }
}

TEST_CASE("a gather to several remote segments lands each part in its place", "[loopback][segments]") {
  test::RemoteBuffer remote(64 * 1024);
  asio::io_context io;
  dma::asynchronous::FabricService<Lists> service(io, test::loopback_configuration());
  const auto& adv = remote.advertisement();
  Lists gather(buffers_of(6, 21));
  const auto all = gather.joined();
  // Seven remote pieces, out of order in the peer's buffer, beyond tcp's rma_iov_limit.
  std::vector<std::size_t> offsets{40000, 100, 20000, 9000, 30000, 50000, 60000};
  std::size_t done = 0;
  for (std::size_t i = 0; i < offsets.size(); ++i) {
    const std::size_t n = i + 1 == offsets.size() ? all.size() - done : all.size() / offsets.size();
    gather.remote.push_back(dma::RemoteSegment::of(adv, offsets[i], n));
    done += n;
  }
  const auto pieces = gather.remote;
  const auto written = test::await_one(io, service, remote.request(Direction::ToPeer, std::move(gather)));
  INFO(written.outcome.message());
  REQUIRE(written.outcome.ok());
  done = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    CAPTURE(i);
    CHECK(std::equal(all.begin() + static_cast<std::ptrdiff_t>(done),
                     all.begin() + static_cast<std::ptrdiff_t>(done + pieces[i].length),
                     remote.memory().begin() + static_cast<std::ptrdiff_t>(offsets[i])));
    done += pieces[i].length;
  }
}

TEST_CASE("shapes that cannot be planned fail with a clear error and move nothing", "[loopback][segments]") {
  test::RemoteBuffer remote(4096);
  asio::io_context io;
  dma::asynchronous::FabricService<Split> service(io, test::loopback_configuration());
  const auto& adv = remote.advertisement();

  Split short_remote{test::pattern(1000, 1),
                     {dma::RemoteSegment::of(adv, 0, 600), dma::RemoteSegment::of(adv, 600, 300)}};
  const auto differ = test::await_one(io, service, remote.request(Direction::ToPeer, std::move(short_remote)));
  CHECK(differ.outcome.error() == dma::errc::segment_lengths_differ);
  CHECK(differ.outcome.error() == dma::condition::invalid_operand);
  CHECK(differ.outcome.message().find("1000") != std::string::npos);
  CHECK(differ.outcome.message().find("900") != std::string::npos);

  Split wraps{test::pattern(64, 1), {dma::RemoteSegment{UINT64_MAX - 10, 64, adv.remote_key}}};
  const auto wrapped = test::await_one(io, service, remote.request(Direction::ToPeer, std::move(wraps)));
  CHECK(wrapped.outcome.error() == dma::errc::remote_range_overflows);

  struct NoSegments {
    std::vector<std::byte> bytes = test::pattern(64, 2);
    std::span<const std::byte> source() const { return bytes; }
    std::span<const dma::RemoteSegment> remote_segments() const { return {}; }
  };
  dma::asynchronous::FabricService<NoSegments> none_service(io, test::loopback_configuration());
  const auto none = test::await_one(io, none_service, remote.request(Direction::ToPeer, NoSegments{}));
  CHECK(none.outcome.error() == dma::errc::no_remote_segment);

  CHECK(std::all_of(remote.memory().begin(), remote.memory().end(), [](std::byte b) { return b == std::byte{0}; }));
  CHECK(service.metrics().posted == 0);
  CHECK(none_service.metrics().posted == 0);
}

TEST_CASE("a segmented write with immediate data notifies once, after every segment landed",
          "[loopback][segments][notification]") {
  constexpr std::size_t size = 4 * test::mib;
  test::RemoteBuffer remote(size);
  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io, with_segments(256 * 1024));
  const auto bytes = test::pattern(size, 8);
  auto r = remote.request(Direction::ToPeer, test::Payload{bytes});
  r.immediate_data = 0x5e9;
  const auto done = test::await_one(io, service, std::move(r));
  INFO(done.outcome.message());
  REQUIRE(done.outcome.ok());

  std::promise<dma::WriteNotification> promise;
  auto future = promise.get_future();
  std::vector<std::byte> seen;
  remote.target().async_wait_written([&](std::error_code ec, dma::WriteNotification n) {
    REQUIRE_FALSE(ec);
    seen = remote.memory();  // what had landed when the notification came
    promise.set_value(n);
  });
  REQUIRE(future.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(future.get().data == 0x5e9);
  CHECK(test::same(seen, bytes));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(remote.target().notifications_queued() == 0);  // one notification, not one per segment
}

TEST_CASE("a segmented write to a frozen peer fails once at its deadline", "[loopback][segments][faults]") {
  test::RemoteBuffer remote(16 * test::mib);
  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io, with_segments(test::mib));
  // Connect first, so the freeze catches posts in flight rather than a connection forming.
  REQUIRE(test::await_one(io, service, remote.request(Direction::ToPeer, test::Payload{test::pattern(64, 1)}))
              .outcome.ok());
  remote.pause();
  auto r = remote.request(Direction::ToPeer, test::Payload{test::pattern(16 * test::mib, 2)});
  r.deadline = std::chrono::milliseconds(300);
  int calls = 0;
  std::size_t in_flight = 99;
  const auto start = std::chrono::steady_clock::now();
  const auto failed = test::await_one(io, service, std::move(r), &calls, &in_flight);
  INFO(failed.outcome.message());
  CHECK(failed.outcome.error() == dma::errc::timed_out);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(250));
  CHECK(in_flight == 0);
  remote.resume();
  test::run_for(io, std::chrono::milliseconds(200));
  CHECK(calls == 1);
  CHECK(service.outstanding() == 0);
}

TEST_CASE("a segmented transfer can be cancelled, queued or posted", "[loopback][segments]") {
  test::RemoteBuffer remote(16 * test::mib);
  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io, with_segments(test::mib));
  REQUIRE(test::await_one(io, service, remote.request(Direction::ToPeer, test::Payload{test::pattern(64, 1)}))
              .outcome.ok());
  const auto [cancelled, calls] = test::cancel_while_frozen(
      io, service, remote, remote.request(Direction::ToPeer, test::Payload{test::pattern(16 * test::mib, 3)}));
  CHECK(cancelled.outcome.error() == asio::error::operation_aborted);
  CHECK(calls == 1);
  CHECK(service.outstanding() == 0);
}

TEST_CASE("a segment window outside 1 to 16 is refused", "[loopback][segments]") {
  asio::io_context io;
  auto c = test::loopback_configuration();
  c.segment_window = GENERATE(std::size_t{0}, std::size_t{17});
  std::error_code ec;
  try {
    dma::asynchronous::FabricService<test::Payload> service(io, c);
  } catch (const std::system_error& e) {
    ec = e.code();
    CHECK(std::string(e.what()).find("segment_window") != std::string::npos);
  }
  CHECK(ec == dma::errc::invalid_configuration);
}

TEST_CASE("the callback layer checksums a gather and a long transfer", "[loopback][segments][callback]") {
  test::RemoteBuffer remote(8 * test::mib);
  std::mutex mutex;
  std::vector<dma::Completion<Lists>> done;
  auto pool = std::make_shared<dma::Pool>(1);
  auto service = dma::FabricService<Lists>::start(
      with_segments(test::mib),
      [&](std::span<dma::Completion<Lists>> batch) {
        std::lock_guard lock(mutex);
        for (auto& c : batch)
          done.push_back(std::move(c));
      },
      pool);
  Lists gather(buffers_of(7, 3));
  gather.buffers.push_back(test::pattern(3 * test::mib, 7));  // longer than a segment too
  gather.refresh();
  const auto all = gather.joined();
  auto r = remote.request(Direction::ToPeer, std::move(gather));
  r.want_checksum = true;
  REQUIRE_FALSE(service->submit(std::move(r)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    {
      std::lock_guard lock(mutex);
      if (!done.empty()) break;
    }
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::lock_guard lock(mutex);
  REQUIRE(done.size() == 1);
  const auto& outcome = done[0].outcome;
  INFO(outcome.message());
  REQUIRE(outcome.ok());
  CHECK(outcome->checksum == dma::checksum(all));
  CHECK(std::equal(all.begin(), all.end(), remote.memory().begin()));
}
