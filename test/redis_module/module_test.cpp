// dma-module.so inside a real server: redis-server 7.0 (Debian's), or the program named by
// DMA_MODULE_SERVER (CI points it at a Valkey 8.1 built from ../shared/valkey/). Each test starts
// its own server on a free loopback port with --loadmodule and stops it by its PID. Exits 77
// (skipped) when the server program is missing.
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "../source_root.hpp"
#include "harness.hpp"

using namespace module_test;

TEST_CASE("values of 1 B to 4 MiB stored by DMA.SET read back byte-exact by DMA.GET and by GET", "[module]") {
  ModuleServer server;
  Resp resp(server.port());
  for (const std::size_t size : {1ul, 44ul, 45ul, 4096ul, 65536ul, 1ul << 20, 4ul << 20}) {
    const std::string key = "value-" + std::to_string(size);
    INFO("size " << size);
    run_client(server, {"set", key, "--size", std::to_string(size)});
    const auto out = run_client(server, {"get", key});
    CHECK(out.find("the bytes are the pattern") != std::string::npos);
    const auto reply = resp.command({"GET", key});
    REQUIRE(reply.type == dma::kv::resp::Reply::Type::bulk);
    CHECK(reply.text == pattern_text(key, size));
  }
  CHECK(info_value(resp, "transfers_failed") == 0);
  CHECK(info_value(resp, "crc_mismatches") == 0);
}

TEST_CASE("redis-cli GET reads a DMA.SET value and DMA.GET reads a value from SET", "[module]") {
  ModuleServer server;
  const Scratch folder;
  const std::string path = folder.path() + "/value";
  const std::string text = "a value that arrived by RMA\nwith two lines";
  std::ofstream(path, std::ios::binary) << text;
  run_client(server, {"set", "from-rma", "--file", path});
  Child cli({"redis-cli", "-p", server.port_text(), "GET", "from-rma"});
  CHECK(cli.rest(30s) == text + "\n");
  CHECK(cli.wait(30s) == 0);

  Resp resp(server.port());
  const std::string inline_value = pattern_text("from-set", 300000);
  require_ok(resp.command({"SET", "from-set", inline_value}));
  run_client(server, {"get", "from-set", "--out", path});
  std::ifstream in(path, std::ios::binary);
  const std::string landed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(landed == inline_value);
}

TEST_CASE("APPEND, SETRANGE and DEL during an in-flight DMA.GET leave the client the old value", "[module]") {
  ModuleServer server;
  Peer peer(1 << 20, false);
  Resp getter(server.port());
  Resp other(server.port());
  const std::string old_value = pattern_text("changing", 1 << 20);
  bool held = false;
  SECTION("a value SET stored: the write goes from a copy") {
    require_ok(other.command({"SET", "changing", old_value}));
  }
  SECTION("a value DMA.SET stored: the write goes from the stored string itself, where the server keeps it") {
    run_client(server, {"set", "changing", "--size", std::to_string(1 << 20)});
    held = server_keeps_module_strings(other);
    CHECK(info_value(other, "held_values") == (held ? 1 : 0));
  }
  hello(getter, peer);
  getter.send_raw(encode(peer.window("DMA.GET", "changing", 1 << 20)));
  REQUIRE(wait_for(other, "dma_gets_in_flight", 1) == 1);

  CHECK(other.command({"APPEND", "changing", "tail"}).integer == (1 << 20) + 4);
  CHECK(other.command({"SETRANGE", "changing", "0", "XXXX"}).integer == (1 << 20) + 4);
  CHECK(other.command({"GET", "changing"}).text.substr(0, 4) == "XXXX");
  CHECK(other.command({"DEL", "changing"}).integer == 1);
  CHECK(info_value(other, "dma_gets_in_flight") == 1);  // all three ran while the write was in flight

  peer.resume();
  const auto reply = getter.reply();
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(reply.elements.size() == 2);
  CHECK(reply.elements[0].integer == 1 << 20);
  const auto landed = peer.memory().first(1 << 20);
  CHECK(std::memcmp(landed.data(), old_value.data(), old_value.size()) == 0);
  CHECK(static_cast<std::uint32_t>(reply.elements[1].integer) == dma::checksum(landed));
  CHECK(info_value(other, "gets_from_held") == (held ? 1 : 0));
  CHECK(info_value(other, "get_copies") == (held ? 0 : 1));
  CHECK(info_value(other, "held_values") == 0);  // APPEND let it go
}

TEST_CASE("a held value goes when its key changes, is emptied, or the server may evict", "[module]") {
  constexpr std::size_t size = 64 << 10;
  Peer peer(size);
  std::memcpy(peer.memory().data(), pattern_text("h", size).data(), size);
  auto check_get = [&](Resp& resp, const std::string& key) {
    const auto reply = resp.command(peer.window("DMA.GET", key, size));
    REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
    CHECK(reply.elements[0].integer == static_cast<long long>(size));
    CHECK(static_cast<std::uint32_t>(reply.elements[1].integer) == dma::checksum(peer.memory().first(size)));
  };
  SECTION("changes and flushes") {
    ModuleServer server;
    Resp resp(server.port());
    hello(resp, peer);
    if (!server_keeps_module_strings(resp)) {
      WARN("the server stores a copy of what the module sets: the module holds nothing");
      return;
    }
    auto set = [&](const std::string& key) { require_ok(resp.command(peer.window("DMA.SET", key, size))); };
    set("a");
    set("b");
    set("c");
    set("d");
    CHECK(info_value(resp, "held_values") == 4);
    CHECK(info_value(resp, "held_bytes") == 4 * size);
    check_get(resp, "a");
    CHECK(info_value(resp, "gets_from_held") == 1);
    // A TTL leaves the value as it was; a DMA.SET of the same key replaces what is held.
    CHECK(resp.command({"EXPIRE", "a", "1000"}).integer == 1);
    set("a");
    check_get(resp, "a");
    CHECK(info_value(resp, "gets_from_held") == 2);
    CHECK(info_value(resp, "held_values") == 4);
    CHECK(resp.command({"DEL", "a"}).integer == 1);
    require_ok(resp.command({"SET", "b", "small"}));
    require_ok(resp.command({"RENAME", "c", "c2"}));
    CHECK(info_value(resp, "held_values") == 1);
    check_get(resp, "c2");  // the same bytes, from a copy
    CHECK(info_value(resp, "gets_from_held") == 2);
    CHECK(info_value(resp, "get_copies") == 1);
    require_ok(resp.command({"SWAPDB", "0", "1"}));
    require_ok(resp.command({"SELECT", "1"}));
    check_get(resp, "d");
    CHECK(info_value(resp, "gets_from_held") == 3);
    // The flush frees both values left (c2 and the held d), not only the one held by the key.
    const auto before = std::stoull(server_info(resp, "used_memory"));
    require_ok(resp.command({"FLUSHALL", "SYNC"}));
    CHECK(info_value(resp, "held_values") == 0);
    CHECK(info_value(resp, "held_bytes") == 0);
    const auto after = std::stoull(server_info(resp, "used_memory"));
    INFO("used_memory " << before << " before FLUSHALL, " << after << " after");
    CHECK(after + 2 * size <= before);
  }
  SECTION("an eviction policy, or hold-values no: nothing is held") {
    for (const bool evicting : {true, false}) {
      INFO((evicting ? "maxmemory-policy allkeys-lru" : "hold-values no"));
      using Arguments = std::vector<std::string>;
      const Arguments lru{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"};
      ModuleServer server(evicting ? lru : Arguments{}, evicting ? Arguments{} : Arguments{"hold-values", "no"});
      Resp resp(server.port());
      hello(resp, peer);
      require_ok(resp.command(peer.window("DMA.SET", "a", size)));
      CHECK(info_value(resp, "held_values") == 0);
      check_get(resp, "a");
      CHECK(info_value(resp, "get_copies") == 1);
    }
  }
  SECTION("an eviction policy set at run time lets go of what is held") {
    ModuleServer server;
    Resp resp(server.port());
    hello(resp, peer);
    require_ok(resp.command(peer.window("DMA.SET", "a", size)));
    require_ok(resp.command({"CONFIG", "SET", "maxmemory", "100mb"}));
    require_ok(resp.command({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"}));
    check_get(resp, "a");
    CHECK(info_value(resp, "get_copies") == 1);
    CHECK(info_value(resp, "held_values") == 0);
  }
}

// Waits (bounded, 20 s) until a DMA.INFO number reaches `least`; returns the last reading.
std::uint64_t wait_for_at_least(Resp& resp, const std::string& field, std::uint64_t least) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  std::uint64_t seen = info_value(resp, field);
  while (seen < least && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
    seen = info_value(resp, field);
  }
  return seen;
}

TEST_CASE("values are allocated and freed off the main thread, and DMA.INFO counts the main thread's time",
          "[module]") {
  constexpr std::size_t size = 256 << 10;
  ModuleServer server;
  Resp resp(server.port());
  Peer peer(size);
  std::memcpy(peer.memory().data(), pattern_text("m", size).data(), size);
  hello(resp, peer);
  const bool keeps = server_keeps_module_strings(resp);
  const auto memory_before = std::stoull(server_info(resp, "used_memory"));
  for (const char* key : {"a", "b", "c", "a", "b"})
    require_ok(resp.command(peer.window("DMA.SET", key, size)));
  CHECK(info_value(resp, "set_calls") == 5);
  CHECK(info_value(resp, "set_alloc_bytes") == 5 * size);
  CHECK(std::stoull(server_info(resp, "used_memory")) >= memory_before + 3 * size);
  // Two values overwritten; on a server that stores a copy, also each DMA.SET's own string.
  const std::uint64_t freed = keeps ? 2 : 5;
  CHECK(wait_for_at_least(resp, "frees_off_main", freed) == freed);

  // A DMA.GET of a value SET stored writes from a copy, whose buffer the next such DMA.GET reuses.
  require_ok(resp.command({"SET", "inline", pattern_text("inline", size)}));
  for (int i = 0; i < 2; ++i) {
    const auto reply = resp.command(peer.window("DMA.GET", "inline", size));
    REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
    CHECK(std::string(reinterpret_cast<const char*>(peer.memory().data()), size) == pattern_text("inline", size));
  }
  CHECK(info_value(resp, "get_copies") == 2);
  CHECK(info_value(resp, "get_copy_buffers_reused") == 1);
  CHECK(wait_for_at_least(resp, "get_copy_buffers_kept_bytes", size) == size);
  CHECK(info_value(resp, "get_calls") == 2);
  CHECK(info_value(resp, "main_thread_us") >= info_value(resp, "set_command_us") + info_value(resp, "set_reply_us"));

  // Deleted, the values' memory goes back (freed by the value workers, so shortly after).
  CHECK(resp.command({"DEL", "a", "b", "c", "inline"}).integer == 4);
  const auto until = std::chrono::steady_clock::now() + 20s;
  auto memory = std::stoull(server_info(resp, "used_memory"));
  while (memory > memory_before + size && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
    memory = std::stoull(server_info(resp, "used_memory"));
  }
  INFO("used_memory " << memory_before << " before, " << memory << " after DEL");
  CHECK(memory <= memory_before + size);
}

TEST_CASE("DMA.HELLO binds one fabric address of the client's own host per connection", "[module]") {
  ModuleServer server;
  Peer peer(4096);
  Resp resp(server.port());
  require_error(resp.command(peer.window("DMA.SET", "k", 16)), "DMA.HELLO first");
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(4000);
  REQUIRE(inet_pton(AF_INET, "10.1.2.3", &in.sin_addr) == 1);
  std::vector<std::uint8_t> other_host(sizeof in);
  std::memcpy(other_host.data(), &in, sizeof in);
  require_error(resp.command({"DMA.HELLO", dma::encode_hex(other_host)}), "invalid fabric address");
  require_error(resp.command({"DMA.HELLO", "zz"}), "not hex");
  const auto id = resp.command({"CLIENT", "ID"}).integer;
  const auto reply = resp.command({"DMA.HELLO", peer.address_hex()});
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(reply.elements.size() == 5);
  CHECK(reply.elements[1].integer == id);
  CHECK(reply.elements[2].integer == 16 << 20);
  CHECK(reply.elements[3].text == "reply");    // tcp confirms delivery
  CHECK(reply.elements[4].text.size() == 32);  // the client's token
  require_error(resp.command({"DMA.HELLO", peer.address_hex()}), "already sent");
  CHECK(info_value(resp, "hellos_rejected") == 2);
  CHECK(info_value(resp, "dma_clients") == 1);
}

namespace {

// A data command that names its client.
std::vector<std::string> naming(std::vector<std::string> arguments, const std::string& token) {
  arguments.emplace_back("CLIENT");
  arguments.push_back(token);
  return arguments;
}

std::string hello_token(Resp& resp, const Peer& peer) {
  const auto reply = resp.command({"DMA.HELLO", peer.address_hex()});
  INFO("DMA.HELLO replied " << reply.text);
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(reply.elements.size() == 5);
  return std::string(reply.elements[4].text);
}

}  // namespace

TEST_CASE("a client's other connections name it with CLIENT <token>; a client the server cannot place gets -NOHELLO",
          "[module][hello]") {
  constexpr std::size_t size = 4096;
  ModuleServer server;
  Peer peer(size);
  const std::string value = pattern_text("pooled", size);
  std::memcpy(peer.memory().data(), value.data(), size);
  Resp first(server.port());
  const std::string token = hello_token(first, peer);
  Resp second(server.port());
  require_error(second.command(peer.window("DMA.SET", "pooled", size)), "NOHELLO");
  require_error(second.command(naming(peer.window("DMA.SET", "pooled", size), std::string(32, '0'))), "NOHELLO");
  require_error(second.command(naming(peer.window("DMA.SET", "pooled", size), token + "0")), "NOHELLO");
  require_error(second.command({"DMA.SET", "pooled", "1", "0", "16", "CLIENT"}), "CLIENT needs the token");
  require_error(second.command({"DMA.SET", "pooled", "1", "0", "16", "1", "2"}), "expected CLIENT");
  CHECK(info_value(second, "no_hello") == 3);
  require_ok(second.command(naming(peer.window("DMA.SET", "pooled", size), token)));
  std::memset(peer.memory().data(), 0, size);
  const auto got = second.command(naming(peer.window("DMA.GET", "pooled", size), token));
  REQUIRE(got.type == dma::kv::resp::Reply::Type::array);
  CHECK(std::memcmp(peer.memory().data(), value.data(), size) == 0);
  // The connection that sent the HELLO still works without naming anything.
  require_ok(first.command(peer.window("DMA.SET", "pooled", size)));

  // Named by another connection, the binding outlives the connection that made it.
  first.close();
  CHECK(wait_for(second, "dma_clients", 0) == 0);
  CHECK(info_value(second, "hello_bindings") == 1);
  require_ok(second.command(naming(peer.window("DMA.SET", "pooled", size), token)));
  CHECK(second.command({"GET", "pooled"}).text == value);
}

TEST_CASE("a binding no other connection named goes with its connection; a named one after hello-idle-seconds",
          "[module][hello]") {
  ModuleServer server({}, {"hello-idle-seconds", "1"});
  Peer peer(4096);
  Resp admin(server.port());
  {
    Resp alone(server.port());
    hello(alone, peer);
    CHECK(info_value(admin, "hello_bindings") == 1);
  }
  CHECK(wait_for(admin, "hello_bindings", 0) == 0);

  Resp sender(server.port());
  const std::string token = hello_token(sender, peer);
  Resp user(server.port());
  require_ok(user.command(naming(peer.window("DMA.SET", "k", 16), token)));
  sender.close();
  CHECK(wait_for(admin, "dma_clients", 0) == 0);
  CHECK(info_value(admin, "hello_bindings") == 1);
  CHECK(wait_for(admin, "hello_bindings", 0) == 0);  // a second unused, then the next cron sweep
  CHECK(info_value(admin, "hello_bindings_dropped") == 1);
  require_error(user.command(naming(peer.window("DMA.SET", "k", 16), token)), "NOHELLO");
}

TEST_CASE("past max-hello-bindings a HELLO drops the least recently used closed binding, or is refused",
          "[module][hello]") {
  ModuleServer server({}, {"max-hello-bindings", "2"});
  Peer peer(4096);
  Resp a(server.port());
  Resp b(server.port());
  Resp c(server.port());
  const std::string token_a = hello_token(a, peer);
  hello(b, peer);
  require_error(c.command({"DMA.HELLO", peer.address_hex()}), "too many DMA.HELLO bindings");
  require_ok(c.command(naming(peer.window("DMA.SET", "k", 16), token_a)));  // shared now
  a.close();
  CHECK(wait_for(c, "dma_clients", 1) == 1);
  CHECK(info_value(c, "hello_bindings") == 2);
  hello(c, peer);  // room: a's binding goes
  CHECK(info_value(c, "hello_bindings") == 2);
  CHECK(info_value(c, "hello_bindings_dropped") == 1);
  require_error(c.command(naming(peer.window("DMA.SET", "k", 16), token_a)), "NOHELLO");
}

TEST_CASE("DMA.SET writes its key and DMA.GET only reads it, for COMMAND GETKEYS and ACL key patterns", "[module]") {
  ModuleServer server;
  Resp admin(server.port());
  const auto keys = admin.command({"COMMAND", "GETKEYS", "DMA.SET", "k", "1", "2", "3"});
  REQUIRE(keys.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(keys.elements.size() == 1);
  CHECK(keys.elements[0].text == "k");
  const auto flags = admin.command({"COMMAND", "GETKEYSANDFLAGS", "DMA.GET", "k", "1", "2", "3"});
  REQUIRE(flags.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(flags.elements.size() == 1);
  REQUIRE(flags.elements[0].elements.size() == 2);
  CHECK(flags.elements[0].elements[1].elements[0].text == "RO");
  require_ok(admin.command({"SET", "k1", pattern_text("k1", 4096)}));
  require_ok(admin.command({"ACL", "SETUSER", "reader", "on", "nopass", "%R~k*", "+@all"}));
  Peer peer(4096);
  Resp reader(server.port());
  require_ok(reader.command({"AUTH", "reader", "any"}));
  hello(reader, peer);
  const auto got = reader.command(peer.window("DMA.GET", "k1", 4096));
  INFO("DMA.GET replied " << got.text);
  REQUIRE(got.type == dma::kv::resp::Reply::Type::array);
  CHECK(std::memcmp(peer.memory().data(), pattern_text("k1", 4096).data(), 4096) == 0);
  require_error(reader.command(peer.window("DMA.SET", "k1", 16)), "NOPERM");
  CHECK(admin.command({"GET", "k1"}).text == pattern_text("k1", 4096));
  // The refused DMA.SET submitted nothing. (The DMA.GET's reply may come before the fabric thread
  // has counted its completion: wait for that, bounded.)
  CHECK(wait_for(admin, "outstanding", 0) == 0);
  CHECK(info_value(admin, "transfers_ok") == 1);
}

TEST_CASE("MULTI and Lua refuse DMA.SET and DMA.GET instead of blocking", "[module]") {
  ModuleServer server;
  Peer peer(4096);
  Resp resp(server.port());
  hello(resp, peer);
  require_ok(resp.command({"SET", "k", "v"}));
  require_ok(resp.command({"MULTI"}));
  CHECK(resp.command(peer.window("DMA.GET", "k", 4096)).text == "QUEUED");
  CHECK(resp.command(peer.window("DMA.SET", "k", 16)).text == "QUEUED");
  const auto exec = resp.command({"EXEC"});
  REQUIRE(exec.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(exec.elements.size() == 2);
  for (const auto& element : exec.elements) {
    INFO("EXEC element: " << element.text);
    CHECK(element.is_error());
    CHECK(element.text.find("MULTI") != std::string_view::npos);
  }
  // A script has no DMA.HELLO of its own.
  require_error(resp.command({"EVAL", "return redis.call('DMA.GET', 'k', KEYS[1], '0', '4096')", "1", peer.rkey()}),
                "NOHELLO");
  CHECK(resp.command({"GET", "k"}).text == "v");
  CHECK(info_value(resp, "outstanding") == 0);  // nothing was submitted
  CHECK(resp.command({"PING"}).text == "PONG");
}

TEST_CASE("8 clients with 2 killed in the middle of transfers: the others see no error", "[module][kill]") {
  ModuleServer server;
  Resp probe(server.port());
  const auto baseline = std::stoull(server_info(probe, "used_memory"));
  Child others(client(server, bench({"--clients", "6", "--sizes", "4K-1M", "--duration", "4"})));
  std::this_thread::sleep_for(300ms);
  Child getter = victim(server, true);
  Child setter = victim(server, false);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  int caught = 0;
  bool getter_alive = true;
  while (caught < 2 && std::chrono::steady_clock::now() < deadline) {
    if (getter_alive && info_value(probe, "dma_gets_in_flight") > 0) {
      getter.kill_now();
      getter_alive = false;
      ++caught;
    }
    if (!getter_alive && info_value(probe, "dma_sets_in_flight") > 0) {
      setter.kill_now();
      ++caught;
    }
    std::this_thread::sleep_for(200us);
  }
  CHECK(caught == 2);
  require_clean_bench(others);
  // Whatever the killed setter left under its key is one whole value it wrote, never part of one.
  const auto left = probe.command({"GET", "victim-set:0:0"});
  if (left.type == dma::kv::resp::Reply::Type::bulk) {
    const kv::Pattern pattern(4 << 20);
    REQUIRE(left.text.size() == 4u << 20);
    bool whole = false;
    for (std::size_t seed = 0; seed < kv::pattern_offsets && !whole; ++seed)
      whole = std::memcmp(left.text.data(), pattern.value(seed, 4 << 20).data(), 4 << 20) == 0;
    CHECK(whole);
  }
  CHECK(wait_for(probe, "outstanding", 0) == 0);
  CHECK(wait_for(probe, "dma_sets_in_flight", 0) == 0);
  CHECK(wait_for(probe, "dma_gets_in_flight", 0) == 0);
  CHECK(wait_for(probe, "dma_clients", 0) == 0);
  // Every value the killed clients left half-read was freed: with the keys gone, the server's
  // memory is back near where it started.
  require_ok(probe.command({"FLUSHALL", "SYNC"}));
  const auto after = std::stoull(server_info(probe, "used_memory"));
  INFO("used_memory " << baseline << " before, " << after << " after");
  CHECK(after < baseline + (1u << 20));
}

TEST_CASE("BGSAVE with transfers in flight saves while every client reads back what it wrote", "[module]") {
  ModuleServer server;
  Resp admin(server.port());
  Child load(client(server, bench({"--clients", "4", "--sizes", "4K-1M", "--duration", "3"})));
  REQUIRE(wait_for_any(admin, "transfers_ok"));
  for (int round = 0; round < 2; ++round) {
    const auto saved = admin.command({"BGSAVE"});
    INFO("BGSAVE: " << saved.text);
    CHECK(!saved.is_error());
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (server_info(admin, "rdb_bgsave_in_progress") != "0" && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
    CHECK(server_info(admin, "rdb_last_bgsave_status") == "ok");
  }
  require_clean_bench(load);
  CHECK(wait_for(admin, "outstanding", 0) == 0);
  CHECK(info_value(admin, "transfers_failed") == 0);
}

TEST_CASE("DEBUG RELOAD with a DMA.SET and a DMA.GET in flight: both complete and the data survives", "[module]") {
  ModuleServer server;
  constexpr std::size_t size = 1 << 20;
  Peer peer(2 * size, false);
  const std::string old_value = pattern_text("kept", size);
  const std::string new_value = pattern_text("arriving", size);
  std::memcpy(peer.memory().data() + size, new_value.data(), size);
  Resp admin(server.port());
  Resp getter(server.port());
  Resp setter(server.port());
  require_ok(admin.command({"SET", "kept", old_value}));
  hello(getter, peer);
  hello(setter, peer);
  getter.send_raw(encode(peer.window("DMA.GET", "kept", size)));
  auto set = peer.window("DMA.SET", "arriving", size);
  set[3] = std::to_string(std::stoull(peer.offset()) + size);
  set.push_back(std::to_string(dma::checksum(std::as_bytes(std::span(new_value)))));
  setter.send_raw(encode(set));
  REQUIRE(wait_for(admin, "outstanding", 2) == 2);
  require_ok(admin.command({"DEBUG", "RELOAD"}));
  CHECK(info_value(admin, "outstanding") == 2);  // the reload ran while both were in flight
  CHECK(admin.command({"EXISTS", "arriving"}).integer == 0);
  peer.resume();
  const auto got = getter.reply();
  REQUIRE(got.type == dma::kv::resp::Reply::Type::array);
  CHECK(std::memcmp(peer.memory().data(), old_value.data(), size) == 0);
  require_ok(setter.reply());
  CHECK(admin.command({"GET", "arriving"}).text == new_value);
  CHECK(admin.command({"GET", "kept"}).text == old_value);
  require_ok(admin.command({"DEBUG", "RELOAD"}));
  CHECK(admin.command({"GET", "arriving"}).text == new_value);
}

TEST_CASE("MODULE UNLOAD is refused while a transfer is in flight and succeeds after", "[module]") {
  ModuleServer server;
  Peer peer(65536, false);
  Resp getter(server.port());
  Resp admin(server.port());
  require_ok(admin.command({"SET", "k", pattern_text("k", 65536)}));
  hello(getter, peer);
  getter.send_raw(encode(peer.window("DMA.GET", "k", 65536)));
  REQUIRE(wait_for(admin, "dma_gets_in_flight", 1) == 1);
  const auto refused = admin.command({"MODULE", "UNLOAD", "dma"});
  INFO("MODULE UNLOAD replied " << refused.text);
  CHECK(refused.is_error());
  peer.resume();
  const auto reply = getter.reply();
  CHECK(reply.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(wait_for(admin, "dma_gets_in_flight", 0) == 0);
  REQUIRE(wait_for(admin, "outstanding", 0) == 0);  // the completer returns just after it unblocks
  require_ok(admin.command({"MODULE", "UNLOAD", "dma"}));
  CHECK(admin.command({"DMA.INFO"}).is_error());
  CHECK(admin.command({"GET", "k"}).text == pattern_text("k", 65536));
  CHECK(admin.command({"PING"}).text == "PONG");
}

TEST_CASE("SHUTDOWN with transfers in flight ends the server without a crash", "[module]") {
  ModuleServer server;
  Resp admin(server.port());
  Child load(client(server, bench({"--clients", "4", "--sizes", "1M-4M", "--duration", "20"})));
  REQUIRE(wait_for_any(admin, "transfers_ok"));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (info_value(admin, "outstanding") == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(200us);
  admin.send_raw(encode({"SHUTDOWN", "NOSAVE"}));
  CHECK(server.child().wait(30s) == 0);
  load.kill_now();
  const auto log = server.log();
  INFO("server log:\n" << log);
  CHECK(log.find("crashed") == std::string::npos);
  CHECK(log.find("ready to exit") != std::string::npos);
}

TEST_CASE("a long command on the main thread does not hold up the fabric thread", "[module]") {
  ModuleServer server;
  Peer peer(1 << 20, false);
  Resp getter(server.port());
  Resp sleeper(server.port());
  require_ok(sleeper.command({"SET", "k", pattern_text("k", 1 << 20)}));
  hello(getter, peer);
  getter.send_raw(encode(peer.window("DMA.GET", "k", 1 << 20)));
  REQUIRE(wait_for(sleeper, "dma_gets_in_flight", 1) == 1);
  sleeper.send_raw(encode({"DEBUG", "SLEEP", "2"}));
  std::this_thread::sleep_for(300ms);  // the main thread is asleep by now: it had nothing else to do
  peer.resume();                       // the write completes while the main thread sleeps
  CHECK(sleeper.reply().text == "OK");
  const auto reply = getter.reply();
  REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
  CHECK(std::memcmp(peer.memory().data(), pattern_text("k", 1 << 20).data(), 1 << 20) == 0);
  // The completion waited for the main thread (it was handed over during the sleep), but the
  // completer that handed it over did not wait for anything.
  const auto handoff = info_value(sleeper, "handoff_max_us");
  const auto completer = info_value(sleeper, "completer_max_us");
  INFO("handoff " << handoff << " us, completer " << completer << " us");
  CHECK(handoff >= 500000);
  CHECK(completer < 100000);
}

TEST_CASE("DMA.SET values count in used_memory and meet maxmemory's deny-oom", "[module]") {
  ModuleServer server({"--maxmemory", "12mb", "--maxmemory-policy", "noeviction"});
  Peer peer(4 << 20);
  Resp resp(server.port());
  hello(resp, peer);
  const auto before = std::stoull(server_info(resp, "used_memory"));
  require_ok(resp.command(peer.window("DMA.SET", "big-0", 4 << 20)));
  const auto after = std::stoull(server_info(resp, "used_memory"));
  INFO("used_memory " << before << " before, " << after << " after");
  CHECK(after >= before + (4u << 20));
  bool refused = false;
  for (int i = 1; i < 5 && !refused; ++i) {
    const auto reply = resp.command(peer.window("DMA.SET", "big-" + std::to_string(i), 4 << 20));
    refused = reply.is_error();
    if (refused) {
      INFO("reply: " << reply.text);
      CHECK(reply.text.rfind("OOM", 0) == 0);
    }
  }
  CHECK(refused);
  CHECK(wait_for(resp, "outstanding", 0) == 0);
}

// The server asserts that nothing is replicated while writes are paused (CLIENT PAUSE WRITE, a
// manual failover, the shutdown wait), and a blocked client's reply still runs then.
TEST_CASE("a DMA.SET that completes while writes are paused is refused, and the server stays up", "[module][pause]") {
  constexpr std::size_t size = 8 << 20;
  ModuleServer primary;
  ModuleServer replica({"--replicaof", "127.0.0.1", primary.port_text()});
  Resp admin(primary.port());
  const auto replica_deadline = std::chrono::steady_clock::now() + 20s;
  while (server_info(admin, "connected_slaves") != "1" && std::chrono::steady_clock::now() < replica_deadline) {
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(server_info(admin, "connected_slaves") == "1");

  Peer peer(size, false);
  const std::string value = pattern_text("paused", size);
  std::memcpy(peer.memory().data(), value.data(), size);
  Resp setter(primary.port());
  send_held_set(setter, admin, peer, "paused", size);
  require_ok(admin.command({"CLIENT", "PAUSE", "20000", "WRITE"}));
  peer.resume();  // the transfer completes while writes are paused
  require_error(setter.reply(), "TRYAGAIN");
  CHECK(info_value(admin, "sets_refused_paused") == 1);
  CHECK(admin.command({"PING"}).text == "PONG");
  CHECK(admin.command({"EXISTS", "paused"}).integer == 0);

  require_ok(admin.command({"CLIENT", "UNPAUSE"}));
  require_ok(setter.command(peer.window("DMA.SET", "paused", size)));
  CHECK(setter.command({"WAIT", "1", "20000"}).integer == 1);
  Resp reader(replica.port());
  CHECK(reader.command({"GET", "paused"}).text == value);
}

// A primary turned replica answers every blocked client -UNBLOCKED and never runs their replies.
TEST_CASE("a primary turned replica mid-transfer answers -UNBLOCKED and stores nothing", "[module][pause]") {
  constexpr std::size_t size = 4 << 20;
  ModuleServer primary;
  ModuleServer other;
  Peer peer(size, false);
  Resp setter(primary.port());
  Resp admin(primary.port());
  send_held_set(setter, admin, peer, "demoted", size);
  require_ok(admin.command({"REPLICAOF", "127.0.0.1", other.port_text()}));
  require_error(setter.reply(), "UNBLOCKED");
  peer.resume();  // the read completes with nobody to answer: its value is freed
  CHECK(wait_for(admin, "dma_sets_in_flight", 0) == 0);
  CHECK(admin.command({"PING"}).text == "PONG");
  CHECK(admin.command({"EXISTS", "demoted"}).integer == 0);
}

TEST_CASE("a DMA.SET reaches the append-only file: DEBUG LOADAOF brings the value back", "[module]") {
  ModuleServer server({"--appendonly", "yes", "--appendfsync", "always"});
  constexpr std::size_t size = 300000;
  Peer peer(size);
  const std::string value = pattern_text("logged", size);
  std::memcpy(peer.memory().data(), value.data(), size);
  Resp resp(server.port());
  hello(resp, peer);
  require_ok(resp.command(peer.window("DMA.SET", "logged", size)));
  require_ok(resp.command(peer.window("DMA.SET", "empty", 0)));
  require_ok(resp.command({"DEBUG", "LOADAOF"}));
  CHECK(resp.command({"GET", "logged"}).text == value);
  const auto empty = resp.command({"GET", "empty"});
  CHECK(empty.type == dma::kv::resp::Reply::Type::bulk);
  CHECK(empty.text.empty());
}

// The rule of docs/side-channel.md#confirmation, forced on tcp: a DMA.GET with a token is written
// with it as immediate data, and dma-kv-client reads each value only after that notification.
TEST_CASE("at confirm-gets notification dma-kv-client's 8 clients read every byte after their notification",
          "[module]") {
  ModuleServer server({}, {"confirm-gets", "notification"});
  Peer peer(4096);
  Resp resp(server.port());
  const auto hello = resp.command({"DMA.HELLO", peer.address_hex()});
  REQUIRE(hello.type == dma::kv::resp::Reply::Type::array);
  REQUIRE(hello.elements.size() == 5);
  CHECK(hello.elements[3].text == "notification");
  require_ok(resp.command({"SET", "k", "v"}));
  auto too_wide = peer.window("DMA.GET", "k", 4096);
  too_wide.push_back("4294967296");
  require_error(resp.command(too_wide), "invalid token '4294967296'");

  Child run(client(server, bench({"--clients", "8", "--ops", "100", "--sizes", "1-256K", "--keys", "4"})));
  const auto gets = require_notified_bench(run);
  CHECK(static_cast<double>(info_value(resp, "gets_notified")) == gets);
  CHECK(info_field(resp, "get_confirmation") == "notification");
}

TEST_CASE("the module takes its configuration from its arguments: keys, or a TOML file", "[module]") {
  {
    ModuleServer server({},
                        {"config", test::source_root() + "/config/tcp.toml", "max-value", "1000", "pool-threads", "1"});
    Peer peer(4096);
    Resp resp(server.port());
    const auto reply = resp.command({"DMA.HELLO", peer.address_hex()});
    REQUIRE(reply.type == dma::kv::resp::Reply::Type::array);
    CHECK(reply.elements[2].integer == 1000);
    require_error(resp.command(peer.window("DMA.SET", "k", 1001)), "exceeds the limit of 1000");
    CHECK(info_field(resp, "provider").rfind("tcp", 0) == 0);
  }
  // A refused argument or file makes the load, and so the server's start, fail with the reason in
  // the log.
  const Scratch folder;
  const std::string scratch = folder.path();
  const std::string bad_file = scratch + "/bad.toml";
  std::ofstream(bad_file) << "[dma-libfabric]\nno_such_key = 1\n";
  const std::vector<std::pair<std::vector<std::string>, std::string>> refusals{
      {{"max-value", "lots"}, "max-value takes a whole number"},
      {{"hold-values", "maybe"}, "hold-values takes yes or no"},
      {{"colour", "blue"}, "unknown argument 'colour'"},
      {{"config"}, "has no value"},
      {{"config", bad_file}, "no_such_key"},
      {{"confirm-gets", "sometimes"}, "confirm-gets takes auto, reply or notification"},
  };
  for (const auto& [arguments, reason] : refusals) {
    std::vector<std::string> all{module_server_program(), "--port", std::to_string(free_port())};
    all.insert(all.end(), {"--logfile", scratch + "/log", "--loadmodule", module_path()});
    all.insert(all.end(), arguments.begin(), arguments.end());
    Child server(all);
    CHECK(server.wait(30s) == 1);
    std::ifstream in(scratch + "/log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    INFO("server log:\n" << log);
    CHECK(log.find(reason) != std::string::npos);
    std::filesystem::remove(scratch + "/log");
  }
}

int main(int argc, char* argv[]) { return run_suite(argc, argv); }
