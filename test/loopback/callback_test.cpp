// The callback FabricService: batches per drain, checksums on the Pool, delivery before destruction.
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>

#include "fixture.hpp"

namespace {

struct Sink {
  std::mutex mutex;
  std::vector<int> seen;
  std::vector<std::size_t> batch_sizes;
  std::set<std::string> threads;
  std::size_t failures = 0;
  std::vector<std::optional<std::uint32_t>> checksums;

  dma::BatchCompleter<test::Payload> completer() {
    return [this](std::span<dma::Completion<test::Payload>> batch) {
      char name[16] = {};
      pthread_getname_np(pthread_self(), name, sizeof name);
      std::lock_guard lock(mutex);
      batch_sizes.push_back(batch.size());
      threads.insert(name);
      for (auto& c : batch) {
        seen.push_back(static_cast<int>(c.caller_context.bytes.size() > 4
                                            ? std::to_integer<int>(c.caller_context.bytes[0]) +
                                                  256 * std::to_integer<int>(c.caller_context.bytes[1])
                                            : -1));
        if (!c.outcome) ++failures;
        checksums.push_back(c.outcome.ok() ? c.outcome->checksum : std::nullopt);
      }
    };
  }
  std::size_t count() {
    std::lock_guard lock(mutex);
    return seen.size();
  }
};

std::vector<std::byte> tagged(int index, std::size_t size) {
  auto bytes = test::pattern(size, static_cast<unsigned>(index));
  bytes[0] = static_cast<std::byte>(index & 0xff);
  bytes[1] = static_cast<std::byte>(index >> 8);
  return bytes;
}

}  // namespace

TEST_CASE("the callback service delivers every completion exactly once, in batches", "[loopback][callback]") {
  constexpr int total = 1000;
  test::RemoteBuffer remote(64 * 256);
  Sink sink;
  auto pool = std::make_shared<dma::Pool>(2);
  auto service = dma::FabricService<test::Payload>::start(test::loopback_configuration(), sink.completer(), pool);
  for (int i = 0; i < total; ++i) {
    auto request = remote.request(dma::Direction::ToPeer, test::Payload{tagged(i, 256)}, 0, (i % 64) * 256);
    REQUIRE_FALSE(service->submit(std::move(request)));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  // A batch counts as delivered once the completer has returned: the sink may hold the last
  // batch a moment before outstanding() drops to 0.
  while ((sink.count() < total || service->outstanding() != 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(service->outstanding() == 0);
  service.reset();

  REQUIRE(sink.seen.size() == total);
  CHECK(std::set<int>(sink.seen.begin(), sink.seen.end()).size() == total);
  CHECK(sink.failures == 0);
  CHECK(sink.batch_sizes.size() < total);  // drains were batched
  REQUIRE(sink.threads.size() == 1);
  CHECK(sink.threads.begin()->rfind("fabric-", 0) == 0);
}

TEST_CASE("checksummed completions are finished on the pool with the CRC of the operand", "[loopback][callback]") {
  test::RemoteBuffer remote(4096);
  Sink sink;
  auto pool = std::make_shared<dma::Pool>(2);
  auto service = dma::FabricService<test::Payload>::start(test::loopback_configuration(), sink.completer(), pool);
  auto bytes = tagged(7, 4096);
  const auto expected = dma::checksum(bytes);
  auto request = remote.request(dma::Direction::ToPeer, test::Payload{bytes});
  request.want_checksum = true;
  REQUIRE_FALSE(service->submit(std::move(request)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sink.count() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  service.reset();

  REQUIRE(sink.checksums.size() == 1);
  CHECK(sink.checksums[0] == expected);
  REQUIRE(sink.threads.size() == 1);
  CHECK(sink.threads.begin()->rfind("f-pool-", 0) == 0);
}

TEST_CASE("destroying the callback service delivers everything before it returns", "[loopback][callback]") {
  test::RemoteBuffer remote(64 * 64);
  Sink sink;
  auto pool = std::make_shared<dma::Pool>(1);
  {
    auto service = dma::FabricService<test::Payload>::start(test::loopback_configuration(), sink.completer(), pool);
    for (int i = 0; i < 300; ++i) {
      auto request = remote.request(dma::Direction::ToPeer, test::Payload{tagged(i, 64)}, 0, (i % 64) * 64);
      request.want_checksum = i % 2 == 0;
      REQUIRE_FALSE(service->submit(std::move(request)));
    }
  }
  CHECK(sink.count() == 300);
  CHECK(std::set<int>(sink.seen.begin(), sink.seen.end()).size() == 300);
}

TEST_CASE("the callback service's add_peer connects, and its warm-up never reaches the completer",
          "[loopback][callback][connect]") {
  test::RemoteBuffer remote(64);
  Sink sink;
  auto service = dma::FabricService<test::Payload>::start(test::loopback_configuration(), sink.completer(), nullptr);
  CHECK_NOTHROW(service->add_peer(1, remote.advertisement()));
  dma::Advertisement wrong = remote.advertisement();
  wrong.remote_key ^= 1;
  std::error_code ec;
  service->add_peer(2, wrong, ec);
  CHECK(ec == dma::errc::connection_lost);
  CHECK_THROWS_AS(service->add_peer(3, wrong), std::system_error);
  CHECK(sink.count() == 0);
}

TEST_CASE("a callback service on a dead peer fails its transfer at the deadline", "[loopback][callback]") {
  Sink sink;
  auto configuration = test::loopback_configuration();
  configuration.progress_deadline = std::chrono::milliseconds(50);
  auto service = dma::FabricService<test::Payload>::start(configuration, sink.completer(), nullptr);
  dma::TransferRequest<test::Payload> request;
  request.peer_address = {2, 0, 0, 1, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  request.caller_context.bytes.assign(64, std::byte{0xab});
  REQUIRE_FALSE(service->submit(std::move(request)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (sink.count() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(sink.count() == 1);
  CHECK(sink.failures == 1);
}

TEST_CASE("a completer that throws is counted and neither kills the fabric thread nor hangs shutdown",
          "[loopback][callback]") {
  test::RemoteBuffer remote(64 * 8);
  std::atomic<int> calls{0};
  auto pool = std::make_shared<dma::Pool>(1);
  auto service = dma::FabricService<test::Payload>::start(
      test::loopback_configuration(),
      [&](std::span<dma::Completion<test::Payload>>) {
        ++calls;
        throw std::runtime_error("completer bug");
      },
      pool);
  for (int i = 0; i < 8; ++i) {
    auto request = remote.request(dma::Direction::ToPeer, test::Payload{tagged(i, 64)}, 0, i * 64);
    request.want_checksum = i % 2 == 1;
    REQUIRE_FALSE(service->submit(std::move(request)));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (service->outstanding() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  CHECK(service->outstanding() == 0);
  CHECK(service->completer_failures() == static_cast<std::uint64_t>(calls.load()));
  const auto start = std::chrono::steady_clock::now();
  service.reset();
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

// Counterparts of the Rust crate's batching tests (should_flush_crc): batches follow CQ drains here.
TEST_CASE("a partial batch is flushed as soon as the drain ends, without waiting to fill", "[loopback][callback]") {
  test::RemoteBuffer remote(64);
  Sink sink;
  auto service = dma::FabricService<test::Payload>::start(test::loopback_configuration(), sink.completer(), nullptr);
  REQUIRE_FALSE(service->submit(remote.request(dma::Direction::ToPeer, test::Payload{tagged(1, 64)})));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (sink.count() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(sink.count() == 1);
  CHECK(sink.batch_sizes == std::vector<std::size_t>{1});
}

TEST_CASE("an empty batch is never delivered", "[loopback][callback]") {
  test::RemoteBuffer remote(64 * 64);
  Sink sink;
  {
    auto pool = std::make_shared<dma::Pool>(2);
    auto service = dma::FabricService<test::Payload>::start(test::loopback_configuration(), sink.completer(), pool);
    for (int i = 0; i < 500; ++i) {
      auto request = remote.request(dma::Direction::ToPeer, test::Payload{tagged(i, 64)}, 0, (i % 64) * 64);
      request.want_checksum = i % 3 == 0;
      REQUIRE_FALSE(service->submit(std::move(request)));
    }
  }
  CHECK(sink.count() == 500);
  CHECK(std::none_of(sink.batch_sizes.begin(), sink.batch_sizes.end(), [](std::size_t n) { return n == 0; }));
}

TEST_CASE("a completer's resubmissions join the reaper pass that delivered their batch", "[loopback][callback]") {
  // Batches are delivered from inside the pass that drained them, so what the completer submits is
  // posted by that same pass: no intake lock, no extra trip through the io_context.
  constexpr int lanes = 16, total = 2000;
  test::RemoteBuffer remote(64 * lanes);
  std::atomic<dma::FabricService<test::Payload>*> service_pointer{nullptr};
  std::atomic<int> submitted{0}, delivered{0}, failures{0};
  auto service = dma::FabricService<test::Payload>::start(
      test::loopback_configuration(),
      [&](std::span<dma::Completion<test::Payload>> batch) {
        for (auto& completion : batch) {
          ++delivered;
          if (!completion.outcome) ++failures;
          if (submitted.fetch_add(1) >= total) continue;
          const auto lane = std::to_integer<int>(completion.caller_context.bytes[0]);
          auto request = remote.request(dma::Direction::ToPeer, std::move(completion.caller_context), 0, lane * 64);
          if (service_pointer.load()->submit(std::move(request))) ++failures;
        }
      },
      nullptr);
  service_pointer = service.get();
  for (int i = 0; i < lanes; ++i) {
    ++submitted;
    REQUIRE_FALSE(service->submit(remote.request(dma::Direction::ToPeer, test::Payload{tagged(i, 64)}, 0, i * 64)));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (delivered.load() < total && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE(delivered.load() == total);  // `total` submissions in all: `lanes` from here, the rest resubmitted
  CHECK(failures.load() == 0);
  CHECK(service->outstanding() == 0);
  const auto metrics = service->metrics();
  CHECK(metrics.posted == static_cast<std::uint64_t>(total));
  CHECK(metrics.joined_pass == static_cast<std::uint64_t>(total - lanes));
}
