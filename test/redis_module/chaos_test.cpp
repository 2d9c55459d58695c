// The module as an operator runs it, against redis-server 7.0 or Valkey 8.1 (DMA_MODULE_SERVER):
// the server's own signal handling (SIGTERM and SIGINT save and exit 0, a crash reports itself),
// SHUTDOWN with a frozen client's transfer posted, DMA.GET copies bounded by the copy limits and
// maxmemory, a frozen client beside healthy ones, a neighbour naming another client's fabric
// address, and hostile arguments. Exits 77 (skipped) when the server program is missing.
// DMA_CHAOS_REPEAT sets how many SHUTDOWNs the frozen-client case runs (3 unless set).
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "harness.hpp"

#include <filesystem>

using namespace module_test;

namespace {

int repeats() {
  const char* text = std::getenv("DMA_CHAOS_REPEAT");
  const int n = text != nullptr ? std::atoi(text) : 0;
  return n > 0 ? n : 3;
}

std::uint64_t stat_value(Resp& resp, const std::string& field) { return std::stoull(server_info(resp, field)); }

// Sends a DMA.GET on `resp` that the peer (not progressing) leaves in flight, and waits on `admin`
// (the blocked connection answers nothing else) until the module counts it.
void stall_get(Resp& admin, Resp& resp, const Peer& peer, const std::string& key, std::size_t length,
               std::uint64_t in_flight) {
  resp.send_raw(encode(peer.window("DMA.GET", key, length)));
  INFO("waiting for " << in_flight << " DMA.GETs in flight");
  REQUIRE(wait_for(admin, "dma_gets_in_flight", in_flight) == in_flight);
}

}  // namespace

TEST_CASE("SIGTERM and SIGINT save and exit 0 with the module loaded, and a crash reports itself", "[chaos]") {
  for (int signal : {SIGTERM, SIGINT}) {
    ModuleServer server({"--save", "3600 1"});
    Resp resp(server.port());
    require_ok(resp.command({"SET", "k", "written just before"}));
    server.child().signal(signal);
    const int status = server.child().wait(30s);
    const auto log = server.log();
    INFO("signal " << signal << ", server log:\n" << log);
    CHECK(status == 0);
    CHECK(std::filesystem::exists(server.dir() + "/dump.rdb"));
    CHECK(log.find(signal == SIGTERM ? "Received SIGTERM" : "Received SIGINT") != std::string::npos);
    CHECK(log.find("ready to exit") != std::string::npos);
  }
  ModuleServer server;
  Resp resp(server.port());
  resp.send_raw(encode({"DEBUG", "SEGFAULT"}));
  const int status = server.child().wait(60s);
  const auto log = server.log();
  INFO("server log:\n" << log);
  CHECK(status == 128 + SIGSEGV);
  CHECK(log.find("crashed by signal") != std::string::npos);  // the server's own crash report
}

TEST_CASE("SHUTDOWN and SIGTERM with a frozen client's DMA.SET posted exit cleanly", "[chaos][frozen]") {
  const int n = repeats();
  int clean = 0;
  for (int i = 0; i < n; ++i) {
    ModuleServer server;
    Resp admin(server.port());
    Child frozen = victim(server, false);  // 4 MiB DMA.SETs, one after the other
    REQUIRE(wait_for_any(admin, "transfers_ok"));
    REQUIRE(wait_for_any(admin, "dma_sets_in_flight"));
    frozen.signal(SIGSTOP);  // most often in the middle of sending a read's response
    std::this_thread::sleep_for(50ms);
    if (i % 2 == 0) {
      admin.send_raw(encode({"SHUTDOWN", "NOSAVE"}));
    } else {
      server.child().signal(SIGTERM);
    }
    const auto start = std::chrono::steady_clock::now();
    const int status = server.child().wait(60s);
    const auto took = std::chrono::steady_clock::now() - start;
    frozen.kill_now();
    const auto log = server.log();
    INFO("attempt " << i << ": exit " << status << " after "
                    << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms; server log:\n"
                    << log);
    CHECK(status == 0);
    CHECK(log.find("crashed") == std::string::npos);
    CHECK(log.find("ready to exit") != std::string::npos);
    // The progress deadline (1 s) and the close, with room for a loaded machine.
    CHECK(took < 20s);
    if (status == 0) ++clean;
  }
  CHECK(clean == n);
}

TEST_CASE("stalled DMA.GET copies stay under the copy limits and never make the server evict", "[chaos]") {
  constexpr std::size_t value = 8 << 20;
  SECTION("12 stalled DMA.GETs under maxmemory 32mb: one copy, the rest refused") {
    ModuleServer server({"--maxmemory", "32mb", "--maxmemory-policy", "noeviction"});
    Resp admin(server.port());
    require_ok(admin.command({"SET", "big", pattern_text("big", value)}));  // SET: DMA.GET copies it
    CHECK(info_value(admin, "get_copy_limit") == (32u << 20) / 8);
    std::vector<std::unique_ptr<Peer>> peers;
    std::vector<std::unique_ptr<Resp>> clients;
    for (int i = 0; i < 12; ++i) {
      peers.push_back(std::make_unique<Peer>(value, false));
      clients.push_back(std::make_unique<Resp>(server.port()));
      hello(*clients.back(), *peers.back());
    }
    stall_get(admin, *clients[0], *peers[0], "big", value, 1);
    for (int i = 1; i < 12; ++i)
      require_error(clients[i]->command(peers[i]->window("DMA.GET", "big", value)), "get-copy-limit");
    const auto used = stat_value(admin, "used_memory");
    INFO("used_memory " << used);
    CHECK(used <= (32u << 20) + value);
    CHECK(info_value(admin, "get_copies_held_bytes") == value);
    CHECK(info_value(admin, "gets_refused_copy_limit") == 11);
    CHECK(info_value(admin, "dma_gets_in_flight") == 1);
  }
  SECTION("volatile-lru with 40 keys that have a TTL: 8 stalled DMA.GETs evict none") {
    ModuleServer server({"--maxmemory", "32mb", "--maxmemory-policy", "volatile-lru"});
    Resp admin(server.port());
    require_ok(admin.command({"SET", "big", pattern_text("big", value)}));
    const std::string filler(256 << 10, 'x');
    for (int i = 0; i < 40; ++i)
      require_ok(admin.command({"SET", "ttl-" + std::to_string(i), filler, "EX", "3600"}));
    std::vector<std::unique_ptr<Peer>> peers;
    std::vector<std::unique_ptr<Resp>> clients;
    std::uint64_t stalled = 0;
    for (int i = 0; i < 8; ++i) {
      peers.push_back(std::make_unique<Peer>(value, false));
      clients.push_back(std::make_unique<Resp>(server.port()));
      hello(*clients.back(), *peers.back());
      if (stalled == 0) {
        stall_get(admin, *clients.back(), *peers.back(), "big", value, ++stalled);
      } else {
        const auto reply = clients.back()->command(peers.back()->window("DMA.GET", "big", value));
        INFO("reply: " << reply.text);
        CHECK(reply.is_error());
      }
    }
    for (int i = 0; i < 20; ++i)  // commands, each of which would evict if used memory were over
      CHECK(admin.command({"PING"}).text == "PONG");
    INFO("used_memory " << server_info(admin, "used_memory") << " with " << info_value(admin, "get_copies_held_bytes")
                        << " bytes of copies held; refused over the limits "
                        << info_value(admin, "gets_refused_copy_limit") << ", with OOM "
                        << info_value(admin, "gets_refused_oom") << "; server log:\n"
                        << server.log());
    CHECK(stat_value(admin, "evicted_keys") == 0);
    CHECK(admin.command({"DBSIZE"}).integer == 41);
  }
  SECTION("a copy is refused with -OOM while the server is over maxmemory (set at run time)") {
    ModuleServer server({"--maxmemory-policy", "noeviction"});
    Resp admin(server.port());
    require_ok(admin.command({"SET", "big", pattern_text("big", value)}));
    require_ok(admin.command({"SET", "more", pattern_text("more", value)}));
    CHECK(info_value(admin, "get_copy_limit") == std::uint64_t{1} << 30);  // no maxmemory: the fixed limit
    require_ok(admin.command({"CONFIG", "SET", "maxmemory", "12mb"}));     // 16 MiB of values: over it
    CHECK(info_value(admin, "maxmemory") == 12u << 20);
    CHECK(info_value(admin, "get_copy_limit") == (12u << 20) / 8);
    Peer peer(value, false);
    Resp resp(server.port());
    hello(resp, peer);
    const auto reply = resp.command(peer.window("DMA.GET", "big", value));
    INFO("reply: " << reply.text);
    REQUIRE(reply.is_error());
    CHECK(reply.text.rfind("OOM", 0) == 0);
    CHECK(info_value(admin, "gets_refused_oom") == 1);
    CHECK(info_value(admin, "get_copies_held_bytes") == 0);
  }
  SECTION("one client's copies stay under get-copy-client-limit; another client's go on") {
    ModuleServer server(
        {}, {"get-copy-limit", std::to_string(64 << 20), "get-copy-client-limit", std::to_string(value + (1 << 20))});
    Resp admin(server.port());
    require_ok(admin.command({"SET", "big", pattern_text("big", value)}));
    require_ok(admin.command({"SET", "small", pattern_text("small", 2 << 20)}));
    Peer greedy(value, false);
    Peer other(value, false);
    Resp first(server.port());
    Resp second(server.port());  // the same client's second connection: the same fabric address
    Resp third(server.port());
    hello(first, greedy);
    hello(second, greedy);
    hello(third, other);
    stall_get(admin, first, greedy, "big", value, 1);
    require_error(second.command(greedy.window("DMA.GET", "small", 2 << 20)), "get-copy-client-limit");
    stall_get(admin, third, other, "big", value, 2);
    CHECK(info_value(admin, "get_copies_held_bytes") == 2 * value);
  }
}

TEST_CASE("the copies a client's stalled DMA.GETs held are freed when it goes", "[chaos]") {
  constexpr std::size_t value = 8 << 20;
  ModuleServer server;
  Resp admin(server.port());
  require_ok(admin.command({"SET", "big", pattern_text("big", value)}));
  {
    Peer peer(value, false);
    Resp resp(server.port());
    hello(resp, peer);
    stall_get(admin, resp, peer, "big", value, 1);
    CHECK(info_value(admin, "get_copies_held_bytes") == value);
  }  // the connection and the Target close: the write fails, the copy goes
  CHECK(wait_for(admin, "get_copies_held_bytes", 0, 60s) == 0);
  CHECK(wait_for(admin, "dma_gets_in_flight", 0, 60s) == 0);
}

TEST_CASE("a frozen client mid-transfer leaves the other clients' transfers untouched", "[chaos][frozen]") {
  ModuleServer server({}, {"transfer-deadline-ms", "2000"});
  Resp probe(server.port());
  Child others(client(server, bench({"--clients", "4", "--sizes", "4K-1M", "--duration", "4"})));
  Child frozen = victim(server, false);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (info_value(probe, "dma_sets_in_flight") == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(200us);
  frozen.signal(SIGSTOP);
  require_clean_bench(others);
  frozen.signal(SIGCONT);
  frozen.kill_now();
  CHECK(wait_for(probe, "outstanding", 0) == 0);
  CHECK(probe.command({"PING"}).text == "PONG");
}

TEST_CASE("a neighbour naming another client's fabric address fails alone and reads nothing of it", "[chaos]") {
  ModuleServer server;
  Peer owner(4096);
  Resp own(server.port());
  Resp neighbour(server.port());
  hello(own, owner);
  hello(neighbour, owner);  // the same host may name any address of it: the key is the secret
  const auto wrong_key = std::to_string(std::stoull(owner.rkey()) ^ 0x5a5a5a5aULL);
  for (int round = 0; round < 10; ++round) {
    const std::string key = "k" + std::to_string(round);
    const auto bytes = pattern_text(key, 4096);
    std::memcpy(owner.memory().data(), bytes.data(), bytes.size());
    require_ok(own.command(owner.window("DMA.SET", key, 4096)));
    // The neighbour names the owner's address with a key it guessed: its transfers fail.
    auto hostile = owner.window("DMA.GET", key, 4096);
    hostile[2] = wrong_key;
    require_error(neighbour.command(hostile), "transfer failed");
    hostile[0] = "DMA.SET";
    hostile[1] = "stolen";
    require_error(neighbour.command(hostile), "transfer failed");
    std::memset(owner.memory().data(), 0, 4096);
    const auto got = own.command(owner.window("DMA.GET", key, 4096));
    REQUIRE(got.type == dma::kv::resp::Reply::Type::array);
    CHECK(std::memcmp(owner.memory().data(), bytes.data(), 4096) == 0);
  }
  CHECK(own.command({"EXISTS", "stolen"}).integer == 0);
  CHECK(info_value(own, "dma_clients") == 2);
}

TEST_CASE("hostile DMA.* arguments are refused with an error and change nothing", "[chaos]") {
  ModuleServer server;
  Peer peer(4096);
  Resp resp(server.port());
  require_ok(resp.command({"SET", "k", "v"}));
  const std::string long_hex(4096, 'a');
  const std::string binary("\x00\xff\r\n*1\r\n", 8);
  for (const auto& arguments : std::vector<std::vector<std::string>>{
           {"DMA.HELLO"},
           {"DMA.HELLO", long_hex},
           {"DMA.HELLO", binary},
           {"DMA.HELLO", "0200"},
           {"DMA.SET", "k", "1", "2", "3"},  // before DMA.HELLO
       }) {
    INFO("command: " << arguments[0] << " with " << arguments.size() << " arguments");
    CHECK(resp.command(arguments).is_error());
  }
  hello(resp, peer);
  const std::vector<std::vector<std::string>> hostile{
      {"DMA.SET", "k"},
      {"DMA.SET", "k", peer.rkey(), peer.offset(), "16", "1", "extra"},
      {"DMA.SET", "k", "-1", peer.offset(), "16"},
      {"DMA.SET", "k", "18446744073709551616", peer.offset(), "16"},
      {"DMA.SET", "k", peer.rkey(), "18446744073709551615", "16"},
      {"DMA.SET", "k", peer.rkey(), peer.offset(), "0x10"},
      {"DMA.SET", "k", peer.rkey(), peer.offset(), "99999999999999"},
      {"DMA.SET", "k", peer.rkey(), peer.offset(), binary},
      {"DMA.SET", "k", peer.rkey(), peer.offset(), "16", "4294967296"},
      {"DMA.SET", "k", peer.rkey(), peer.offset(), "16", long_hex},
      {"DMA.GET", "k", peer.rkey(), peer.offset(), "1"},  // the value is 1 byte: fits, but then:
      {"DMA.GET", "nosuchkey", peer.rkey(), peer.offset(), "4096"},
      {"DMA.GET", "k", peer.rkey(), peer.offset(), "4096", "4294967296"},
      {"DMA.GET", "k", peer.rkey(), peer.offset(), "4096", binary},
      {"DMA.GET", "k", peer.rkey(), "18446744073709551615", "4096"},
      {"DMA.INFO", "extra"},
  };
  int errors = 0;
  for (const auto& arguments : hostile) {
    const auto reply = resp.command(arguments);
    if (reply.is_error()) ++errors;
    INFO("reply: " << reply.text);
  }
  // Every one but the 1-byte DMA.GET of a 1-byte value (a correct command) is refused.
  CHECK(errors == static_cast<int>(hostile.size()) - 1);
  CHECK(resp.command({"GET", "k"}).text == "v");
  CHECK(resp.command({"DBSIZE"}).integer == 1);
  CHECK(wait_for(resp, "outstanding", 0) == 0);
  CHECK(resp.command({"PING"}).text == "PONG");
}

int main(int argc, char* argv[]) { return run_suite(argc, argv); }
