// A link cut between two network namespaces this test creates (a veth pair, addresses only
// inside them): posted transfers fail at their deadline, and once the link heals the same peer is
// written to again without remove_peer. Exits 77 (skipped) without the rights to make namespaces.
// The test's own thread moves into the initiator's namespace, so it is an executable of its own.
#define CATCH_CONFIG_RUNNER
#include "../catch.hpp"
#include "../child_process.hpp"
#include "run_until.hpp"

#include <dma/dma.hpp>

#include <asio/io_context.hpp>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

using test::run_until;

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string suffix() { return std::to_string(getpid() % 100000); }
const std::string ns_target = "dma-t" + suffix();
const std::string ns_initiator = "dma-i" + suffix();
const std::string link_target = "dmt" + suffix();
const std::string link_initiator = "dmi" + suffix();
const std::string target_ip = "10.231.7.1";
const std::string initiator_ip = "10.231.7.2";

// Runs a command by PID and waits for it; true when it exited 0.
bool run(std::vector<std::string> args) {
  test::Child child(std::move(args));
  return child.wait(10s) == 0;
}

/// The two namespaces and the veth between them, removed again on destruction.
struct Namespaces {
  bool ok = false;
  Namespaces() {
    ok = run({"ip", "netns", "add", ns_target}) && run({"ip", "netns", "add", ns_initiator}) &&
         run({"ip", "link", "add", link_target, "netns", ns_target, "type", "veth", "peer", "name", link_initiator,
              "netns", ns_initiator}) &&
         run({"ip", "-n", ns_target, "addr", "add", target_ip + "/30", "dev", link_target}) &&
         run({"ip", "-n", ns_initiator, "addr", "add", initiator_ip + "/30", "dev", link_initiator}) &&
         run({"ip", "-n", ns_target, "link", "set", link_target, "up"}) &&
         run({"ip", "-n", ns_initiator, "link", "set", link_initiator, "up"}) &&
         run({"ip", "-n", ns_target, "link", "set", "lo", "up"}) &&
         run({"ip", "-n", ns_initiator, "link", "set", "lo", "up"});
  }
  ~Namespaces() {
    run({"ip", "netns", "del", ns_target});
    run({"ip", "netns", "del", ns_initiator});
  }
};

struct Payload {
  std::vector<std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
};

}  // namespace

TEST_CASE("a cut link fails posted transfers at their deadline, and the healed link carries them again",
          "[faults][netns]") {
  Namespaces namespaces;
  REQUIRE(namespaces.ok);
  test::Child target({"ip", "netns", "exec", ns_target, test::sibling_program("DMA_FAULT_TARGET", "fault-target"),
                      "--bind", target_ip, "--size", std::to_string(1 << 20)});
  const std::string line = target.line();
  INFO("fault-target printed: " << line);
  REQUIRE(line.rfind("advertisement: ", 0) == 0);
  const auto ad = dma::Advertisement::parse(line.substr(15));

  // From here on this thread, and every socket libfabric opens on it, is in the initiator's namespace.
  const std::string path = "/var/run/netns/" + ns_initiator;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(setns(fd, CLONE_NEWNET) == 0);
  close(fd);

  dma::Configuration configuration;
  configuration.bind = initiator_ip;
  configuration.transfer_deadline = 3s;
  configuration.unreachable_backoff = 500ms;
  configuration.unreachable_backoff_max = 4s;
  asio::io_context io;
  dma::asynchronous::FabricService<Payload> service(io, configuration);
  std::map<int, std::vector<dma::Outcome>> outcomes;
  auto submit = [&](int id, std::size_t size) {
    dma::TransferRequest<Payload> request;
    request.client_id = 1;
    request.set_peer(ad);
    request.caller_context.bytes.assign(size, std::byte{0x5a});
    service.submit(std::move(request),
                   [&, id](std::error_code, dma::Completion<Payload> c) { outcomes[id].push_back(c.outcome); });
  };

  submit(0, 4096);
  REQUIRE(run_until(
      io, [&] { return outcomes.count(0) != 0; }, 10s));
  INFO(outcomes[0].front().message());
  REQUIRE(outcomes[0].front().ok());

  REQUIRE(run({"ip", "-n", ns_target, "link", "set", link_target, "down"}));
  const auto cut = Clock::now();
  constexpr int posted = 64;
  for (int id = 1; id <= posted; ++id)
    submit(id, 256 * 1024);
  REQUIRE(run_until(
      io, [&] { return outcomes.size() == 1 + posted; }, 10s));
  CHECK(Clock::now() - cut < configuration.transfer_deadline + 2s);
  int timed_out = 0;
  for (int id = 1; id <= posted; ++id) {
    CHECK(outcomes[id].size() == 1);
    timed_out += outcomes[id].front().error() == std::errc::timed_out ? 1 : 0;
  }
  CHECK(timed_out == posted);

  REQUIRE(run({"ip", "-n", ns_target, "link", "set", link_target, "up"}));
  const auto healed = Clock::now();
  int id = 1000;
  bool landed = false;
  while (!landed && Clock::now() - healed < 60s) {
    submit(id, 4096);
    REQUIRE(run_until(
        io, [&] { return outcomes.count(id) != 0; }, 20s));
    landed = outcomes[id].front().ok();
    ++id;
    if (!landed) std::this_thread::sleep_for(200ms);
  }
  INFO("healed after " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - healed).count()
                       << " ms, " << (id - 1000) << " attempts");
  CHECK(landed);
  CHECK(service.outstanding() == 0);
  target.kill_now();
}

int main(int argc, char** argv) {
  if (geteuid() != 0 || !run({"ip", "netns", "list"})) {
    std::fprintf(stderr, "skipped: creating network namespaces needs root and iproute2\n");
    return 77;
  }
  {
    const std::string probe = "dma-p" + suffix();
    if (!run({"ip", "netns", "add", probe})) {
      std::fprintf(stderr, "skipped: ip netns add failed (no CAP_SYS_ADMIN?)\n");
      return 77;
    }
    run({"ip", "netns", "del", probe});
  }
  return Catch::Session().run(argc, argv);
}
