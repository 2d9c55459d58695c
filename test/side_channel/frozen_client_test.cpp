// A frozen client (SIGSTOP) costs its own transfer a deadline error and nothing else: the server
// runs with a 2 s transfer deadline, whose expiry compares equal to std::errc::timed_out.
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "process.hpp"

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#endif

using namespace side_channel_test;

TEST_CASE("a frozen client's transfer fails with a deadline error and the others keep going",
          "[side_channel][frozen]") {
  Server server({"--transfer-deadline", "2000"});
  Child frozen({client_program(), "--port", server.port_text(), "bench", "--clients", "1", "--sizes", "4M", "--ratio",
                "1:1", "--duration", "30", "--keys", "1", "--arms", "dma", "--key-prefix", "frozen"});
  // Its connection is up first: a client frozen before that is refused (progress_deadline), not
  // timed out.
  const auto connected = std::chrono::steady_clock::now() + 10s;
  while (info_number(server.port(), "transfers_ok") < 2 && std::chrono::steady_clock::now() < connected) {
    std::this_thread::sleep_for(5ms);
  }
  REQUIRE(info_number(server.port(), "transfers_ok") >= 2);
  // Alone on the server, an outstanding transfer is the frozen client's own. Stopped between two
  // transfers, it holds none: let it go on and stop it again (a bounded number of times).
  bool caught = false;
  for (int attempt = 0; attempt < 200 && !caught; ++attempt) {
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (info_number(server.port(), "outstanding") == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    frozen.signal(SIGSTOP);
    std::this_thread::sleep_for(50ms);
    caught = info_number(server.port(), "outstanding") != 0;
    if (!caught) frozen.signal(SIGCONT);
  }
  REQUIRE(caught);
  Child others({client_program(), "--port", server.port_text(), "bench", "--clients", "8", "--sizes", "4K-1M",
                "--duration", "6", "--arms", "dma", "--json"});
  const auto json = others.rest(60s);
  INFO("bench printed: " << json);
  CHECK(others.wait(10s) == 0);
  CHECK(json_number(json, "dma", "errors") == 0);
  CHECK(json_number(json, "dma", "mismatches") == 0);
  CHECK(wait_for_info(server.port(), "transfers_timed_out", 1, 10s) == 1);
  CHECK(wait_for_info(server.port(), "outstanding", 0) == 0);
  frozen.signal(SIGCONT);
  frozen.kill_now();
  CHECK(wait_for_info(server.port(), "dma_clients", 0) == 0);
}

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
