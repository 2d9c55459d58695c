// A loopback cluster for the module suites: six nodes with the module loaded (three primaries with
// a replica each, made by `redis-cli --cluster create`), on free ports whose bus ports are free
// too, stopped by their PIDs; and CLUSTER NODES as a node sees it.
#pragma once

#include "harness.hpp"

#include <csignal>
#include <set>
#include <sstream>

namespace module_test {

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
  explicit Cluster(int node_timeout_ms = 5000) {
    std::vector<std::string> create{"redis-cli", "--cluster", "create"};
    for (int i = 0; i < 6; ++i) {
      nodes_.push_back(std::make_unique<ModuleServer>(
          std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                   "--cluster-node-timeout", std::to_string(node_timeout_ms)},
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

  std::vector<std::unique_ptr<ModuleServer>>& nodes() noexcept { return nodes_; }

  /// `kill -9` of the node on `port`.
  void kill(std::uint16_t port) {
    by_port(port).child().signal(SIGKILL);
    REQUIRE(by_port(port).child().wait(20s) == 128 + SIGKILL);
    stopped_.insert(port);
  }

  /// The nodes not killed that exited or stopped answering PING.
  std::vector<std::uint16_t> crashed() {
    std::vector<std::uint16_t> out;
    for (const auto& node : nodes_) {
      if (stopped_.contains(node->port())) continue;
      if (node->child().wait(0ms) != -1 || !answers_ping(node->port())) out.push_back(node->port());
    }
    return out;
  }

  /// Until every node that still runs sees all 16384 slots served and the cluster ok.
  void wait_ok(std::chrono::seconds bound = 60s) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
      bool ok = true;
      for (const auto& node : nodes_) {
        if (stopped_.contains(node->port())) continue;
        try {
          Resp resp(node->port());
          const std::string info(resp.command({"CLUSTER", "INFO"}).text);
          ok = ok && field_of(info, "cluster_state") == "ok" && field_of(info, "cluster_slots_ok") == "16384";
        } catch (const std::exception&) {
          ok = false;
        }
      }
      if (ok) return;
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(50ms);
    }
  }

 private:
  std::vector<std::unique_ptr<ModuleServer>> nodes_;
  std::set<std::uint16_t> stopped_;
};

}  // namespace module_test
