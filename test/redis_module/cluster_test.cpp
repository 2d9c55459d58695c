// The module in a cluster (redis-module-cluster): three primaries with a replica each on 127.0.0.1,
// made a cluster by `redis-cli --cluster create` and stopped by their PIDs. DMA.SET and DMA.GET
// are routed by their key; a value DMA.SET stored reaches the replica (WAIT), which serves it
// after READONLY; a DMA.SET whose slot moves while its bytes are moving answers TRYAGAIN and
// stores nothing; a manual failover with a DMA.SET in flight leaves no acknowledged value behind.
// Exits 77 (skipped) when the server program or redis-cli is missing.
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "cluster.hpp"
#include "../source_root.hpp"
#include "harness.hpp"

#include <fstream>

namespace {

using namespace module_test;

// Fills a peer's buffer with the key's pattern and returns it.
std::string fill(Peer& peer, const std::string& key, std::size_t size) {
  const std::string value = pattern_text(key, size);
  std::memcpy(peer.memory().data(), value.data(), size);
  return value;
}

}  // namespace

TEST_CASE("DMA.SET and DMA.GET go by their key; WAIT puts the value on the replica, which serves it after READONLY",
          "[cluster]") {
  constexpr std::size_t size = 64 << 10;
  Cluster cluster;
  const std::string key = "cluster-key";
  const NodeLine owner = cluster.primary_of(key);
  const NodeLine replica = cluster.replica_of(owner);
  Peer peer(size);
  const std::string value = fill(peer, key, size);

  // Another primary redirects it, as it redirects SET.
  Resp elsewhere(cluster.other_primary(owner).port);
  hello(elsewhere, peer);
  require_error(elsewhere.command(peer.window("DMA.SET", key, size)), "MOVED " + std::to_string(cluster.slot_of(key)));

  Resp setter(owner.port);
  hello(setter, peer);
  require_ok(setter.command(peer.window("DMA.SET", key, size)));
  CHECK(setter.command({"WAIT", "1", "20000"}).integer == 1);

  Resp reader(replica.port);
  require_ok(reader.command({"READONLY"}));
  CHECK(reader.command({"GET", key}).text == value);
  Peer into(size);
  hello(reader, into);
  const auto got = reader.command(into.window("DMA.GET", key, size));
  INFO("DMA.GET on the replica replied " << got.text);
  REQUIRE(got.type == dma::kv::resp::Reply::Type::array);
  CHECK(got.elements[0].integer == static_cast<long long>(size));
  CHECK(std::memcmp(into.memory().data(), value.data(), size) == 0);
}

TEST_CASE(
    "a DMA.SET whose slot moves during the transfer answers TRYAGAIN, stores nothing, and succeeds at the new "
    "owner",
    "[cluster]") {
  constexpr std::size_t size = 8 << 20;
  Cluster cluster;
  const std::string key = "moving-key";
  const NodeLine from = cluster.primary_of(key);
  const NodeLine to = cluster.other_primary(from);
  const std::string slot = std::to_string(cluster.slot_of(key));
  Peer peer(size, false);
  const std::string value = fill(peer, key, size);

  Resp setter(from.port);
  Resp old_owner(from.port);
  Resp new_owner(to.port);
  send_held_set(setter, old_owner, peer, key, size);
  // The slot holds no key yet: it moves without MIGRATE, as redis-cli --cluster reshard moves it.
  require_ok(new_owner.command({"CLUSTER", "SETSLOT", slot, "IMPORTING", from.id}));
  require_ok(old_owner.command({"CLUSTER", "SETSLOT", slot, "MIGRATING", to.id}));
  require_ok(new_owner.command({"CLUSTER", "SETSLOT", slot, "NODE", to.id}));
  require_ok(old_owner.command({"CLUSTER", "SETSLOT", slot, "NODE", to.id}));
  peer.resume();
  require_error(setter.reply(), "TRYAGAIN");
  CHECK(info_value(old_owner, "sets_refused_not_served") == 1);
  CHECK(old_owner.command({"DBSIZE"}).integer == 0);
  CHECK(new_owner.command({"EXISTS", key}).integer == 0);

  // Sent again, the old owner redirects it, and the new one stores it.
  require_error(setter.command(peer.window("DMA.SET", key, size)), "MOVED " + slot);
  Resp retry(to.port);
  hello(retry, peer);
  require_ok(retry.command(peer.window("DMA.SET", key, size)));
  CHECK(new_owner.command({"GET", key}).text == value);
}

TEST_CASE("a manual failover with a DMA.SET in flight answers the client an error and stores nothing", "[cluster]") {
  constexpr std::size_t size = 8 << 20;
  Cluster cluster;
  const std::string key = "failover-key";
  const NodeLine owner = cluster.primary_of(key);
  const NodeLine replica = cluster.replica_of(owner);
  Peer peer(size, false);
  fill(peer, key, size);

  Resp setter(owner.port);
  Resp old_primary(owner.port);
  send_held_set(setter, old_primary, peer, key, size);
  Resp promoted(replica.port);
  require_ok(promoted.command({"CLUSTER", "FAILOVER"}));
  // The old primary pauses writes, its replica takes over, and the old primary, demoted, answers
  // its blocked clients -UNBLOCKED.
  const auto reply = setter.reply();
  INFO("the DMA.SET in flight got " << reply.text);
  REQUIRE(reply.is_error());
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (field_of(promoted.command({"INFO", "replication"}).text, "role") != "master") {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(20ms);
  }
  peer.resume();  // the read completes with nobody to answer: the old primary frees its value
  CHECK(wait_for(old_primary, "dma_sets_in_flight", 0) == 0);
  CHECK(old_primary.command({"PING"}).text == "PONG");
  CHECK(promoted.command({"EXISTS", key}).integer == 0);
}

TEST_CASE("redis-py's RedisCluster stores a value with DMA.SET, routed by its key, and reads it back with GET",
          "[cluster]") {
  constexpr std::size_t size = 4096;
  Cluster cluster;
  const std::string key = "routed-by-redis-py";
  Peer peer(size);
  const std::string value = fill(peer, key, size);
  Scratch scratch;
  const std::string out = scratch.path() + "/value";
  // Debian's python3-redis belongs to Debian's python3.
  const std::string python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  Child run({python, test::source_root() + "/test/redis_module/cluster_client.py",
             std::to_string(cluster.primary_of("another-key").port), key, peer.address_hex(), peer.rkey(),
             peer.offset(), std::to_string(size), out});
  const std::string printed = run.rest(120s);
  INFO("cluster_client.py printed:\n" << printed);
  REQUIRE(run.wait(20s) == 0);
  std::ifstream in(out, std::ios::binary);
  const std::string landed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(landed == value);
}

int main(int argc, char* argv[]) {
  if (!on_path("redis-cli")) {
    std::printf("redis-cli not found: apt-get install redis-tools; skipped\n");
    return 77;
  }
  return module_test::run_suite(argc, argv);
}
