#include "dma/kv/cluster_client.hpp"

#include "dma/config.hpp"
#include "dma/kv/protocol.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/dispatch.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <set>

// g++ 12 takes an Asio 1.22 coroutine frame, allocated and freed by the frame's own operators, for
// a mismatched new and delete (-Wmismatched-new-delete), depending on what it inlines: a false
// positive (test/meson.build turns it off for the guide's program for the same reason).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace dma::kv {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto tuple_awaitable = dma::compat::as_tuple(asio::use_awaitable);

std::string node_key(std::string_view host, std::uint16_t port) {
  return std::string(host) + ":" + std::to_string(port);
}

// The longest one reading of the slot map may take from one node.
constexpr auto map_read_deadline = std::chrono::seconds(2);
// Slot maps are read again at most this often, however many commands ask for it.
constexpr auto refresh_spacing = std::chrono::milliseconds(50);
// Less time than this left, a command makes no further attempt.
constexpr auto least_attempt = std::chrono::milliseconds(5);

// A slot map: which node serves each slot, and its replicas.
struct SlotMap {
  struct Shard {
    std::string primary;
    std::vector<std::string> replicas;
  };
  std::vector<Shard> shards;
  std::array<std::int16_t, cluster_slots> slot_shard{};

  SlotMap() { slot_shard.fill(-1); }

  int shard_of_primary(const std::string& node) const {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      if (shards[i].primary == node) return static_cast<int>(i);
    }
    return -1;
  }
  void assign(int first, int last, int shard) {
    for (int s = std::max(first, 0); s <= std::min(last, cluster_slots - 1); ++s)
      slot_shard[static_cast<std::size_t>(s)] = static_cast<std::int16_t>(shard);
  }
};

// A field of a RESP map sent as a flat array (CLUSTER SHARDS).
const resp::Value* field(const resp::Value& map, std::string_view name) {
  if (map.type != resp::Reply::Type::array) return nullptr;
  for (std::size_t i = 0; i + 1 < map.elements.size(); i += 2) {
    if (map.elements[i].text == name) return &map.elements[i + 1];
  }
  return nullptr;
}

std::int64_t integer_of(const resp::Value* value) {
  if (value == nullptr) return -1;
  if (value->type == resp::Reply::Type::integer) return value->integer;
  const auto parsed = parse_u64(value->text);
  return parsed ? static_cast<std::int64_t>(*parsed) : -1;
}

// The address a node is reached at: its preferred endpoint, else its IP, else the node that
// answered (an empty or "?" endpoint means "the address you asked me at").
std::string address_of(std::string_view endpoint, std::string_view ip, std::string_view asked) {
  if (!endpoint.empty() && endpoint != "?") return std::string(endpoint);
  if (!ip.empty() && ip != "?") return std::string(ip);
  return std::string(asked);
}

// CLUSTER SHARDS (Redis 7, Valkey 7+): shards of alternating names and values.
std::string read_shards(const resp::Value& reply, std::string_view asked, SlotMap& map) {
  if (reply.type != resp::Reply::Type::array) return "CLUSTER SHARDS: the reply is not an array";
  for (const auto& shard : reply.elements) {
    const auto* slots = field(shard, "slots");
    const auto* nodes = field(shard, "nodes");
    if (slots == nullptr || nodes == nullptr || nodes->type != resp::Reply::Type::array) {
      return "CLUSTER SHARDS: a shard without slots or nodes";
    }
    SlotMap::Shard entry;
    bool primary_healthy = false;
    for (const auto& node : nodes->elements) {
      const auto* role = field(node, "role");
      const auto* health = field(node, "health");
      const auto port = integer_of(field(node, "port"));
      if (role == nullptr || port <= 0 || port > 65535) continue;
      const auto* endpoint = field(node, "endpoint");
      const auto* ip = field(node, "ip");
      const std::string address = node_key(address_of(endpoint ? endpoint->text : "", ip ? ip->text : "", asked),
                                           static_cast<std::uint16_t>(port));
      const bool healthy = health == nullptr || health->text == "online";
      if (role->text == "master") {
        // A failed old primary may be listed beside the one that replaced it.
        if (entry.primary.empty() || (healthy && !primary_healthy)) {
          entry.primary = address;
          primary_healthy = healthy;
        }
      } else if (healthy) {
        entry.replicas.push_back(address);
      }
    }
    if (entry.primary.empty() || slots->elements.empty()) continue;
    const int index = static_cast<int>(map.shards.size());
    map.shards.push_back(std::move(entry));
    for (std::size_t i = 0; i + 1 < slots->elements.size(); i += 2) {
      map.assign(static_cast<int>(integer_of(&slots->elements[i])),
                 static_cast<int>(integer_of(&slots->elements[i + 1])), index);
    }
  }
  return map.shards.empty() ? "CLUSTER SHARDS: no shard serves a slot" : "";
}

// CLUSTER SLOTS (every cluster version): ranges, each with its primary and replicas.
std::string read_slots(const resp::Value& reply, std::string_view asked, SlotMap& map) {
  if (reply.type != resp::Reply::Type::array) return "CLUSTER SLOTS: the reply is not an array";
  for (const auto& range : reply.elements) {
    if (range.type != resp::Reply::Type::array || range.elements.size() < 3) return "CLUSTER SLOTS: a short range";
    std::vector<std::string> nodes;
    for (std::size_t i = 2; i < range.elements.size(); ++i) {
      const auto& node = range.elements[i];
      if (node.type != resp::Reply::Type::array || node.elements.size() < 2) continue;
      const auto port = integer_of(&node.elements[1]);
      if (port <= 0 || port > 65535) continue;
      nodes.push_back(node_key(address_of(node.elements[0].text, "", asked), static_cast<std::uint16_t>(port)));
    }
    if (nodes.empty()) continue;
    int index = map.shard_of_primary(nodes.front());
    if (index < 0) {
      index = static_cast<int>(map.shards.size());
      map.shards.push_back({nodes.front(), std::vector<std::string>(nodes.begin() + 1, nodes.end())});
    }
    map.assign(static_cast<int>(integer_of(&range.elements[0])), static_cast<int>(integer_of(&range.elements[1])),
               index);
  }
  return map.shards.empty() ? "CLUSTER SLOTS: no node serves a slot" : "";
}

std::pair<std::string, std::uint16_t> split_node(const std::string& node) {
  const auto colon = node.rfind(':');
  return {node.substr(0, colon), static_cast<std::uint16_t>(std::stoi(node.substr(colon + 1)))};
}

// What to do after an attempt failed with `ec`.
enum class Next { give_up, redirect, again, reconnect };

// An error reply the node gives while its role or state changes, and no longer once it is done:
// a blocked command ended by a failover (`UNBLOCKED`: nothing stored), a node loading its data, a
// replica whose primary is down.
bool transient_reply(std::string_view detail) {
  for (const std::string_view code : {"UNBLOCKED ", "LOADING ", "MASTERDOWN "}) {
    if (detail.starts_with(code)) return true;
    for (auto at = detail.find(code); at != std::string_view::npos; at = detail.find(code, at + 1)) {
      if (at >= 2 && detail.substr(at - 2, 2) == ": ") return true;
    }
  }
  return false;
}

Next next_after(std::error_code ec, std::string_view detail) {
  if (ec.category() != client_category()) return Next::give_up;
  switch (static_cast<client_error>(ec.value())) {
    case client_error::redirected:
      return Next::redirect;
    case client_error::try_again:
    case client_error::cluster_down:
      return Next::again;
    case client_error::no_hello:
    case client_error::server_gone:
    case client_error::not_connected:
    case client_error::aborted:
      return Next::reconnect;
    case client_error::server_error:
    case client_error::not_replicated:  // a WAIT a failover ended: send the whole DMA.SET again
      return transient_reply(detail) ? Next::again : Next::give_up;
    default:
      return Next::give_up;
  }
}

}  // namespace

struct ClusterClient::Impl : std::enable_shared_from_this<Impl> {
  /// Something commands wait for together (a node's connection attempt, a reading of the map):
  /// each waits on a timer of its own, up to its own deadline; notify() ends every wait.
  struct Event {
    std::set<asio::steady_timer*> waiting;
    void notify() {
      for (auto* timer : waiting)
        timer->cancel();
    }
  };

  // A node the client has talked to: its connection once one is open (and HELLOed).
  struct Node {
    std::string host;
    std::uint16_t port = 0;
    std::shared_ptr<Client> client;   ///< open and past its DMA.HELLO, or null
    std::shared_ptr<Client> opening;  ///< the connection being opened, while `connecting`
    bool connecting = false;
    Event ready;            ///< notified when a connection attempt ends
    std::error_code error;  ///< the last attempt's
    std::string detail;
    Clock::time_point failed_at{};
  };

  Impl(const executor_type& executor, ClientTarget& t, const ClusterOptions& o)
      : inner(executor), strand(asio::make_strand(executor)), target(t), options(o) {}

  /// Waits until `event` is notified, `until` passes, or the client closes.
  asio::awaitable<void> wait_for(Event& event, Clock::time_point until) {
    asio::steady_timer timer(strand, until);
    event.waiting.insert(&timer);
    struct Leave {
      Event& event;
      asio::steady_timer* timer;
      ~Leave() { event.waiting.erase(timer); }
    } leave{event, &timer};
    co_await timer.async_wait(tuple_awaitable);
  }

  /// Closes `client` unless it is done within `limit` (its connect has no deadline of its own).
  void limit(const std::shared_ptr<Client>& client, asio::steady_timer& timer, std::chrono::milliseconds length,
             const std::shared_ptr<bool>& expired) {
    timer.expires_after(length);
    timer.async_wait([weak = std::weak_ptr<Client>(client), expired](std::error_code ec) {
      if (ec) return;
      *expired = true;
      if (auto c = weak.lock()) c->close();
    });
  }

  // ---- nodes ----------------------------------------------------------------------------------

  Node& node(const std::string& key) {
    auto& slot = nodes[key];
    if (!slot) {
      slot = std::make_unique<Node>();
      std::tie(slot->host, slot->port) = split_node(key);
    }
    return *slot;
  }

  /// The node's connection: the open one, or one opened for it (connect, DMA.HELLO, READONLY
  /// when reads go to replicas), waited for until `until`; null with the error otherwise.
  asio::awaitable<std::shared_ptr<Client>> connected(Node& n, Clock::time_point until, std::error_code& ec,
                                                     std::string& detail) {
    if (!(n.client && n.client->is_open()) && !closed) {
      n.client.reset();
      if (!n.connecting) {
        n.connecting = true;
        asio::co_spawn(
            strand, [self = shared_from_this(), &n] { return self->open(n); }, asio::detached);
      }
      for (int waits = 0; n.connecting && !closed && Clock::now() < until && waits < 100; ++waits) {
        co_await wait_for(n.ready, until);
      }
    }
    if (closed) {
      ec = client_error::aborted;
      detail = "the cluster client was closed";
      co_return nullptr;
    }
    if (n.client && n.client->is_open()) co_return n.client;
    if (n.connecting) {
      ec = client_error::timed_out;
      detail = "connecting to " + node_key(n.host, n.port) + " took longer than the command's deadline";
    } else {
      ec = n.error ? n.error : make_error_code(client_error::not_connected);
      detail = n.detail;
    }
    co_return nullptr;
  }

  /// One connection attempt to a node, shared by the commands that wait for it.
  asio::awaitable<void> open(Node& n) {
    auto client = std::make_shared<Client>(inner, target, options.client);
    n.opening = client;
    const auto name = node_key(n.host, n.port);
    asio::steady_timer timer(strand);
    auto expired = std::make_shared<bool>(false);
    limit(client, timer, options.connect_timeout, expired);
    std::error_code ec;
    std::string detail;
    std::tie(ec) = co_await client->async_connect(n.host, n.port, tuple_awaitable);
    if (ec) {
      detail = "connecting to " + name + ": " + ec.message();
    } else {
      auto [hello_ec, hello] = co_await client->async_hello(tuple_awaitable);
      ec = hello_ec;
      if (ec) detail = "DMA.HELLO to " + name + ": " + hello.detail;
    }
    if (!ec && options.read_from_replicas) {
      std::vector<std::string> command(1, "READONLY");  // built apart: g++ 12 fails on a braced list in co_await
      auto [readonly_ec, readonly] = co_await client->async_command(std::move(command), tuple_awaitable);
      ec = readonly_ec;
      if (ec) detail = "READONLY to " + name + ": " + readonly.detail;
    }
    timer.cancel();
    if (*expired) {
      ec = client_error::timed_out;
      detail = "connecting to " + name + " (and its DMA.HELLO) took longer than connect_timeout (" +
               std::to_string(options.connect_timeout.count()) + " ms)";
    }
    n.opening.reset();
    n.connecting = false;
    n.error = ec;
    n.detail = detail;
    if (ec || closed) {
      client->close();
      n.failed_at = Clock::now();
    } else {
      connections.fetch_add(1, std::memory_order_relaxed);
      n.client = client;
    }
    n.ready.notify();
  }

  /// Forgets `client` as its node's connection (it broke, or its server lost the HELLO).
  void drop(Node& n, const std::shared_ptr<Client>& client) {
    if (n.client == client) {
      n.client.reset();
      n.failed_at = Clock::now();
    }
    client->close();
  }

  // ---- the slot map ---------------------------------------------------------------------------

  /// The node for `slot`: its primary, or a replica for a read when reads go to replicas.
  std::string route(int slot, bool read) {
    std::lock_guard lock(map_mutex);
    const int shard = map.slot_shard[static_cast<std::size_t>(slot)];
    if (shard < 0) return {};
    const auto& entry = map.shards[static_cast<std::size_t>(shard)];
    if (read && options.read_from_replicas && !entry.replicas.empty()) {
      const auto& replica = entry.replicas[next_replica++ % entry.replicas.size()];
      const auto it = nodes.find(replica);
      // A replica that failed a moment ago is left alone for a while: the primary answers.
      if (it == nodes.end() || Clock::now() - it->second->failed_at > options.retry_most) return replica;
    }
    return entry.primary;
  }

  /// Points `slot` at `node` (a `-MOVED`), until the next reading of the map says more.
  void moved(int slot, const std::string& node) {
    std::lock_guard lock(map_mutex);
    int shard = map.shard_of_primary(node);
    if (shard < 0) {
      shard = static_cast<int>(map.shards.size());
      map.shards.push_back({node, {}});
    }
    map.slot_shard[static_cast<std::size_t>(slot)] = static_cast<std::int16_t>(shard);
  }

  /// Starts a reading of the slot map unless one runs or one ended within refresh_spacing.
  void start_refresh() {
    if (refreshing || closed || Clock::now() - last_refresh < refresh_spacing) return;
    refreshing = true;
    asio::co_spawn(
        strand, [self = shared_from_this()] { return self->read_again(); }, asio::detached);
  }

  /// Reads the slot map again (or waits for the reading under way), until `until`; returns what
  /// went wrong with the last reading, empty if nothing did.
  asio::awaitable<std::string> refresh(Clock::time_point until) {
    start_refresh();
    for (int waits = 0; refreshing && !closed && Clock::now() < until && waits < 100; ++waits) {
      co_await wait_for(refreshed, until);
    }
    co_return last_refresh_error;
  }

  /// One reading of the map, from the first node that answers (the seeds last).
  asio::awaitable<void> read_again() {
    std::vector<std::string> candidates;
    {
      std::lock_guard lock(map_mutex);
      for (const auto& shard : map.shards) {
        candidates.push_back(shard.primary);
        candidates.insert(candidates.end(), shard.replicas.begin(), shard.replicas.end());
      }
    }
    candidates.insert(candidates.end(), seeds.begin(), seeds.end());
    std::set<std::string> tried;
    std::string error = "no node to read the slot map from";
    for (const auto& candidate : candidates) {
      if (closed) break;
      if (!tried.insert(candidate).second) continue;
      SlotMap fresh;
      error = co_await read_map(candidate, fresh);
      if (error.empty()) {
        std::lock_guard lock(map_mutex);
        map = std::move(fresh);
        break;
      }
    }
    refreshes.fetch_add(1, std::memory_order_relaxed);
    last_refresh = Clock::now();
    last_refresh_error = error;
    refreshing = false;
    refreshed.notify();
  }

  /// One node's slot map, over a connection of its own (not behind a node's transfers), within
  /// map_read_deadline.
  asio::awaitable<std::string> read_map(const std::string& address, SlotMap& fresh) {
    ClientOptions quick = options.client;
    quick.deadline = map_read_deadline;
    quick.max_reply = std::max<std::size_t>(quick.max_reply, std::size_t{4} << 20);
    auto client = std::make_shared<Client>(inner, quick);
    temporaries.insert(client.get());
    struct Leave {
      std::set<Client*>& set;
      Client* client;
      ~Leave() { set.erase(client); }
    } leave{temporaries, client.get()};
    asio::steady_timer timer(strand);
    auto expired = std::make_shared<bool>(false);
    limit(client, timer, map_read_deadline, expired);
    const auto [host, port] = split_node(address);
    auto [ec] = co_await client->async_connect(host, port, tuple_awaitable);
    if (ec) {
      co_return "connecting to " + address + ": " + (*expired ? std::string("no answer in time") : ec.message());
    }
    std::vector<std::string> shards_command{std::string("CLUSTER"), std::string("SHARDS")};
    auto [shards_ec, shards] = co_await client->async_command(std::move(shards_command), tuple_awaitable);
    std::string error;
    if (!shards_ec) {
      error = read_shards(shards.reply, host, fresh);
    } else if (shards.reply.is_error()) {
      // A server without CLUSTER SHARDS (before Redis 7) knows CLUSTER SLOTS.
      fresh = SlotMap();
      std::vector<std::string> slots_command{std::string("CLUSTER"), std::string("SLOTS")};
      auto [slots_ec, slots] = co_await client->async_command(std::move(slots_command), tuple_awaitable);
      error = slots_ec ? address + ": " + slots.detail : read_slots(slots.reply, host, fresh);
    } else {
      error = address + ": " + shards.detail;
    }
    client->close();
    co_return error;
  }

  // ---- a command --------------------------------------------------------------------------------

  template <typename Result>
  static Result with_detail(const std::string& detail) {
    Result result;
    result.detail = detail;
    return result;
  }

  /// Runs one DMA.SET or DMA.GET to its end: routes, redirects, retries.
  template <typename Request, typename Result>
  asio::awaitable<std::pair<std::error_code, Result>> run(std::string key, Request request) {
    const bool read = std::is_same_v<Request, GetRequest>;
    const auto length = request.deadline.count() > 0 ? request.deadline : options.client.deadline;
    const auto start = Clock::now();
    const auto end = length.count() > 0 ? start + length : Clock::time_point::max();
    const int slot = key_slot(key);
    request.key = key;
    if (options.map_age.count() > 0 && start - last_refresh > options.map_age) start_refresh();
    std::string redirected_to;  // the next attempt's node, from a redirect
    bool asking = false;
    bool refresh_wanted = false;
    unsigned redirects = 0;
    auto pause = options.retry_first;
    std::error_code ec = client_error::timed_out;
    Result result = with_detail<Result>("no time was left for an attempt");
    const unsigned attempts = std::max(1u, options.max_attempts);
    unsigned attempt = 0;
    for (; attempt < attempts; ++attempt) {
      if (closed) {
        co_return std::pair{make_error_code(client_error::aborted),
                            with_detail<Result>("the cluster client was closed")};
      }
      // An attempt with almost no time left would only close a shared connection at its deadline.
      if (end != Clock::time_point::max() && end - Clock::now() < least_attempt) break;
      std::string address = redirected_to.empty() ? route(slot, read) : redirected_to;
      redirected_to.clear();
      if (address.empty()) {
        const auto why = co_await refresh(end);
        address = route(slot, read);
        if (address.empty()) {
          ec = client_error::cluster_down;
          result = with_detail<Result>("no node serves slot " + std::to_string(slot) +
                                       (why.empty() ? std::string() : " (" + why + ")"));
        }
      }
      if (!address.empty()) {
        Node& n = node(address);
        std::string detail;
        auto client = co_await connected(n, end, ec, detail);
        if (!client) {
          result = with_detail<Result>(std::move(detail));
          if (closed) co_return std::pair{ec, std::move(result)};
          asking = false;
          refresh_wanted = true;  // a node that cannot be reached may have been replaced
        } else {
          Request attempt_request = request;
          attempt_request.asking = asking;
          asking = false;
          if (end != Clock::time_point::max()) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now());
            attempt_request.deadline = std::max(left, std::chrono::milliseconds(1));
          }
          std::tie(ec, result) = co_await perform(*client, attempt_request);
          if (!ec) {
            if (read && address != primary_of(slot)) replica_reads.fetch_add(1, std::memory_order_relaxed);
            co_return std::pair{ec, std::move(result)};
          }
          switch (next_after(ec, result.detail)) {
            case Next::give_up:
              co_return std::pair{ec, std::move(result)};
            case Next::redirect: {
              const auto redirect = parse_redirect(result.detail);
              if (!redirect || ++redirects > options.max_redirects) {
                if (redirect) result.detail += " (after " + std::to_string(redirects - 1) + " redirects)";
                co_return std::pair{ec, std::move(result)};
              }
              redirected_to = node_key(redirect->host.empty() ? n.host : redirect->host, redirect->port);
              if (redirect->ask) {
                asking = true;
                asked.fetch_add(1, std::memory_order_relaxed);
              } else {
                moved(redirect->slot, redirected_to);
                moved_count.fetch_add(1, std::memory_order_relaxed);
                start_refresh();  // in the background: this command goes on at once
              }
              continue;
            }
            case Next::reconnect:
              drop(n, client);
              refresh_wanted = true;
              break;
            case Next::again:
              if (ec != client_error::try_again) {
                refresh_wanted = true;       // the slot's owner may have changed
                n.failed_at = Clock::now();  // reads go to the primary for a while
              }
              break;
          }
        }
      }
      // Wait, then try again: the cluster needs time to fail over, finish a move, come back up.
      if (closed || Clock::now() + pause >= end) break;
      retries.fetch_add(1, std::memory_order_relaxed);
      co_await back_off(pause);
      pause = std::min(pause * 2, std::max(options.retry_most, options.retry_first));
      if (refresh_wanted) {
        refresh_wanted = false;
        co_await refresh(end);
      }
    }
    if (closed) {
      co_return std::pair{make_error_code(client_error::aborted), with_detail<Result>("the cluster client was closed")};
    }
    const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    result.detail += " (gave up after " + std::to_string(std::min(attempt + 1, attempts)) + " attempts in " +
                     std::to_string(spent.count()) + " ms)";
    co_return std::pair{ec, std::move(result)};
  }

  std::string primary_of(int slot) {
    std::lock_guard lock(map_mutex);
    const int shard = map.slot_shard[static_cast<std::size_t>(slot)];
    return shard < 0 ? std::string() : map.shards[static_cast<std::size_t>(shard)].primary;
  }

  static asio::awaitable<std::tuple<std::error_code, SetResult>> perform(Client& client, const SetRequest& request) {
    co_return co_await client.async_set(request, tuple_awaitable);
  }
  static asio::awaitable<std::tuple<std::error_code, GetResult>> perform(Client& client, const GetRequest& request) {
    co_return co_await client.async_get(request, tuple_awaitable);
  }

  asio::awaitable<void> back_off(std::chrono::milliseconds pause) { co_await wait_for(pausing, Clock::now() + pause); }

  // Runs `body` on the strand and hands its outcome to `completion`; an exception (a
  // cancellation seen at an await) becomes operation_aborted.
  template <typename Result, typename Body>
  static void spawn(const std::shared_ptr<Impl>& impl, detail::CompletionPtr<Result> completion,
                    asio::cancellation_slot slot, Body body) {
    impl->pending.fetch_add(1, std::memory_order_relaxed);
    auto done = [impl, c = std::move(completion)](const std::exception_ptr& error,
                                                  std::pair<std::error_code, Result> outcome) mutable {
      impl->pending.fetch_sub(1, std::memory_order_relaxed);
      if (error) {
        outcome.first = asio::error::operation_aborted;
        outcome.second.detail = "cancelled";
      }
      detail::finish(std::move(c), outcome.first, std::move(outcome.second));
    };
    if (slot.is_connected()) {
      asio::co_spawn(impl->strand, std::move(body), asio::bind_cancellation_slot(slot, std::move(done)));
    } else {
      asio::co_spawn(impl->strand, std::move(body), std::move(done));
    }
  }

  void close() {
    closed = true;
    for (auto& [key, n] : nodes) {
      if (n->client) n->client->close();
      if (n->opening) n->opening->close();
      n->client.reset();
      n->ready.notify();
    }
    for (auto* client : temporaries)
      client->close();
    pausing.notify();
    refreshed.notify();
  }

  executor_type inner;
  asio::strand<executor_type> strand;
  ClientTarget& target;
  ClusterOptions options;
  std::vector<std::string> seeds;
  std::map<std::string, std::unique_ptr<Node>> nodes;
  mutable std::mutex map_mutex;  ///< map: read from other threads (primaries(), node_of())
  SlotMap map;
  std::size_t next_replica = 0;
  bool refreshing = false;
  Clock::time_point last_refresh{};
  std::string last_refresh_error;
  Event refreshed;                ///< a reading of the map ended
  Event pausing;                  ///< commands between attempts
  std::set<Client*> temporaries;  ///< connections reading a map
  bool closed = false;
  std::atomic<std::size_t> pending{0};
  std::atomic<std::uint64_t> moved_count{0}, asked{0}, retries{0}, refreshes{0}, connections{0}, replica_reads{0};
};

ClusterClient::ClusterClient(const executor_type& executor, ClientTarget& target, ClusterOptions options)
    : impl_(std::make_shared<Impl>(executor, target, options)) {}

ClusterClient::~ClusterClient() {
  try {
    close();
  } catch (...) {  // no memory to queue the close: the connections end with their execution context
  }
}

ClusterClient::executor_type ClusterClient::get_executor() const noexcept { return impl_->inner; }

void ClusterClient::close() {
  asio::dispatch(impl_->strand, [impl = impl_] { impl->close(); });
}

std::size_t ClusterClient::pending() const noexcept { return impl_->pending.load(std::memory_order_relaxed); }

ClusterStats ClusterClient::stats() const noexcept {
  ClusterStats s;
  s.moved = impl_->moved_count.load(std::memory_order_relaxed);
  s.asked = impl_->asked.load(std::memory_order_relaxed);
  s.retries = impl_->retries.load(std::memory_order_relaxed);
  s.refreshes = impl_->refreshes.load(std::memory_order_relaxed);
  s.connections = impl_->connections.load(std::memory_order_relaxed);
  s.replica_reads = impl_->replica_reads.load(std::memory_order_relaxed);
  return s;
}

std::vector<std::string> ClusterClient::primaries() const {
  std::lock_guard lock(impl_->map_mutex);
  std::vector<std::string> out;
  for (const auto shard : impl_->map.slot_shard) {
    if (shard < 0) continue;
    const auto& primary = impl_->map.shards[static_cast<std::size_t>(shard)].primary;
    if (std::find(out.begin(), out.end(), primary) == out.end()) out.push_back(primary);
  }
  return out;
}

std::string ClusterClient::node_of(std::string_view key) const {
  std::lock_guard lock(impl_->map_mutex);
  const int shard = impl_->map.slot_shard[static_cast<std::size_t>(key_slot(key))];
  return shard < 0 ? std::string() : impl_->map.shards[static_cast<std::size_t>(shard)].primary;
}

void ClusterClient::start_connect(std::string&& host, std::uint16_t port,
                                  detail::CompletionPtr<detail::NoResult> completion, asio::cancellation_slot slot) {
  struct Connected {
    std::string detail;
  };
  auto impl = impl_;
  auto adapt = [c = std::move(completion)](const std::exception_ptr& error,
                                           const std::pair<std::error_code, Connected>& outcome) mutable {
    detail::finish(std::move(c), error ? std::error_code(asio::error::operation_aborted) : outcome.first,
                   detail::NoResult{});
  };
  auto body = [impl, host = std::move(host), port]() -> asio::awaitable<std::pair<std::error_code, Connected>> {
    const auto seed = node_key(host, port);
    if (std::find(impl->seeds.begin(), impl->seeds.end(), seed) == impl->seeds.end()) impl->seeds.push_back(seed);
    SlotMap fresh;
    const auto error = co_await impl->read_map(seed, fresh);
    if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) {
      co_return std::pair{std::error_code(asio::error::operation_aborted), Connected{"cancelled"}};
    }
    if (!error.empty()) {
      co_return std::pair{
          make_error_code(error.starts_with("connecting") ? client_error::not_connected : client_error::protocol_error),
          Connected{error}};
    }
    {
      std::lock_guard lock(impl->map_mutex);
      impl->map = std::move(fresh);
    }
    impl->refreshes.fetch_add(1, std::memory_order_relaxed);
    impl->last_refresh = Clock::now();
    co_return std::pair{std::error_code(), Connected{}};
  };
  if (slot.is_connected()) {
    asio::co_spawn(impl_->strand, std::move(body), asio::bind_cancellation_slot(slot, std::move(adapt)));
  } else {
    asio::co_spawn(impl_->strand, std::move(body), std::move(adapt));
  }
}

void ClusterClient::start_set(std::string&& key, const SetRequest& request, detail::CompletionPtr<SetResult> completion,
                              asio::cancellation_slot slot) {
  auto impl = impl_;
  Impl::spawn<SetResult>(impl, std::move(completion), slot, [impl, key = std::move(key), request]() {
    return impl->run<SetRequest, SetResult>(key, request);
  });
}

void ClusterClient::start_get(std::string&& key, const GetRequest& request, detail::CompletionPtr<GetResult> completion,
                              asio::cancellation_slot slot) {
  auto impl = impl_;
  Impl::spawn<GetResult>(impl, std::move(completion), slot, [impl, key = std::move(key), request]() {
    return impl->run<GetRequest, GetResult>(key, request);
  });
}

}  // namespace dma::kv
