// The refcounted peer-address table (seed §7), with exact reference counts instead of weak entries.
#include "peer_table.hpp"

#include <dma/advertisement.hpp>
#include <dma/error.hpp>

#include <algorithm>
#include <utility>

namespace dma::detail {

namespace {

// GID (16) + QPN (2): the device hands a closed endpoint's QPN to the next one, so only the QKEY
// tells two incarnations of a slot apart, and efa-direct's reverse AV cannot hold both.
constexpr std::size_t efa_identity_bytes = 18;

std::string_view as_chars(std::span<const std::uint8_t> bytes) noexcept {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

bool same_bytes(const std::vector<std::uint8_t>& stored, std::span<const std::uint8_t> address) noexcept {
  return std::ranges::equal(stored, address);
}

}  // namespace

std::size_t PeerTable::IdentityHash::operator()(std::string_view identity) const noexcept {
  return std::hash<std::string_view>{}(identity);
}

PeerTable& PeerTable::open_for(std::optional<PeerTable>& table, Endpoint& endpoint) {
  return table.emplace(
      endpoint.addr_format(),
      [&endpoint](std::span<const std::uint8_t> address, fi_addr_t& handle) {
        std::error_code insert_ec;
        handle = endpoint.insert_address(address, insert_ec);
        return insert_ec;
      },
      [&endpoint](fi_addr_t handle) { (void)endpoint.remove_address(handle); }, Validation::addresses);
}

PeerTable::PeerTable(std::uint32_t addr_format, InsertFn insert, RemoveFn remove, Validation validation)
    : addr_format_(addr_format),
      efa_(addr_format == FI_ADDR_EFA),
      validation_(validation),
      insert_(std::move(insert)),
      remove_(std::move(remove)) {}

PeerTable::~PeerTable() = default;

fi_addr_t PeerTable::insert(std::uint64_t client_id, std::span<const std::uint8_t> address, std::error_code& ec) {
  if (ec) ec.clear();
  if (Entry* entry = cached(client_id, address)) return entry->handle;
  auto held = by_client_.find(client_id);
  if (held != by_client_.end() && same_bytes(held->second->address, address)) {
    last_client_ = client_id;
    last_entry_ = held->second;
    return held->second->handle;
  }
  last_entry_ = nullptr;  // whatever follows may rebind clients or erase entries
  if (validation_ == Validation::addresses) {
    ec = validate_address(address, addr_format_);
  } else if (efa_ && address.size() != efa_address_length) {
    ec = make_error_code(errc::address_length);
  }
  if (ec) return FI_ADDR_NOTAVAIL;
  if (auto live = by_identity_.find(identity_of(address)); live != by_identity_.end()) {
    if (same_bytes(live->second.address, address)) return join(client_id, live->second);
    evict(client_id, live);
  }
  // Released before the insert, so the old AV entry is gone before the new one arrives.
  release(client_id);
  return add(client_id, address, ec);
}

PeerTable::Entry* PeerTable::acquire_slow(std::uint64_t client_id, std::span<const std::uint8_t> address,
                                          std::error_code& ec) {
  (void)insert(client_id, address, ec);
  if (ec) return nullptr;
  Entry* entry = by_client_.at(client_id);
  last_client_ = client_id;
  last_entry_ = entry;
  return entry;
}

void PeerTable::settle(Peer& peer) {
  if (--peer.transfers == 0) erase_if_unused(peer);
}

std::error_code PeerTable::refresh(Peer& peer) {
  if (peer.evicted) return make_error_code(errc::peer_removed);
  if (peer.handle != FI_ADDR_NOTAVAIL) remove_(peer.handle);
  peer.handle = FI_ADDR_NOTAVAIL;
  fi_addr_t handle = FI_ADDR_NOTAVAIL;
  if (std::error_code ec = insert_(peer.address, handle)) return ec;
  peer.handle = handle;
  return {};
}

void PeerTable::release(std::uint64_t client_id) {
  last_entry_ = nullptr;
  auto held = by_client_.find(client_id);
  if (held == by_client_.end()) return;
  Entry& entry = *held->second;
  by_client_.erase(held);
  unref(entry);
}

void PeerTable::clear() {
  last_entry_ = nullptr;
  // Emptied before RemoveFn runs, so the table is consistent whatever the callee does.
  by_client_.clear();
  evicted_.clear();
  for (auto& [identity, entry] : std::exchange(by_identity_, {}))
    if (entry.handle != FI_ADDR_NOTAVAIL) remove_(entry.handle);
}

std::optional<fi_addr_t> PeerTable::find(std::uint64_t client_id) const {
  auto held = by_client_.find(client_id);
  if (held == by_client_.end()) return std::nullopt;
  return held->second->handle;
}

std::size_t PeerTable::use_count(std::uint64_t client_id) const {
  auto held = by_client_.find(client_id);
  return held == by_client_.end() ? 0 : held->second->clients;
}

std::size_t PeerTable::entries() const noexcept { return by_identity_.size(); }

std::size_t PeerTable::clients() const noexcept { return by_client_.size(); }

std::uint64_t PeerTable::evictions() const noexcept { return evictions_; }

std::string_view PeerTable::identity_of(std::span<const std::uint8_t> address) const noexcept {
  return as_chars(efa_ ? address.first(efa_identity_bytes) : address);
}

// The client holds some other entry (or none): the hot path already caught this one.
fi_addr_t PeerTable::join(std::uint64_t client_id, Entry& entry) {
  release(client_id);
  by_client_.emplace(client_id, &entry);
  ++entry.clients;
  return entry.handle;
}

// A live entry with this identity but other bytes is a dead incarnation of a recycled queue pair:
// nobody can reach it any more, and it blocks the slot the new incarnation needs.
void PeerTable::evict(std::uint64_t client_id, ByIdentity::iterator stale) {
  const Entry* dead = &stale->second;
  std::erase_if(by_client_, [&](const auto& binding) {
    if (binding.second != dead) return false;
    evictions_ += binding.first != client_id;
    return true;
  });
  const fi_addr_t handle = dead->handle;
  (*log_)(LogLevel::info, [&] {
    return "peer evicted: " + encode_hex(dead->address) + ": its queue pair was recycled; " +
           std::to_string(dead->transfers) + " transfers still name it";
  });
  if (stale->second.transfers == 0) {
    by_identity_.erase(stale);
  } else {
    // Transfers still name it: it lives on, out of the table, until they end.
    stale->second.evicted = true;
    stale->second.clients = 0;
    stale->second.handle = FI_ADDR_NOTAVAIL;
    evicted_.push_back(by_identity_.extract(stale));
  }
  if (handle != FI_ADDR_NOTAVAIL) remove_(handle);
}

fi_addr_t PeerTable::add(std::uint64_t client_id, std::span<const std::uint8_t> address, std::error_code& ec) {
  fi_addr_t handle = FI_ADDR_NOTAVAIL;
  if ((ec = insert_(address, handle))) return FI_ADDR_NOTAVAIL;
  auto node = by_identity_.end();
  try {
    node = by_identity_.try_emplace(std::string(identity_of(address))).first;
    node->second.address.assign(address.begin(), address.end());
    node->second.handle = handle;
    node->second.clients = 1;
    by_client_.emplace(client_id, &node->second);
  } catch (...) {
    // An AV entry the table does not track would never be removed.
    if (node != by_identity_.end()) by_identity_.erase(node);
    remove_(handle);
    throw;
  }
  return handle;
}

void PeerTable::unref(Entry& entry) {
  --entry.clients;
  erase_if_unused(entry);
}

void PeerTable::erase_if_unused(Entry& entry) {
  if (entry.clients != 0 || entry.transfers != 0) return;
  if (&entry == last_entry_) last_entry_ = nullptr;
  if (entry.evicted) {
    std::erase_if(evicted_, [&](const ByIdentity::node_type& node) { return &node.mapped() == &entry; });
    return;
  }
  const fi_addr_t handle = entry.handle;
  by_identity_.erase(by_identity_.find(identity_of(entry.address)));
  if (handle != FI_ADDR_NOTAVAIL) remove_(handle);
}

}  // namespace dma::detail
