// A target in a separate process: the one_target example, driven over its stdout.
#include "fixture.hpp"

#include "../../tools/common/child_process.hpp"

#include <cstdlib>
#include <string>

namespace {

using Child = dma::tools::ChildProcess;

std::string one_target() {
  // Meson passes the path; run by hand, the example sits beside the test directory.
  if (const char* path = std::getenv("DMA_ONE_TARGET")) return path;
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string("test/x");
  return dir.substr(0, dir.rfind('/')) + "/../examples/one_target";
}

dma::Advertisement advertisement_of(Child& child) {
  const std::string prefix = "advertisement: ";
  const std::string line = child.line();
  INFO("one_target printed: " << line);
  REQUIRE(line.rfind(prefix, 0) == 0);
  return dma::Advertisement::parse(line.substr(prefix.size()));
}

}  // namespace

TEST_CASE("a write reaches a target in another process, which verifies it", "[loopback][process]") {
  Child target({one_target(), "127.0.0.1"});
  const auto peer = advertisement_of(target);
  CHECK(target.line() == "waiting for a transfer into 4096 bytes...");

  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io, test::loopback_configuration());
  dma::TransferRequest<test::Payload> request;
  request.client_id = 1;
  request.peer_address = peer.address;
  request.remote_key = peer.remote_key;
  request.remote_address = peer.remote_address;
  request.want_checksum = true;
  request.caller_context.bytes.assign(4096, std::byte{0xab});
  auto future = service.submit(std::move(request), test::completion_future());
  REQUIRE(test::run_until(io, future));
  const auto completion = future.get();

  REQUIRE(completion.outcome.ok());
  CHECK(completion.outcome->checksum == dma::checksum(completion.caller_context.bytes));
  const std::string received = target.line();
  CHECK(received.rfind("received 4096 bytes, crc " + std::to_string(*completion.outcome->checksum), 0) == 0);
  CHECK(received.find("payload verified") != std::string::npos);
  CHECK(target.wait() == 0);
}

TEST_CASE("a read returns what a target in another process serves", "[loopback][process]") {
  Child target({one_target(), "--read", "127.0.0.1"});
  const auto peer = advertisement_of(target);
  CHECK(target.line().rfind("serving 4096 bytes of 0xab for a remote read", 0) == 0);

  asio::io_context io;
  dma::asynchronous::FabricService<test::Payload> service(io, test::loopback_configuration());
  dma::TransferRequest<test::Payload> request;
  request.peer_address = peer.address;
  request.remote_key = peer.remote_key;
  request.remote_address = peer.remote_address;
  request.direction = dma::Direction::FromPeer;
  request.length = 4096;
  auto future = service.submit(std::move(request), test::completion_future());
  REQUIRE(test::run_until(io, future));
  const auto completion = future.get();

  REQUIRE(completion.outcome.ok());
  CHECK(completion.caller_context.bytes == std::vector<std::byte>(4096, std::byte{0xab}));
}

TEST_CASE("a killed target fails the transfers that were waiting on it", "[loopback][process]") {
  Child target({one_target(), "127.0.0.1"});
  const auto peer = advertisement_of(target);
  target.kill_now();  // SIGKILL and reap, before any transfer

  asio::io_context io;
  auto configuration = test::loopback_configuration();
  configuration.progress_deadline = std::chrono::milliseconds(300);
  dma::asynchronous::FabricService<test::Payload> service(io, configuration);
  dma::TransferRequest<test::Payload> request;
  request.peer_address = peer.address;
  request.remote_key = peer.remote_key;
  request.caller_context.bytes.assign(4096, std::byte{0xab});
  auto future = service.submit(std::move(request), test::completion_future());
  REQUIRE(test::run_until(io, future));
  const auto completion = future.get();
  INFO(completion.outcome.message());
  CHECK(completion.outcome.error() == dma::condition::peer_unreachable);
}

namespace {

std::string example(const std::string& name) {
  const std::string target = one_target();
  return target.substr(0, target.rfind('/') + 1) + name;
}

// Runs an example against a fresh one_target process and returns both programs' lines.
std::pair<std::vector<std::string>, std::vector<std::string>> run_example(const std::string& name, bool read) {
  std::vector<std::string> target_args = {one_target()};
  if (read) target_args.push_back("--read");
  target_args.push_back("127.0.0.1");
  Child target(target_args);
  const auto peer = advertisement_of(target);
  std::vector<std::string> target_lines = {target.line()};
  Child initiator({example(name), "127.0.0.1", dma::encode_hex(peer.address), std::to_string(peer.remote_key),
                   std::to_string(peer.remote_address)});
  std::vector<std::string> lines;
  for (std::string line = initiator.line(); !line.empty(); line = initiator.line())
    lines.push_back(line);
  CHECK(initiator.wait() == 0);
  if (!read) target_lines.push_back(target.line());
  return {lines, target_lines};
}

}  // namespace

TEST_CASE("one_transfer, registered_arena and read_from_peer print the seed's lines against one_target",
          "[loopback][process][examples]") {
  {
    auto [lines, target] = run_example("one_transfer", false);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0].rfind("local address: 0200", 0) == 0);
    CHECK(lines[1] == "wrote 4096 bytes, crc Some(2486649235)");
    CHECK(target.back() == "received 4096 bytes, crc 2486649235 — payload verified");
  }
  {
    auto [lines, target] = run_example("registered_arena", false);
    REQUIRE(lines.size() == 3);
    CHECK(lines[1] == "registered 262144 bytes");
    CHECK(lines[2] == "wrote 4096 bytes from the arena, crc Some(2486649235)");
    CHECK(target.back() == "received 4096 bytes, crc 2486649235 — payload verified");
  }
  {
    auto [lines, target] = run_example("async_transfer", false);
    REQUIRE(lines.size() == 2);
    CHECK(lines[1] == "wrote 4096 of 4096 bytes, crc Some(2486649235)");
    CHECK(target.back() == "received 4096 bytes, crc 2486649235 — payload verified");
  }
  {
    auto [lines, target] = run_example("read_from_peer", true);
    REQUIRE(lines.size() == 2);
    CHECK(lines[1] == "read 4096 bytes, crc Some(2486649235), payload verified");
    CHECK(target[0] == "serving 4096 bytes of 0xab for a remote read, crc 2486649235 — the initiator verifies");
  }
}
