/// @file
/// A client's DMA.HELLO on one server, for every RESP connection the client opens to it: the
/// fabric address under an unguessable token that HELLO returns and that a data command names with
/// `CLIENT <token>`. Cluster clients (redis-py's RedisCluster, valkey-glide) pool, multiplex and
/// silently reopen their connections, so a binding outlives the connection that sent the HELLO,
/// for an idle time once another connection has named it, and the number of bindings is capped.
/// docs/side-channel.md ("DMA.HELLO") has the protocol.
#pragma once

#include <dma/export.hpp>

#include <dma/peer_address.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dma::kv {

/// One client's HELLO: the service's peer id for it, its fabric address and its token.
struct Binding {
  std::uint64_t id = 0;  ///< the service's peer id
  PeerAddress address;   ///< the client's fabric address
  std::string token;     ///< 32 hex digits
};

/// The bindings of one server. Thread-safe.
class DMA_EXPORT HelloBindings {
 public:
  using Clock = std::chrono::steady_clock;  ///< the clock of idle times

  /// How many bindings, and for how long.
  struct Limits {
    /// Bindings at once; a HELLO beyond it drops the least recently used one no connection holds.
    std::size_t capacity = 65536;
    /// How long a binding that no connection holds stays after its last use.
    std::chrono::seconds idle{300};
  };

  /// An empty set of bindings.
  explicit HelloBindings(Limits limits) : limits_(limits) {}

  /// A new binding with a fresh token for `address`, under the peer id `id`, held by the connection
  /// that sent the HELLO until release(id). At capacity, the least recently used binding no
  /// connection holds goes first (its id is appended to `dropped`, for the caller's service);
  /// nullopt when every binding is held. Throws std::system_error when the OS gives no random bytes.
  std::optional<Binding> bind(std::uint64_t id, const PeerAddress& address, std::vector<std::uint64_t>& dropped);

  /// The binding `token` names, marked used now; nullopt when none (never sent here, or dropped).
  /// `own` is the id of the caller's connection's own binding (0 without one): a binding named by
  /// another connection than the one that sent its HELLO is shared, and outlives that connection.
  std::optional<Binding> find(std::string_view token, std::uint64_t own);

  /// Marks `id` used now (a data command on the connection that sent its HELLO).
  void touch(std::uint64_t id);

  /// The connection that sent `id`'s HELLO closed. A binding no other connection has named goes
  /// now (true: the caller removes `id` from its service); a shared one stays until left unused
  /// for `idle`.
  bool release(std::uint64_t id);

  /// Drops every binding no connection holds that was last used `idle` ago or more; returns their ids.
  std::vector<std::uint64_t> sweep(Clock::time_point now = Clock::now());

  /// Bindings now.
  std::size_t size() const;
  /// Bindings dropped after their idle time, or for room at capacity.
  std::uint64_t dropped() const;
  /// The limits it was made with.
  const Limits& limits() const noexcept { return limits_; }

 private:
  struct Entry {
    Binding binding;
    bool held = true;
    bool shared = false;
    Clock::time_point last_used;
  };

  Limits limits_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> by_token_;
  std::unordered_map<std::uint64_t, std::string> token_of_;
  std::uint64_t dropped_ = 0;
};

}  // namespace dma::kv
