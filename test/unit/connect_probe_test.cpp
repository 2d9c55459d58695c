// The connect probe against real sockets on 127.0.0.1: a listener, a closed port, no IP address.
#include "connect_probe.hpp"
#include "../catch.hpp"
#include "local_socket.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

using dma::detail::ConnectProbe;
using namespace std::chrono_literals;

namespace {

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
  const test::LocalSocket listener(true);
  CHECK(probe(listener.bytes) == ConnectProbe::Verdict::listening);
}

TEST_CASE("a probe to a port nobody listens on is refused", "[unit][probe]") {
  const test::LocalSocket bound(false);  // holds the port, so no other test takes it, but never listens
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
  const test::LocalSocket listener(true);
  const test::LocalSocket bound(false);
  ConnectProbe probe;
  probe.start(listener.bytes);
  REQUIRE(probe.started());
  probe.start(bound.bytes);  // ignored: one is under way
  probe.reset();
  CHECK_FALSE(probe.started());
  CHECK(probe.finish() == ConnectProbe::Verdict::none);
}

TEST_CASE("peek gives the verdict so far and the probe goes on; finish gives the same and ends it", "[unit][probe]") {
  const test::LocalSocket bound(false);
  ConnectProbe probe;
  probe.start(bound.bytes);
  REQUIRE(probe.started());
  auto verdict = ConnectProbe::Verdict::silent;
  for (int attempt = 0; attempt < 500 && verdict == ConnectProbe::Verdict::silent; ++attempt) {
    verdict = probe.peek();
    if (verdict == ConnectProbe::Verdict::silent) std::this_thread::sleep_for(10ms);
  }
  CHECK(verdict == ConnectProbe::Verdict::refused);
  CHECK(probe.started());
  CHECK(probe.peek() == ConnectProbe::Verdict::refused);  // the socket's error reads once; the answer stays
  CHECK(probe.finish() == ConnectProbe::Verdict::refused);
  CHECK_FALSE(probe.started());
}
