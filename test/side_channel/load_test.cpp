// dma-kv-server under load: many clients verifying every byte, clients killed in the middle of
// transfers, and the three-way bench.
#include "../sanitizer.hpp"
#include "process.hpp"

using namespace side_channel_test;

namespace {

using test::address_sanitizer;

std::vector<std::string> bench(const Server& server, std::vector<std::string> options) {
  std::vector<std::string> all{client_program(), "--port", server.port_text(), "bench"};
  all.insert(all.end(), options.begin(), options.end());
  return all;
}

// A client that keeps moving 4 MiB values: after its first SET only DMA.GETs, or only DMA.SETs.
Child victim(const Server& server, bool gets) {
  return Child(bench(server, {"--clients", "1", "--sizes", "4M", "--ratio", gets ? "1:0" : "0:1", "--duration", "30",
                              "--keys", "1", "--arms", "dma", "--key-prefix", gets ? "victim-get" : "victim-set"}));
}

// One cycle: a getting and a setting client connect, and each is killed by SIGKILL once the
// server has one of its transfers in flight (the getter first: its own first SET precedes its
// GETs). Returns how many of the two were caught in flight within the bound.
int kill_during_transfers(const Server& server) {
  Child getter = victim(server, true);
  Child setter = victim(server, false);
  Resp probe(server.port());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  int caught = 0;
  bool getter_alive = true;
  while (std::chrono::steady_clock::now() < deadline) {
    if (getter_alive && info_value(probe, "dma_gets_in_flight") > 0) {
      getter.kill_now();
      getter_alive = false;
      ++caught;
    }
    if (!getter_alive && info_value(probe, "dma_sets_in_flight") > 0) {
      setter.kill_now();
      return caught + 1;
    }
    std::this_thread::sleep_for(200us);
  }
  return caught;
}

}  // namespace

TEST_CASE("64 clients x 200 operations of 1 B to 1 MiB read back every byte they wrote", "[side_channel][load]") {
  Server server({"--threads", "2"});  // connections on strands of a two-thread io_context
  Child load(bench(server, {"--clients", "64", "--ops", "200", "--sizes", "1-1M", "--ratio", "1:1", "--keys", "4",
                            "--arms", "dma", "--json"}));
  const auto json = load.rest(120s);
  INFO("bench printed: " << json);
  CHECK(load.wait(10s) == 0);
  CHECK(json_number(json, "dma", "ops") == 64 * 200);
  CHECK(json_number(json, "dma", "gets") > 0);
  CHECK(json_number(json, "dma", "errors") == 0);
  CHECK(json_number(json, "dma", "mismatches") == 0);
  CHECK(info_number(server.port(), "transfers_failed") == 0);
  CHECK(wait_for_info(server.port(), "outstanding", 0) == 0);
  CHECK(wait_for_info(server.port(), "dma_clients", 0) == 0);
}

TEST_CASE("clients killed in the middle of DMA.GET and DMA.SET cost the others nothing", "[side_channel][kill]") {
  Server server;
  Child others(bench(server, {"--clients", "8", "--sizes", "4K-1M", "--duration", "4", "--arms", "dma", "--json"}));
  std::this_thread::sleep_for(300ms);
  CHECK(kill_during_transfers(server) == 2);
  const auto json = others.rest(60s);
  INFO("bench printed: " << json);
  CHECK(others.wait(10s) == 0);
  CHECK(json_number(json, "dma", "errors") == 0);
  CHECK(json_number(json, "dma", "mismatches") == 0);
  CHECK(json_number(json, "dma", "ops") > 0);
  CHECK(wait_for_info(server.port(), "outstanding", 0) == 0);
  CHECK(wait_for_info(server.port(), "dma_clients", 0) == 0);
}

TEST_CASE("50 connect and kill cycles leave the server's fds and memory as they were", "[side_channel][kill]") {
  Server server;
  // The warm-up brings the allocator's arenas to the size these kills keep them at; its largest
  // reading is the baseline, since one reading alone swings by a few value buffers.
  std::size_t rss = 0;
  for (int round = 0; round < 5; ++round) {
    kill_during_transfers(server);
    rss = std::max(rss, rss_kib(server.pid()));
  }
  REQUIRE(wait_for_info(server.port(), "dma_clients", 0) == 0);
  REQUIRE(wait_for_info(server.port(), "outstanding", 0) == 0);
  // Closed connections (the probes' too) leave the server a moment later: take the settled count.
  std::size_t fds = fd_count(server.pid());
  for (int i = 0; i < 25; ++i) {
    std::this_thread::sleep_for(20ms);
    fds = std::min(fds, fd_count(server.pid()));
  }
  rss = std::max(rss, rss_kib(server.pid()));
  const auto fds_before = fd_targets(server.pid());
  int caught = 0;
  std::size_t rss_after = 0;  // the largest reading over the last five rounds
  for (int round = 0; round < 25; ++round) {
    caught += kill_during_transfers(server);  // 50 clients
    if (round >= 20) rss_after = std::max(rss_after, rss_kib(server.pid()));
  }
  CHECK(caught >= 40);  // the rest were killed between transfers, which must leave nothing behind too
  CHECK(wait_for_info(server.port(), "dma_clients", 0) == 0);
  CHECK(wait_for_info(server.port(), "outstanding", 0) == 0);
  CHECK(wait_for_info(server.port(), "connected_clients", 1) == 1);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (fd_count(server.pid()) > fds && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  const auto fds_after = fd_targets(server.pid());
  INFO("fds before:\n" << fds_before << "fds after:\n" << fds_after);
  // Now and then (about one run in eight) the tcp provider keeps one fabric connection to a killed
  // client in CLOSE_WAIT after remove_peer: a gap below the example, reported rather than failed,
  // as long as it stays that rare. Every other fd must be back where it was.
  std::size_t close_wait = 0;
  for (std::size_t at = 0; (at = fds_after.find(" state 08", at)) != std::string::npos; ++at)
    ++close_wait;
  if (close_wait > 0) WARN(close_wait << " fabric connection(s) to killed clients left in CLOSE_WAIT");
  CHECK(close_wait <= 2);
  CHECK(fd_count(server.pid()) <= fds + close_wait);
  rss_after = std::max(rss_after, rss_kib(server.pid()));
  INFO("RSS " << rss << " KiB at most in the warm-up, " << rss_after << " KiB at most at the end");
  // The size swings by a few 4 MiB value buffers from one moment to the next (16-36 MB over 50
  // kills, with no trend; libfabric 2.1 swings widest), so the largest readings of the two ends
  // are compared, with eight value buffers and a fifth of the baseline allowed on top. A leaked
  // value buffer per kill would add 200 MB. ASan's quarantine keeps freed memory.
  constexpr std::size_t value_buffers_kib = 8 * 4096;
  if (!address_sanitizer) CHECK(rss_after <= rss + rss / 5 + value_buffers_kib);
  CHECK(info_number(server.port(), "transfers_failed") > 0);
}

TEST_CASE("bench reports the side channel, inline RESP and redis-server side by side", "[side_channel][bench]") {
  if (!on_path("redis-server")) FAIL("redis-server not found: apt-get install redis-server (./run deps does)");
  Server server;
  Child run(bench(server, {"--clients", "4", "--sizes", "1M", "--duration", "1", "--json"}));
  const auto json = run.rest(60s);
  INFO("bench printed: " << json);
  CHECK(run.wait(20s) == 0);
  for (const char* arm : {"dma", "inline", "redis"}) {
    INFO("arm " << arm);
    CHECK(json_number(json, arm, "ops") > 0);
    CHECK(json_number(json, arm, "errors") == 0);
    CHECK(json_number(json, arm, "mismatches") == 0);
    CHECK(json_number(json, arm, "gb_per_s") > 0);
  }
}
