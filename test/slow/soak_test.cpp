// Soak: many transfers from several threads on a multi-threaded io_context. Proves every transfer
// completes exactly once and none waits for the backstop timer (no lost fd wake-ups).
// The fixture first: it includes <dma/config.hpp>, which sets up the standard library before Asio
// reads its configuration (docs/design.md, "What the library exports").
#include "../loopback/fixture.hpp"

#include <asio/thread_pool.hpp>

#include <atomic>

namespace {

void soak(dma::WaitMode mode) {
  constexpr int total = 30000;
  constexpr std::size_t slot = 4096;
  test::RemoteBuffer remote(slot * 64);
  asio::thread_pool pool(4);
  auto configuration = test::loopback_configuration();
  configuration.wait_mode = mode;
  dma::asynchronous::FabricService<test::Payload> service(pool.get_executor(), configuration);

  std::atomic<int> ok{0}, failed{0}, in_flight{0};
  std::vector<std::atomic<int>> seen(total);
  std::vector<std::thread> submitters;
  for (int t = 0; t < 3; ++t) {
    submitters.emplace_back([&, t] {
      for (int i = t; i < total; i += 3) {
        // Keep a bounded window per submitter, with a bounded wait.
        for (int spins = 0; in_flight.load() > 256 && spins < 200000; ++spins)
          std::this_thread::yield();
        const std::size_t size = std::size_t{64} << (i % 7);  // 64 B .. 4 KiB
        in_flight.fetch_add(1);
        service.submit(
            remote.request(dma::Direction::ToPeer, test::Payload{test::pattern(size, i)}, 0, (i % 64) * slot),
            [&, i](std::error_code, dma::Completion<test::Payload> c) {
              seen[static_cast<std::size_t>(i)].fetch_add(1);
              (c.outcome ? ok : failed).fetch_add(1);
              in_flight.fetch_sub(1);
            });
      }
    });
  }
  for (auto& s : submitters)
    s.join();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (ok + failed < total && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto metrics = service.metrics();
  service.close();
  pool.join();

  INFO("fd wake-ups " << metrics.fd_wakeups << ", spin hits " << metrics.spin_hits << ", armed late "
                      << metrics.armed_late << ", backstop hits " << metrics.backstop_hits);
  CHECK(ok == total);
  CHECK(failed == 0);
  CHECK(std::all_of(seen.begin(), seen.end(), [](const std::atomic<int>& n) { return n.load() == 1; }));
  CHECK(metrics.backstop_hits == 0);
  CHECK(metrics.context_less_errors == 0);
}

}  // namespace

TEST_CASE("a soak with the fd wait mode loses no wake-up and completes everything once", "[slow][soak]") {
  soak(dma::WaitMode::fd);
}

TEST_CASE("a soak with the adaptive wait mode loses no wake-up and completes everything once", "[slow][soak]") {
  soak(dma::WaitMode::adaptive);
}
