// The module in a cluster (redis-module-cluster): three primaries with a replica each on 127.0.0.1,
// made a cluster by `redis-cli --cluster create` and stopped by their PIDs. DMA.SET and DMA.GET
// are routed by their key; a value DMA.SET stored reaches the replica (WAIT), which serves it
// after READONLY; a DMA.SET whose slot moves while its bytes are moving answers TRYAGAIN and
// stores nothing; a manual failover with a DMA.SET in flight leaves no acknowledged value behind.
// Exits 77 (skipped) when the server program or redis-cli is missing.
#define CATCH_CONFIG_RUNNER  // Catch2 v2: this file has its own main
#include "../source_root.hpp"
#include "harness.hpp"

#include <fstream>

namespace {

using namespace module_test;

struct NodeLine {
  std::string id, flags, primary_id;
  std::uint16_t port = 0;
  std::vector<std::pair<int, int>> slots;  // served ranges, both ends included
};

// CLUSTER NODES as a node sees it.
std::vector<NodeLine> cluster_nodes(Resp& resp) {
  std::vector<NodeLine> nodes;
  std::stringstream in(std::string(resp.command({"CLUSTER", "NODES"}).text));
  for (std::string line; std::getline(in, line);) {
    std::stringstream fields(line);
    NodeLine node;
    std::string address, ignored;
    fields >> node.id >> address >> node.flags >> node.primary_id >> ignored >> ignored >> ignored >> ignored;
    if (node.id.empty()) continue;
    const auto colon = address.find(':');
    const auto at = address.find('@');
    if (colon == std::string::npos || at == std::string::npos) continue;
    node.port = static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1, at - colon - 1)));
    for (std::string range; fields >> range;) {
      if (range.front() == '[') continue;  // a slot being imported or migrated
      const auto dash = range.find('-');
      const int first = std::stoi(range.substr(0, dash));
      node.slots.emplace_back(first, dash == std::string::npos ? first : std::stoi(range.substr(dash + 1)));
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// Six nodes with the module loaded, made a cluster of three primaries with one replica each.
class Cluster {
 public:
  Cluster() {
    std::vector<std::string> create{"redis-cli", "--cluster", "create"};
    for (int i = 0; i < 6; ++i) {
      nodes_.push_back(
          std::make_unique<ModuleServer>(std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-config-file",
                                                                  "nodes.conf", "--cluster-node-timeout", "5000"},
                                         std::vector<std::string>{}, free_cluster_port));
      create.push_back("127.0.0.1:" + nodes_.back()->port_text());
    }
    create.insert(create.end(), {"--cluster-replicas", "1", "--cluster-yes"});
    Child run(create);
    const std::string out = run.rest(120s);
    INFO("redis-cli --cluster create printed:\n" << out);
    REQUIRE(run.wait(20s) == 0);
    // Every node sees every slot served and every node known, and every replica is in sync.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (bool ready = false; !ready;) {
      ready = true;
      for (const auto& node : nodes_) {
        Resp resp(node->port());
        const std::string info(resp.command({"CLUSTER", "INFO"}).text);
        if (field_of(info, "cluster_state") != "ok" || field_of(info, "cluster_known_nodes") != "6" ||
            field_of(info, "cluster_slots_ok") != "16384") {
          ready = false;
        } else if (field_of(resp.command({"INFO", "replication"}).text, "role") == "slave" &&
                   field_of(resp.command({"INFO", "replication"}).text, "master_link_status") != "up") {
          ready = false;
        }
      }
      if (!ready) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(50ms);
      }
    }
  }

  ModuleServer& by_port(std::uint16_t port) {
    for (auto& node : nodes_) {
      if (node->port() == port) return *node;
    }
    FAIL("no node on port " << port);
    return *nodes_.front();
  }

  int slot_of(const std::string& key) {
    Resp resp(nodes_.front()->port());
    return static_cast<int>(resp.command({"CLUSTER", "KEYSLOT", key}).integer);
  }

  // The primary serving `key`'s slot as the first node sees it.
  NodeLine primary_of(const std::string& key) {
    const int slot = slot_of(key);
    Resp resp(nodes_.front()->port());
    for (auto& node : cluster_nodes(resp)) {
      if (node.flags.find("master") == std::string::npos) continue;
      for (const auto& [first, last] : node.slots) {
        if (slot >= first && slot <= last) return node;
      }
    }
    FAIL("nobody serves slot " << slot);
    return {};
  }

  NodeLine replica_of(const NodeLine& primary) {
    Resp resp(nodes_.front()->port());
    for (auto& node : cluster_nodes(resp)) {
      if (node.primary_id == primary.id) return node;
    }
    FAIL("no replica of " << primary.id);
    return {};
  }

  NodeLine other_primary(const NodeLine& primary) {
    Resp resp(nodes_.front()->port());
    for (auto& node : cluster_nodes(resp)) {
      if (node.flags.find("master") != std::string::npos && node.id != primary.id) return node;
    }
    FAIL("no other primary");
    return {};
  }

 private:
  std::vector<std::unique_ptr<ModuleServer>> nodes_;
};

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
