// The loopback suite's write and read tests over shm: a service and Targets on one host, in this
// process and in a child process. Exits 77 (skipped) when this machine's libfabric has no usable
// shm provider.
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main()
#include "fixture.hpp"

#include "../../tools/common/child_process.hpp"

#include <asio/steady_timer.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#endif

using dma::Direction;
using Service = dma::asynchronous::FabricService<test::Payload>;

namespace {

dma::Configuration shm_configuration(dma::WaitMode mode = dma::WaitMode::adaptive) {
  dma::Configuration configuration;
  configuration.providers = {dma::Provider::shm};
  configuration.wait_mode = mode;
  return configuration;
}

// The child: one Target over shm with a buffer of `size` bytes filled with a pattern; prints its
// advertisement, then a line with the first bytes of the buffer once its input closes.
int serve(std::size_t size) {
  auto target = dma::TargetThread::start(shm_configuration());
  std::vector<std::byte> memory = test::pattern(size, 9);
  auto region = target->expose(memory);
  std::printf("advertisement: %s\n", region.advertisement().to_string().c_str());
  std::fflush(stdout);
  char line[64];
  (void)std::fgets(line, sizeof line, stdin);  // the parent closes our input when it is done (or dies)
  target->pause();
  const auto written = test::pattern(size, 10);
  std::printf("%s\n", std::equal(written.begin(), written.end(), memory.begin()) ? "written" : "unchanged");
  return 0;
}

bool shm_available() {
  std::error_code ec;
  (void)dma::discover_domains(shm_configuration(), ec);
  if (ec) std::cerr << "shm-tests: no shm provider (" << ec.message() << "): skipped\n";
  return !ec;
}

std::string self_path() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

TEST_CASE("an shm endpoint has no wait fd and polls whatever wait mode is configured", "[shm]") {
  for (const auto mode : {dma::WaitMode::fd, dma::WaitMode::adaptive, dma::WaitMode::busy_poll}) {
    CAPTURE(dma::to_string(mode));
    dma::Endpoint endpoint;
    endpoint.open(shm_configuration(mode));
    CHECK(endpoint.describe().provider == "shm");
    CHECK_FALSE(endpoint.describe().wait_fd);
    CHECK(endpoint.wait_fd() == -1);
  }
}

TEST_CASE("two shm endpoints of one process get names of their own", "[shm]") {
  dma::Endpoint first;
  dma::Endpoint second;
  first.open(shm_configuration());
  second.open(shm_configuration());
  CHECK(first.local_address() != second.local_address());
  CHECK_FALSE(dma::validate_address(first.local_address(), first.addr_format()));
}

// A process killed with SIGKILL leaves its /dev/shm files behind, named after its id at
// libfabric's defaults; a later process given the same id could then not open an endpoint.
TEST_CASE("files a killed process of the same id left in /dev/shm do not block an endpoint", "[shm]") {
  const std::string prefix = std::to_string(::getpid()) + ":" + std::to_string(::getuid()) + ":";
  std::vector<std::string> left;
  for (int index = 0; index < 16; ++index) {
    const std::string name = "/" + prefix + std::to_string(index);
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
    if (fd < 0) continue;  // this process has one of that name already
    REQUIRE(::ftruncate(fd, 4096) == 0);
    ::close(fd);
    left.push_back(name);
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    dma::Endpoint endpoint;
    std::error_code ec;
    endpoint.open(shm_configuration(), ec);
    CHECK_FALSE(ec);
    const std::string address(reinterpret_cast<const char*>(endpoint.local_address().data()));
    CHECK(address.rfind("fi_shm://dma-" + std::to_string(::getpid()) + "-", 0) == 0);
  }
  for (const auto& name : left)
    ::shm_unlink(name.c_str());
}

TEST_CASE("a 4 KiB write over shm lands in the target's buffer", "[shm][write]") {
  for (const auto mode : {dma::WaitMode::fd, dma::WaitMode::adaptive}) {
    CAPTURE(dma::to_string(mode));
    test::RemoteBuffer remote(4096, std::byte{0}, shm_configuration());
    asio::io_context io;
    Service service(io, shm_configuration(mode));
    auto bytes = test::pattern(4096, 1);

    auto completion = test::co_await_one(io, service, remote.request(Direction::ToPeer, test::Payload{bytes}));

    REQUIRE(completion.outcome.ok());
    CHECK(completion.outcome->bytes == 4096);
    CHECK(test::same(completion.caller_context.bytes, bytes));
    CHECK(test::same(remote.memory(), bytes));
  }
}

TEST_CASE("an 8 MiB write over shm lands in the target's buffer", "[shm][write]") {
  test::RemoteBuffer remote(8 << 20, std::byte{0}, shm_configuration());
  asio::io_context io;
  Service service(io, shm_configuration());
  auto bytes = test::pattern(8 << 20, 2);

  auto completion = test::co_await_one(io, service, remote.request(Direction::ToPeer, test::Payload{bytes}));

  REQUIRE(completion.outcome.ok());
  CHECK(completion.outcome->bytes == bytes.size());
  CHECK(test::same(remote.memory(), bytes));
}

TEST_CASE("a write over shm at an offset lands only in its slice", "[shm][write]") {
  test::RemoteBuffer remote(3 * 4096, std::byte{0}, shm_configuration());
  asio::io_context io;
  Service service(io, shm_configuration());
  auto bytes = test::pattern(4096, 3);

  auto completion = test::co_await_one(io, service, remote.request(Direction::ToPeer, test::Payload{bytes}, 0, 4096));

  REQUIRE(completion.outcome.ok());
  CHECK(std::equal(bytes.begin(), bytes.end(), remote.memory().begin() + 4096));
  CHECK(std::all_of(remote.memory().begin(), remote.memory().begin() + 4096,
                    [](std::byte b) { return b == std::byte{0}; }));
  CHECK(std::all_of(remote.memory().begin() + 8192, remote.memory().end(),
                    [](std::byte b) { return b == std::byte{0}; }));
}

TEST_CASE("a read over shm returns the target's bytes", "[shm][read]") {
  test::RemoteBuffer remote(1 << 20, std::byte{0}, shm_configuration());
  const auto served = test::pattern(1 << 20, 4);
  std::copy(served.begin(), served.end(), remote.memory().begin());
  asio::io_context io;
  Service service(io, shm_configuration());

  auto completion = test::co_await_one(io, service, remote.request(Direction::FromPeer, test::Payload{}, 1 << 20));

  REQUIRE(completion.outcome.ok());
  CHECK(completion.outcome->bytes == (1u << 20));
  CHECK(test::same(completion.caller_context.bytes, served));
}

TEST_CASE("a read and a write over shm reach a target in another process", "[shm][process]") {
  const std::size_t size = 64 << 10;
  dma::tools::ChildProcess child({self_path(), "--serve-shm-target", std::to_string(size)});
  const std::string line = child.line();
  INFO("the child printed: " << line);
  const std::string prefix = "advertisement: ";
  REQUIRE(line.rfind(prefix, 0) == 0);
  const auto advertisement = dma::Advertisement::parse(line.substr(prefix.size()));
  asio::io_context io;
  Service service(io, shm_configuration());
  auto request = [&](Direction direction, test::Payload payload) {
    dma::TransferRequest<test::Payload> r;
    r.client_id = 1;
    r.set_peer(advertisement, 0);
    r.direction = direction;
    r.length = size;
    r.caller_context = std::move(payload);
    return r;
  };

  auto read = test::co_await_one(io, service, request(Direction::FromPeer, test::Payload{}));
  auto write = test::co_await_one(io, service, request(Direction::ToPeer, test::Payload{test::pattern(size, 10)}));

  REQUIRE(read.outcome.ok());
  CHECK(test::same(read.caller_context.bytes, test::pattern(size, 9)));
  REQUIRE(write.outcome.ok());
  child.close_input();
  CHECK(child.line() == "written");
}

int main(int argc, char* argv[]) {
  if (argc == 3 && std::strcmp(argv[1], "--serve-shm-target") == 0) return serve(std::stoul(argv[2]));
  if (!shm_available()) return 77;
  return Catch::Session().run(argc, argv);
}
