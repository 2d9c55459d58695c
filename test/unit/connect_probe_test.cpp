// The connect probe against real sockets on 127.0.0.1: a listener, a closed port, no IP address.
#include "connect_probe.hpp"
#include "../catch.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

using dma::detail::ConnectProbe;
using namespace std::chrono_literals;

namespace {

// A TCP socket bound to 127.0.0.1 on a port of the kernel's choice, listening or not.
struct Socket {
  explicit Socket(bool listening) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    if (listening) REQUIRE(::listen(fd, 4) == 0);
    bytes.resize(sizeof address);
    std::memcpy(bytes.data(), &address, sizeof address);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { ::close(fd); }
  int fd = -1;
  std::vector<std::uint8_t> bytes;  ///< the sockaddr_in, as tcp's fi_getname gives it
};

// Probes until the verdict is no longer `silent` (the connect is still under way), at most 5 s.
ConnectProbe::Verdict probe(const std::vector<std::uint8_t>& address) {
  ConnectProbe probe;
  auto verdict = ConnectProbe::Verdict::silent;
  for (int attempt = 0; attempt < 500 && verdict == ConnectProbe::Verdict::silent; ++attempt) {
    probe.start(address);
    if (!probe.started()) return probe.finish();
    std::this_thread::sleep_for(10ms);
    verdict = probe.finish();
    CHECK_FALSE(probe.started());
  }
  return verdict;
}

}  // namespace

TEST_CASE("a probe to a listening address finds it listening", "[unit][probe]") {
  const Socket listener(true);
  CHECK(probe(listener.bytes) == ConnectProbe::Verdict::listening);
}

TEST_CASE("a probe to a port nobody listens on is refused", "[unit][probe]") {
  const Socket bound(false);  // holds the port, so no other test takes it, but never listens
  CHECK(probe(bound.bytes) == ConnectProbe::Verdict::refused);
}

TEST_CASE("a probe to something that is not an IP address does not run", "[unit][probe]") {
  ConnectProbe probe;
  const std::array<std::uint8_t, 5> odd{1, 2, 3, 4, 5};
  probe.start(odd);
  CHECK_FALSE(probe.started());
  CHECK(probe.finish() == ConnectProbe::Verdict::none);
  std::vector<std::uint8_t> wrong_family(sizeof(sockaddr_in), 0);  // AF_UNSPEC, of sockaddr_in's size
  probe.start(wrong_family);
  CHECK_FALSE(probe.started());
}

TEST_CASE("a probe started twice keeps the first; reset ends it", "[unit][probe]") {
  const Socket listener(true);
  const Socket bound(false);
  ConnectProbe probe;
  probe.start(listener.bytes);
  REQUIRE(probe.started());
  probe.start(bound.bytes);  // ignored: one is under way
  probe.reset();
  CHECK_FALSE(probe.started());
  CHECK(probe.finish() == ConnectProbe::Verdict::none);
}
