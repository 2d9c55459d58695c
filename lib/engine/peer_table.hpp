// The refcounted peer-address table: clients sharing one address share one AV entry, and the
// entry's flow (its queue and health) lives with it.
#pragma once

#include "connect_probe.hpp"
#include "log.hpp"
#include "peer_flow.hpp"

#include <dma/endpoint.hpp>

#include <rdma/fabric.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace dma::detail {

/// One live AV entry (one fabric address) with its flow. Its address stays fixed while it lives:
/// transfers that name it may hold a pointer to it from acceptance to completion.
struct Peer {
  std::vector<std::uint8_t> address;
  fi_addr_t handle = FI_ADDR_NOTAVAIL;
  std::size_t clients = 0;    ///< client ids bound to it
  std::size_t transfers = 0;  ///< accepted transfers that name it (queued or posted)
  bool evicted = false;       ///< a newer incarnation of its efa queue pair took its place
  PeerFlow flow;
  ConnectProbe probe;  ///< while a connection to it is late: why (tcp)
};

static_assert(std::is_standard_layout_v<Peer>, "the engine finds a Peer from its flow with offsetof");

class PeerTable {
 public:
  /// Emplaces into `table` the peer table of an open endpoint's AV, validating addresses; it
  /// inserts and removes through endpoint, which must outlive it.
  static PeerTable& open_for(std::optional<PeerTable>& table, Endpoint& endpoint);

  /// Inserts one address into the AV; returns the handle or an error.
  using InsertFn = std::function<std::error_code(std::span<const std::uint8_t> address, fi_addr_t& handle)>;
  /// Removes one handle from the AV (failures are the callee's to log).
  using RemoveFn = std::function<void(fi_addr_t handle)>;

  /// Whether insert() validates an address it has not seen (validate_address with the table's
  /// format) before it changes anything; without, any bytes pass (efa's length is checked anyway).
  enum class Validation : std::uint8_t { none, addresses };

  PeerTable(std::uint32_t addr_format, InsertFn insert, RemoveFn remove, Validation validation = Validation::none);
  ~PeerTable();
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  /// Where it reports evictions; must outlive the table.
  void set_log(const Log& log) noexcept { log_ = &log; }

  /// Binds client_id to address and returns its AV handle, inserting the address only when no
  /// live entry has it. An address the client is not bound to yet is validated first (see
  /// Validation). Rebinding a client to a new address releases its
  /// old entry. On efa (FI_ADDR_EFA) the identity is the first 18 bytes (GID + QPN): an address
  /// with the same identity but different bytes is a recycled queue pair, and every client
  /// holding the stale incarnation is evicted before the new one is inserted.
  fi_addr_t insert(std::uint64_t client_id, std::span<const std::uint8_t> address, std::error_code& ec);
  /// acquire() when the table's last hit is the answer (the hot path: a client posting to the
  /// peer of the last acquire or insert, one comparison of the bytes); null otherwise.
  Peer* acquire_cached(std::uint64_t client_id, std::span<const std::uint8_t> address) noexcept {
    Entry* entry = cached(client_id, address);
    if (entry != nullptr) ++entry->transfers;
    return entry;
  }
  /// insert() for one transfer: binds the client as insert() does and counts the transfer on the
  /// entry, which then outlives every release until settle(). Null on error.
  Peer* acquire(std::uint64_t client_id, std::span<const std::uint8_t> address, std::error_code& ec) {
    if (Peer* peer = acquire_cached(client_id, address)) return peer;
    Entry* entry = acquire_slow(client_id, address, ec);
    if (entry != nullptr) ++entry->transfers;
    return entry;
  }
  /// One of peer's transfers ended; the entry goes when it has neither transfers nor clients.
  void settle(Peer& peer);
  /// Replaces peer's AV entry with a fresh one for the same address (its connection is gone and
  /// the provider must not reuse it). Only while none of its transfers is posted.
  std::error_code refresh(Peer& peer);

  /// Drops client_id's reference; the AV entry goes with the last one once no transfer names it.
  /// Releasing twice is harmless.
  void release(std::uint64_t client_id);
  /// Releases everything (before the AV closes). The destructor does not: closing the AV drops its
  /// entries anyway, and by then the AV may already be gone.
  void clear();

  /// The client's handle, if it holds one.
  std::optional<fi_addr_t> find(std::uint64_t client_id) const;
  /// The peer client_id is bound to, or null.
  Peer* bound(std::uint64_t client_id) const noexcept {
    auto it = by_client_.find(client_id);
    return it == by_client_.end() ? nullptr : it->second;
  }
  /// Clients holding the entry that client_id holds (0 if none).
  std::size_t use_count(std::uint64_t client_id) const;
  /// Live AV entries.
  std::size_t entries() const noexcept;
  /// Clients bound to an entry.
  std::size_t clients() const noexcept;
  /// Clients evicted because their address's queue pair was recycled (efa), since construction. The
  /// client advertising the new incarnation is rebound, not evicted, and is not counted.
  std::uint64_t evictions() const noexcept;

 private:
  /// Its node in by_identity_ owns a Peer, so pointers to it stay valid until erased.
  using Entry = Peer;
  /// Hashes std::string keys and std::string_view probes alike, so lookups never allocate.
  struct IdentityHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view identity) const noexcept;
  };
  using ByIdentity = std::unordered_map<std::string, Entry, IdentityHash, std::equal_to<>>;

  /// The one last-binding cache: the entry when client_id was the last one looked up and is bound
  /// to exactly these bytes (validated when they were inserted), else null.
  Entry* cached(std::uint64_t client_id, std::span<const std::uint8_t> address) const noexcept {
    if (last_entry_ == nullptr || client_id != last_client_ || !equal_address(last_entry_->address, address)) {
      return nullptr;
    }
    return last_entry_;
  }
  // Equal bytes; a 16-byte address (sockaddr_in, the tcp case) in two loads instead of a memcmp call.
  static bool equal_address(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b) noexcept {
    if (a.size() != b.size()) return false;
    if (a.size() == 16) {
      std::uint64_t x[2], y[2];
      std::memcpy(x, a.data(), 16);
      std::memcpy(y, b.data(), 16);
      return ((x[0] ^ y[0]) | (x[1] ^ y[1])) == 0;
    }
    return std::ranges::equal(a, b);
  }
  Entry* acquire_slow(std::uint64_t client_id, std::span<const std::uint8_t> address, std::error_code& ec);
  std::string_view identity_of(std::span<const std::uint8_t> address) const noexcept;
  fi_addr_t join(std::uint64_t client_id, Entry& entry);
  void evict(std::uint64_t client_id, ByIdentity::iterator stale);
  fi_addr_t add(std::uint64_t client_id, std::span<const std::uint8_t> address, std::error_code& ec);
  void unref(Entry& entry);
  void erase_if_unused(Entry& entry);

  std::uint32_t addr_format_;
  bool efa_;
  Validation validation_;
  InsertFn insert_;
  RemoveFn remove_;
  ByIdentity by_identity_;  ///< identity → the live entry with that identity (at most one)
  /// Evicted entries that transfers still name; their AV entries are already removed.
  std::vector<ByIdentity::node_type> evicted_;
  std::unordered_map<std::uint64_t, Entry*> by_client_;
  std::uint64_t evictions_ = 0;
  /// The binding the last insert() or acquire() found (a steady client posts to one peer): spares
  /// the hash lookup. Dropped by every change to the bindings or the entries.
  std::uint64_t last_client_ = 0;
  Entry* last_entry_ = nullptr;
  static inline const Log default_log_{};
  const Log* log_ = &default_log_;
};

}  // namespace dma::detail
