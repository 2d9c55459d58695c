// An idle service with a connected peer costs (almost) nothing: its io_context thread's CPU time
// over 5 s of idleness stays under 1% of a core.
// The fixture first: it includes <dma/config.hpp>, which sets up the standard library before Asio
// reads its configuration (docs/design.md, "What the library exports").
#include "../loopback/fixture.hpp"

#include <time.h>

#include <asio/use_future.hpp>

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

}  // namespace

TEST_CASE("an idle service with a connected peer uses under 1% of a core", "[slow][idle]") {
  const auto mode = GENERATE(dma::WaitMode::fd, dma::WaitMode::adaptive, dma::WaitMode::busy_poll);
  INFO("wait mode " << dma::to_string(mode));
  test::RemoteBuffer remote(4096);
  asio::io_context io(1);
  auto configuration = test::loopback_configuration();
  configuration.wait_mode = mode;
  dma::asynchronous::FabricService<test::Payload> service(io, configuration);

  auto first = service.submit(remote.request(dma::Direction::ToPeer, test::Payload{test::pattern(4096, 1)}),
                              test::completion_future());
  REQUIRE(test::run_until(io, first));
  REQUIRE(first.get().outcome.ok());  // the peer is connected

  // The io_context runs on its own thread for the idle period, which measures its own CPU time.
  auto work = asio::make_work_guard(io);
  io.restart();
  std::promise<double> used;
  std::thread runner([&] {
    const double start = thread_cpu_seconds();
    io.run_for(std::chrono::seconds(5));
    used.set_value(thread_cpu_seconds() - start);
  });
  runner.join();
  const double seconds = used.get_future().get();
  INFO("CPU seconds over 5 s idle: " << seconds);
  CHECK(seconds < 0.05);
  CHECK(service.outstanding() == 0);
}
