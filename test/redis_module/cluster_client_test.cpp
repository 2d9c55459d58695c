// dma::kv::ClusterClient and `dma-kv-client --cluster` on a loopback cluster of the module
// (redis-module-cluster-client): three primaries with a replica each, per test. Routing from a node
// that owns none of the keys, -ASK and -MOVED during a slot's move, WAIT and reads from replicas;
// then a manual failover, a `kill -9` of a primary and a reshard, each while a load writes (with
// WAIT 1) and reads, with a ledger of what the client was told: every value acknowledged reads
// back byte-exact afterwards. Exits 77 (skipped) when the server program or redis-cli is missing.
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "cluster.hpp"
#include "harness.hpp"

#include <dma/kv/cluster_client.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <atomic>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <thread>

namespace {

using namespace module_test;
constexpr auto with_error = dma::compat::as_tuple(asio::use_awaitable);

// An io_context on its own thread with a Target and its ClientTarget, for ClusterClients.
class Side {
 public:
  Side() : target_(io_, loopback_configuration()), shared_(target_), work_(asio::make_work_guard(io_)) {
    thread_ = std::thread([this] { io_.run(); });
  }
  ~Side() {
    work_.reset();
    io_.stop();
    thread_.join();
  }
  asio::io_context& io() noexcept { return io_; }
  dma::kv::ClientTarget& shared() noexcept { return shared_; }
  dma::Target& target() noexcept { return target_; }

  /// Runs `body` on the context and waits for it (bounded).
  template <typename Body>
  void run(Body body, std::chrono::seconds bound = 120s) {
    std::promise<std::exception_ptr> done;
    auto future = done.get_future();
    asio::co_spawn(io_, std::move(body), [&done](std::exception_ptr e) { done.set_value(e); });
    REQUIRE(future.wait_for(bound) == std::future_status::ready);
    if (auto e = future.get()) std::rethrow_exception(e);
  }

 private:
  asio::io_context io_;
  dma::Target target_;
  dma::kv::ClientTarget shared_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

void until(const std::function<bool()>& condition, std::chrono::seconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!condition()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(20ms);
  }
}

}  // namespace

TEST_CASE("key_slot and parse_redirect read what the cluster computes and says", "[cluster]") {
  CHECK(dma::kv::key_slot("foo") == 12182);
  CHECK(dma::kv::key_slot("{user1000}.following") == dma::kv::key_slot("{user1000}.followers"));
  CHECK(dma::kv::key_slot("foo{}{bar}") == dma::kv::key_slot("foo{}{bar}"));
  CHECK(dma::kv::key_slot("{}") != dma::kv::key_slot(""));
  const auto moved = dma::kv::parse_redirect("DMA.SET: MOVED 3999 127.0.0.1:6381");
  REQUIRE(moved);
  CHECK(!moved->ask);
  CHECK(moved->slot == 3999);
  CHECK(moved->host == "127.0.0.1");
  CHECK(moved->port == 6381);
  const auto ask = dma::kv::parse_redirect("ASK 1 [::1]:7000");
  REQUIRE(ask);
  CHECK(ask->ask);
  CHECK(ask->host == "::1");
  CHECK(!dma::kv::parse_redirect("ERR no such key"));
  CHECK(!dma::kv::parse_redirect("MOVED 99999 h:1"));
  CHECK(!dma::kv::parse_redirect("MOVED 1 h:0"));
}

TEST_CASE(
    "ClusterClient and dma-kv-client --cluster, given a node that serves none of the keys, store and read "
    "every key byte-exact",
    "[cluster]") {
  Cluster cluster;
  Resp first(cluster.nodes().front()->port());
  // A replica serves no slot: every key is elsewhere.
  const NodeLine any_primary = cluster.primary_of("x");
  const NodeLine seed = cluster.replica_of(any_primary);

  Side side;
  std::vector<std::byte> memory(std::size_t{1} << 20);
  auto region = side.target().expose(memory);
  dma::kv::ClusterClient client(side.io(), side.shared());
  std::map<std::string, std::string> values;
  for (int i = 0; i < 12; ++i) {
    const std::string key = "spread-" + std::to_string(i);
    values[key] = pattern_text(key, std::size_t{4096} << (i % 6));
  }
  side.run([&]() -> asio::awaitable<void> {
    auto [ec] = co_await client.async_connect("127.0.0.1", seed.port, with_error);
    REQUIRE(!ec);
    for (const auto& [key, value] : values) {
      std::memcpy(memory.data(), value.data(), value.size());
      auto [set_ec, set] =
          co_await client.async_set(key, region, std::span<const std::byte>(memory).first(value.size()), with_error);
      INFO(key << ": " << set.detail);
      REQUIRE(!set_ec);
    }
    for (const auto& [key, value] : values) {
      std::memset(memory.data(), 0, memory.size());
      auto [get_ec, got] = co_await client.async_get(key, region, std::span<std::byte>(memory), with_error);
      INFO(key << ": " << got.detail);
      REQUIRE(!get_ec);
      REQUIRE(got.length == value.size());
      CHECK(std::memcmp(memory.data(), value.data(), value.size()) == 0);
    }
    auto [missing_ec, missing] =
        co_await client.async_get("never-set", region, std::span<std::byte>(memory), with_error);
    CHECK(missing_ec == dma::kv::client_error::no_such_key);
  });
  CHECK(client.primaries().size() == 3);
  CHECK(client.stats().connections == 3);  // one per primary: no key went to the seed
  for (const auto& [key, value] : values)
    CHECK(Resp(cluster.primary_of(key).port).command({"GET", key}).text == value);

  // The program: set and get through any node, then a bench that verifies every byte.
  const std::string port = std::to_string(seed.port);
  ModuleServer& seed_server = cluster.by_port(seed.port);
  const auto set = run_client(seed_server, {"--cluster", "set", "cli-key", "--size", "300000"});
  CHECK(set.find("stored cli-key: 300000 bytes") != std::string::npos);
  const auto get = run_client(seed_server, {"--cluster", "get", "cli-key"});
  CHECK(get.find("the bytes are the pattern") != std::string::npos);
  const auto bench_out = run_client(
      seed_server, {"--cluster", "bench", "--clients", "3", "--sizes", "4K-1M", "--ops", "60", "--keys", "12"});
  INFO(bench_out);
  CHECK(bench_out.find("verified: all") != std::string::npos);
  // 36 keys over three primaries: each gets some (all on one or two: about 1 in 10^6).
  REQUIRE(bench_out.find("keys per primary:") != std::string::npos);
  const auto spread = bench_out.substr(bench_out.find("keys per primary:"));
  CHECK(std::count(spread.begin(), spread.begin() + static_cast<std::ptrdiff_t>(spread.find('\n')), '=') == 3);
}

TEST_CASE("ClusterClient follows -ASK with ASKING while a slot moves, and -MOVED once it has", "[cluster]") {
  Cluster cluster;
  const std::string key = "asked-key";
  const NodeLine from = cluster.primary_of(key);
  const NodeLine to = cluster.other_primary(from);
  const std::string slot = std::to_string(cluster.slot_of(key));
  const std::string value = pattern_text(key, 200000);

  Side side;
  std::vector<std::byte> memory(std::size_t{1} << 20);
  auto region = side.target().expose(memory);
  dma::kv::ClusterClient client(side.io(), side.shared());
  auto set_and_get = [&](const std::string& k) -> asio::awaitable<void> {
    std::memcpy(memory.data(), value.data(), value.size());
    auto [set_ec, set] =
        co_await client.async_set(k, region, std::span<const std::byte>(memory).first(value.size()), with_error);
    INFO(set.detail);
    REQUIRE(!set_ec);
    std::memset(memory.data(), 0, memory.size());
    auto [get_ec, got] = co_await client.async_get(k, region, std::span<std::byte>(memory), with_error);
    INFO(got.detail);
    REQUIRE(!get_ec);
    CHECK(std::memcmp(memory.data(), value.data(), value.size()) == 0);
  };
  side.run([&]() -> asio::awaitable<void> {
    auto [ec] = co_await client.async_connect("127.0.0.1", from.port, with_error);
    REQUIRE(!ec);
    co_await set_and_get(key);
  });

  // The slot is migrating and the key has gone over: the old owner answers -ASK.
  Resp old_owner(from.port), new_owner(to.port);
  require_ok(new_owner.command({"CLUSTER", "SETSLOT", slot, "IMPORTING", from.id}));
  require_ok(old_owner.command({"CLUSTER", "SETSLOT", slot, "MIGRATING", to.id}));
  require_ok(old_owner.command({"MIGRATE", "127.0.0.1", std::to_string(to.port), key, "0", "5000"}));
  side.run([&]() -> asio::awaitable<void> { co_await set_and_get(key); });
  CHECK(client.stats().asked >= 2);
  CHECK(client.stats().moved == 0);
  CHECK(new_owner.command({"ASKING"}).text == "OK");

  // The move ends: the old owner answers -MOVED, and the client's map follows.
  require_ok(new_owner.command({"CLUSTER", "SETSLOT", slot, "NODE", to.id}));
  require_ok(old_owner.command({"CLUSTER", "SETSLOT", slot, "NODE", to.id}));
  side.run([&]() -> asio::awaitable<void> { co_await set_and_get(key); });
  CHECK(client.stats().moved >= 1);
  CHECK(client.node_of(key) == "127.0.0.1:" + std::to_string(to.port));
}

TEST_CASE("a DMA.SET with WAIT is on the replica, which serves DMA.GETs with read_from_replicas", "[cluster]") {
  Cluster cluster;
  Side side;
  std::vector<std::byte> memory(std::size_t{1} << 20);
  auto region = side.target().expose(memory);
  dma::kv::ClusterClient client(side.io(), side.shared());
  const std::string key = "replicated";
  const std::string value = pattern_text(key, 500000);
  side.run([&]() -> asio::awaitable<void> {
    auto [ec] = co_await client.async_connect("127.0.0.1", cluster.nodes().front()->port(), with_error);
    REQUIRE(!ec);
    std::memcpy(memory.data(), value.data(), value.size());
    dma::kv::SetRequest request{key, std::span<const std::byte>(memory).first(value.size()), &region, {}};
    request.replicas = 1;
    request.replica_timeout = 20s;
    auto [set_ec, set] = co_await client.async_set(request, with_error);
    INFO(set.detail);
    REQUIRE(!set_ec);
    CHECK(set.replicas == 1);
    // More replicas than there are: stored, and the client is told it is not on them.
    request.replicas = 2;
    request.replica_timeout = 100ms;
    auto [short_ec, short_set] = co_await client.async_set(request, with_error);
    CHECK(short_ec == dma::kv::client_error::not_replicated);
    CHECK(short_set.replicas == 1);
    CHECK(short_set.detail.find("WAIT counted 1 of 2") != std::string::npos);
  });
  // A replica is in the slot map once it has replicated something and the cluster knows it.
  const NodeLine replica = cluster.replica_of(cluster.primary_of(key));
  Resp primary(cluster.primary_of(key).port);
  auto replica_listed = [&] {
    for (const auto& range : primary.command({"CLUSTER", "SLOTS"}).elements) {
      for (std::size_t i = 3; i < range.elements.size(); ++i) {
        if (range.elements[i].elements.size() > 1 && range.elements[i].elements[1].integer == replica.port) return true;
      }
    }
    return false;
  };
  until(replica_listed, 60s);
  dma::kv::ClusterOptions options;
  options.read_from_replicas = true;
  dma::kv::ClusterClient reading(side.io(), side.shared(), options);
  side.run([&]() -> asio::awaitable<void> {
    auto [ec] = co_await reading.async_connect("127.0.0.1", cluster.nodes().front()->port(), with_error);
    REQUIRE(!ec);
    std::memset(memory.data(), 0, memory.size());
    auto [get_ec, got] = co_await reading.async_get(key, region, std::span<std::byte>(memory), with_error);
    INFO(got.detail);
    REQUIRE(!get_ec);
    CHECK(std::memcmp(memory.data(), value.data(), value.size()) == 0);
  });
  CHECK(reading.stats().replica_reads == 1);
  Resp reader(replica.port);
  require_ok(reader.command({"READONLY"}));
  CHECK(reader.command({"GET", key}).text == value);
}

TEST_CASE("a cancelled command, a lost shard and close() each end a ClusterClient's commands once, in time",
          "[cluster]") {
  Cluster cluster(2000);
  Side side;
  std::vector<std::byte> memory(std::size_t{8} << 20);
  auto region = side.target().expose(memory);
  dma::kv::ClusterOptions options;
  options.client.deadline = 1500ms;
  dma::kv::ClusterClient client(side.io(), side.shared(), options);
  const std::string key = "cut-short";
  side.run([&]() -> asio::awaitable<void> {
    auto [ec] = co_await client.async_connect("127.0.0.1", cluster.nodes().front()->port(), with_error);
    REQUIRE(!ec);
    // Cancelled at once: aborted, or done if it was quicker; the next command goes through.
    asio::cancellation_signal signal;
    auto cancelled = client.async_set(key, region, std::span<const std::byte>(memory),
                                      asio::bind_cancellation_slot(signal.slot(), asio::use_awaitable));
    signal.emit(asio::cancellation_type::terminal);
    try {
      co_await std::move(cancelled);
    } catch (const std::system_error& error) {
      CHECK(error.code() == asio::error::operation_aborted);
    }
    auto [set_ec, set] = co_await client.async_set(key, region, std::span<const std::byte>(memory), with_error);
    INFO(set.detail);
    CHECK(!set_ec);
  });
  CHECK(client.pending() == 0);

  // The key's primary and its replica gone: the command fails within its deadline, and says why.
  const NodeLine primary = cluster.primary_of(key);
  const NodeLine replica = cluster.replica_of(primary);
  cluster.kill(replica.port);
  cluster.kill(primary.port);
  side.run([&]() -> asio::awaitable<void> {
    const auto began = std::chrono::steady_clock::now();
    auto [get_ec, got] = co_await client.async_get(key, region, std::span<std::byte>(memory), with_error);
    const auto took = std::chrono::steady_clock::now() - began;
    INFO(got.detail);
    CHECK(get_ec);
    CHECK(got.detail.find("gave up after") != std::string::npos);
    CHECK(took < 15s);  // 1.5 s deadline, with room for a loaded machine
  });

  // close() with a command between its attempts: it ends at once, aborted.
  side.run([&]() -> asio::awaitable<void> {
    dma::kv::ClusterOptions patient;
    patient.client.deadline = 60s;
    dma::kv::ClusterClient closing(side.io(), side.shared(), patient);
    auto [ec] = co_await closing.async_connect("127.0.0.1", cluster.other_primary(primary).port, with_error);
    REQUIRE(!ec);
    asio::steady_timer later(side.io(), 300ms);
    later.async_wait([&](std::error_code) { closing.close(); });
    const auto began = std::chrono::steady_clock::now();
    auto [get_ec, got] = co_await closing.async_get(key, region, std::span<std::byte>(memory), with_error);
    CHECK(get_ec == dma::kv::client_error::aborted);
    CHECK(std::chrono::steady_clock::now() - began < 20s);
  });

  // A command whose replies would not come one per command is refused.
  side.run([&]() -> asio::awaitable<void> {
    dma::kv::Client plain(side.io().get_executor());
    auto [ec] = co_await plain.async_connect("127.0.0.1", cluster.other_primary(primary).port, with_error);
    REQUIRE(!ec);
    std::vector<std::string> subscribe{"SUBSCRIBE", "news"};
    auto [sub_ec, sub] = co_await plain.async_command(std::move(subscribe), with_error);
    CHECK(sub_ec == dma::kv::client_error::invalid_argument);
    std::vector<std::string> ping{"PING"};
    auto [ping_ec, pong] = co_await plain.async_command(std::move(ping), with_error);
    CHECK(!ping_ec);
    CHECK(pong.reply.text == "PONG");
  });
}

// ---- under load ---------------------------------------------------------------------------------

namespace {

// What the load's clients were told, per key: each key is one worker's alone.
struct Ledger {
  struct Key {
    std::uint64_t acknowledged = 0;   ///< the last version stored with OK and WAIT 1
    std::set<std::uint64_t> unknown;  ///< later versions whose DMA.SET failed: stored or not
  };
  std::mutex mutex;
  std::map<std::string, Key> keys;
  std::uint64_t acknowledged = 0, refused = 0, reads = 0, reads_refused = 0, stale = 0, corrupt = 0;
  std::string first_refusal, first_read_refusal;
  dma::kv::ClusterStats followed;  ///< summed over the workers' clients
};

constexpr std::size_t size_choices[] = {64 << 10, 256 << 10, 1 << 20, 4 << 20};

std::size_t length_of(std::uint64_t version, bool large) {
  if (large && version % 5 == 0) return std::size_t{8} << 20;
  return size_choices[version % std::size(size_choices)];
}

// One worker: its own ClusterClient, keys and buffers; DMA.SETs with WAIT 1, and DMA.GETs of what
// it stored, until `stop`.
asio::awaitable<void> worker(Side& side, std::uint16_t seed, std::vector<std::string> keys, Ledger& ledger,
                             const kv::Pattern& pattern, std::atomic<bool>& stop, bool large, unsigned index) {
  std::vector<std::byte> out(std::size_t{8} << 20), in(std::size_t{8} << 20);
  auto out_region = side.target().expose(out);
  auto in_region = side.target().expose(in);
  dma::kv::ClusterOptions options;
  options.client.deadline = 60s;
  dma::kv::ClusterClient client(side.io(), side.shared(), options);
  auto [ec] = co_await client.async_connect("127.0.0.1", seed, with_error);
  if (ec) throw std::runtime_error("connect: " + ec.message());
  struct AddStats {
    dma::kv::ClusterClient& client;
    Ledger& ledger;
    ~AddStats() {
      const auto s = client.stats();
      std::lock_guard lock(ledger.mutex);
      ledger.followed.moved += s.moved;
      ledger.followed.asked += s.asked;
      ledger.followed.retries += s.retries;
    }
  } add_stats{client, ledger};
  std::uint64_t version = index * 1'000'000;
  for (std::uint64_t round = 0; !stop.load() && round < 100'000; ++round) {
    const std::string& key = keys[round % keys.size()];
    std::uint64_t known = 0;
    {
      std::lock_guard lock(ledger.mutex);
      known = ledger.keys[key].acknowledged;
    }
    if (known != 0 && round % 2 == 1) {
      auto [get_ec, got] = co_await client.async_get(key, in_region, std::span<std::byte>(in), with_error);
      std::lock_guard lock(ledger.mutex);
      auto& entry = ledger.keys[key];
      ++ledger.reads;
      if (get_ec) {
        ++ledger.reads_refused;
        if (ledger.first_read_refusal.empty()) ledger.first_read_refusal = got.detail;
        continue;
      }
      bool matched = false;
      std::vector<std::uint64_t> fine{entry.acknowledged};
      fine.insert(fine.end(), entry.unknown.begin(), entry.unknown.end());
      for (const auto v : fine) {
        const auto expected = pattern.value(kv::seed_of(key) + v, length_of(v, large));
        if (got.length == expected.size() && std::memcmp(in.data(), expected.data(), expected.size()) == 0) {
          matched = true;
        }
      }
      if (!matched) ++ledger.stale;
      continue;
    }
    const std::uint64_t v = ++version;
    const auto value = pattern.value(kv::seed_of(key) + v, length_of(v, large));
    std::memcpy(out.data(), value.data(), value.size());
    {
      std::lock_guard lock(ledger.mutex);
      ledger.keys[key].unknown.insert(v);
    }
    dma::kv::SetRequest request{key, std::span<const std::byte>(out).first(value.size()), &out_region, {}};
    request.replicas = 1;
    request.replica_timeout = 2s;
    auto [set_ec, set] = co_await client.async_set(request, with_error);
    std::lock_guard lock(ledger.mutex);
    auto& entry = ledger.keys[key];
    if (!set_ec) {
      ++ledger.acknowledged;
      entry.acknowledged = v;
      entry.unknown.clear();
    } else {
      ++ledger.refused;
      if (ledger.first_refusal.empty()) ledger.first_refusal = set.detail;
    }
  }
}

struct Outcome {
  std::uint64_t verified = 0, lost = 0, corrupt = 0;
};

// Reads every acknowledged key back through a fresh client.
Outcome verify(Side& side, std::uint16_t seed, Ledger& ledger, const kv::Pattern& pattern, bool large) {
  Outcome outcome;
  side.run([&]() -> asio::awaitable<void> {
    std::vector<std::byte> in(std::size_t{8} << 20);
    auto region = side.target().expose(in);
    dma::kv::ClusterClient client(side.io(), side.shared());
    auto [ec] = co_await client.async_connect("127.0.0.1", seed, with_error);
    REQUIRE(!ec);
    for (const auto& [key, entry] : ledger.keys) {
      if (entry.acknowledged == 0) continue;
      auto [get_ec, got] = co_await client.async_get(key, region, std::span<std::byte>(in), with_error);
      if (get_ec) {
        UNSCOPED_INFO(key << ": " << got.detail);
        ++outcome.lost;
        continue;
      }
      std::vector<std::uint64_t> fine{entry.acknowledged};
      fine.insert(fine.end(), entry.unknown.begin(), entry.unknown.end());
      bool matched = false, older = false;
      for (const auto v : fine) {
        const auto expected = pattern.value(kv::seed_of(key) + v, length_of(v, large));
        matched =
            matched || (got.length == expected.size() && std::memcmp(in.data(), expected.data(), expected.size()) == 0);
      }
      if (!matched) {
        // An older version is a lost acknowledgement; anything else is corruption.
        for (std::uint64_t v = entry.acknowledged;
             v-- > entry.acknowledged - std::min<std::uint64_t>(entry.acknowledged, 1000);) {
          const auto expected = pattern.value(kv::seed_of(key) + v, length_of(v, large));
          older =
              older || (got.length == expected.size() && std::memcmp(in.data(), expected.data(), expected.size()) == 0);
        }
        UNSCOPED_INFO(key << ": read back " << got.length << " bytes that are not the acknowledged value");
        ++(older ? outcome.lost : outcome.corrupt);
      } else {
        ++outcome.verified;
      }
    }
  });
  return outcome;
}

// A key whose slot lies in [first, last], found by trying names.
std::string key_in(int first, int last, const std::string& stem, int& counter) {
  for (int tries = 0; tries < 1'000'000; ++tries) {
    std::string key = stem + ":" + std::to_string(counter++);
    const int slot = dma::kv::key_slot(key);
    if (slot >= first && slot <= last) return key;
  }
  FAIL("no key in slots " << first << "-" << last);
  return {};
}

// Runs a load of four clients while `event` happens, then reads every acknowledged value back.
// With `hot`, half of each client's keys lie in those slots.
template <typename Event>
void under_load(const char* scenario, Cluster& cluster, bool large, Event event,
                std::optional<std::pair<int, int>> hot = std::nullopt) {
  const auto seed = cluster.nodes().front()->port();
  Side side;
  Ledger ledger;
  const kv::Pattern pattern(std::size_t{8} << 20);
  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  std::mutex failure_mutex;
  std::string failure;
  constexpr unsigned workers = 4;
  int counter = 0;
  for (unsigned w = 0; w < workers; ++w) {
    std::vector<std::string> keys;
    const std::string stem = std::string(scenario) + ":" + std::to_string(w);
    for (int k = 0; k < 6; ++k) {
      keys.push_back(hot && k % 2 == 0 ? key_in(hot->first, hot->second, stem, counter)
                                       : stem + ":" + std::to_string(counter++));
    }
    ++running;
    asio::co_spawn(side.io(), worker(side, seed, std::move(keys), ledger, pattern, stop, large, w + 1),
                   [&](std::exception_ptr e) {
                     if (e) {
                       try {
                         std::rethrow_exception(e);
                       } catch (const std::exception& error) {
                         std::lock_guard lock(failure_mutex);
                         failure = error.what();
                       }
                     }
                     --running;
                   });
  }
  const auto started = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(1500ms);
  event();
  std::this_thread::sleep_for(1500ms);
  stop = true;
  for (int i = 0; i < 3000 && running > 0; ++i)
    std::this_thread::sleep_for(50ms);
  REQUIRE(running == 0);
  {
    std::lock_guard lock(failure_mutex);
    INFO(failure);
    REQUIRE(failure.empty());
  }
  cluster.wait_ok();
  const auto outcome = verify(side, seed, ledger, pattern, large);
  const auto crashed = cluster.crashed();
  std::printf(
      "%s: %llu DMA.SETs acknowledged (OK and WAIT 1), %llu refused (the client was told); %llu keys read back: "
      "%llu verified, %llu lost, %llu corrupt; %llu reads during the load (%llu refused, %llu stale); %zu servers "
      "crashed; %.1f s\n",
      scenario, static_cast<unsigned long long>(ledger.acknowledged), static_cast<unsigned long long>(ledger.refused),
      static_cast<unsigned long long>(outcome.verified + outcome.lost + outcome.corrupt),
      static_cast<unsigned long long>(outcome.verified), static_cast<unsigned long long>(outcome.lost),
      static_cast<unsigned long long>(outcome.corrupt), static_cast<unsigned long long>(ledger.reads),
      static_cast<unsigned long long>(ledger.reads_refused), static_cast<unsigned long long>(ledger.stale),
      crashed.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  std::printf("%s: the clients followed %llu MOVED and %llu ASK, and retried %llu times\n", scenario,
              static_cast<unsigned long long>(ledger.followed.moved),
              static_cast<unsigned long long>(ledger.followed.asked),
              static_cast<unsigned long long>(ledger.followed.retries));
  if (!ledger.first_refusal.empty()) std::printf("%s: first refusal: %s\n", scenario, ledger.first_refusal.c_str());
  if (!ledger.first_read_refusal.empty()) {
    std::printf("%s: first refused read: %s\n", scenario, ledger.first_read_refusal.c_str());
  }
  std::fflush(stdout);
  CHECK(ledger.acknowledged > 0);
  CHECK(outcome.verified > 0);
  CHECK(outcome.lost == 0);
  CHECK(outcome.corrupt == 0);
  CHECK(ledger.stale == 0);
  CHECK(crashed.empty());
  if (hot) CHECK(ledger.followed.moved + ledger.followed.asked > 0);
}

bool role_is(std::uint16_t port, const std::string& role) {
  try {
    Resp resp(port);
    return field_of(resp.command({"INFO", "replication"}).text, "role") == role;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

TEST_CASE("under load, a manual CLUSTER FAILOVER loses no acknowledged value", "[cluster][load]") {
  Cluster cluster(2000);
  const NodeLine primary = cluster.primary_of("x");
  const NodeLine replica = cluster.replica_of(primary);
  under_load("failover", cluster, false, [&] {
    Resp promoted(replica.port);
    require_ok(promoted.command({"CLUSTER", "FAILOVER"}));
    until([&] { return role_is(replica.port, "master"); }, 60s);
  });
}

TEST_CASE("under load, kill -9 of a primary and its replica's promotion lose no acknowledged value",
          "[cluster][load]") {
  Cluster cluster(2000);
  const NodeLine primary = cluster.primary_of("x");
  const NodeLine replica = cluster.replica_of(primary);
  under_load("kill", cluster, false, [&] {
    cluster.kill(primary.port);
    until([&] { return role_is(replica.port, "master"); }, 60s);
  });
}

TEST_CASE("under load with 8 MiB values, redis-cli --cluster reshard of 300 slots loses no acknowledged value",
          "[cluster][load]") {
  Cluster cluster(2000);
  const NodeLine from = cluster.primary_of("x");
  const NodeLine to = cluster.other_primary(from);
  // redis-cli moves a source's lowest slots first: half of the keys live in them.
  REQUIRE(!from.slots.empty());
  const int first = from.slots.front().first;
  constexpr int moved_slots = 300;
  under_load(
      "reshard", cluster, true,
      [&] {
        Child run({"redis-cli", "--cluster", "reshard", "127.0.0.1:" + std::to_string(from.port), "--cluster-from",
                   from.id, "--cluster-to", to.id, "--cluster-slots", std::to_string(moved_slots), "--cluster-yes",
                   "--cluster-timeout", "20000"});
        const std::string out = run.rest(120s);
        INFO("redis-cli --cluster reshard printed:\n" << out.substr(out.size() > 4000 ? out.size() - 4000 : 0));
        REQUIRE(run.wait(20s) == 0);
      },
      std::pair{first, first + moved_slots - 1});
}

int main(int argc, char* argv[]) {
  if (!on_path("redis-cli")) {
    std::printf("redis-cli not found: apt-get install redis-tools; skipped\n");
    return 77;
  }
  return module_test::run_suite(argc, argv);
}
