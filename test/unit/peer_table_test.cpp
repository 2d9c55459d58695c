// The peer-address table against a fake AV: which addresses reach fi_av_insert / fi_av_remove, and when.
#include "peer_table.hpp"
#include "../catch.hpp"

#include <dma/error.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

using dma::detail::PeerTable;
using Bytes = std::vector<std::uint8_t>;

namespace {

// A fake AV: hands out handles 100, 101, … and records every call in order.
struct FakeAv {
  struct Call {
    bool insert;
    fi_addr_t handle;
  };
  fi_addr_t next = 100;
  std::vector<Bytes> inserted;
  std::vector<fi_addr_t> removed;
  std::vector<Call> calls;
  std::map<fi_addr_t, Bytes> live;
  std::error_code fail_next;  // the next insert fails with this, once

  PeerTable table(std::uint32_t format) {
    return PeerTable(
        format,
        [this](std::span<const std::uint8_t> address, fi_addr_t& handle) {
          if (auto ec = std::exchange(fail_next, {})) return ec;
          handle = next++;
          inserted.emplace_back(address.begin(), address.end());
          calls.push_back({true, handle});
          live.emplace(handle, Bytes(address.begin(), address.end()));
          return std::error_code{};
        },
        [this](fi_addr_t handle) {
          removed.push_back(handle);
          calls.push_back({false, handle});
          live.erase(handle);
        });
  }
};

constexpr std::uint32_t opaque = FI_SOCKADDR_IN;
constexpr std::uint32_t efa_format = FI_ADDR_EFA;

Bytes opaque_address(std::uint8_t last) {
  Bytes address{2, 0, 0x1f, 0x90, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  address.back() = last;
  return address;
}

// GID (16 bytes, tagged by gid_tag) + QPN (2) + 2 spare + QKEY (4) + padding to 32.
Bytes efa_address(std::uint8_t gid_tag, std::uint16_t qpn, std::uint32_t qkey) {
  Bytes address(32, 0);
  address[0] = 0xfe;
  address[15] = gid_tag;
  address[16] = static_cast<std::uint8_t>(qpn & 0xff);
  address[17] = static_cast<std::uint8_t>(qpn >> 8);
  for (int i = 0; i < 4; ++i)
    address[20 + i] = static_cast<std::uint8_t>(qkey >> (8 * i));
  return address;
}

fi_addr_t insert_ok(PeerTable& table, std::uint64_t client, const Bytes& address) {
  std::error_code ec;
  const fi_addr_t handle = table.insert(client, address, ec);
  REQUIRE_FALSE(ec);
  return handle;
}

}  // namespace

TEST_CASE("clients sharing an address share one entry and one handle", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  const fi_addr_t first = insert_ok(table, 1, opaque_address(1));
  const fi_addr_t second = insert_ok(table, 2, opaque_address(1));
  CHECK(first == 100);
  CHECK(second == first);
  CHECK(av.inserted.size() == 1);
  CHECK(table.entries() == 1);
  CHECK(table.clients() == 2);
  CHECK(table.use_count(1) == 2);
}

TEST_CASE("one client leaving keeps an entry another still uses", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  insert_ok(table, 2, opaque_address(1));
  CHECK(table.use_count(2) == 2);
  table.release(1);
  CHECK(table.use_count(2) == 1);
  CHECK(table.find(1) == std::nullopt);
  CHECK(table.find(2) == fi_addr_t{100});
  CHECK(av.removed.empty());
  CHECK(table.entries() == 1);
}

TEST_CASE("the last client out removes the entry", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  insert_ok(table, 2, opaque_address(1));
  table.release(1);
  table.release(2);
  CHECK(av.removed == std::vector<fi_addr_t>{100});
  CHECK(table.entries() == 0);
  CHECK(table.clients() == 0);
  CHECK(av.live.empty());
}

TEST_CASE("releasing a client twice is harmless", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  insert_ok(table, 2, opaque_address(1));
  table.release(1);
  table.release(1);
  CHECK(table.use_count(2) == 1);
  CHECK(av.removed.empty());
  table.release(2);
  table.release(2);
  table.release(7);  // never bound
  CHECK(av.removed == std::vector<fi_addr_t>{100});
}

TEST_CASE("re-asking for the same address holds one reference", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  for (int round = 0; round < 3; ++round) {
    for (std::uint64_t client = 1; client <= 3; ++client)
      insert_ok(table, client, opaque_address(1));
  }
  CHECK(table.use_count(1) == 3);
  CHECK(av.inserted.size() == 1);
  table.release(3);
  CHECK(table.use_count(1) == 2);
  CHECK(av.removed.empty());
}

TEST_CASE("the remembered last binding never outlives its entry", "[peers]") {
  // insert() remembers the binding it last hit; releasing, rebinding or clearing must forget it.
  FakeAv av;
  auto table = av.table(opaque);
  const fi_addr_t first = insert_ok(table, 1, opaque_address(1));
  CHECK(insert_ok(table, 1, opaque_address(1)) == first);  // the remembered hit
  table.release(1);
  CHECK(av.removed == std::vector<fi_addr_t>{first});
  const fi_addr_t second = insert_ok(table, 1, opaque_address(1));  // a fresh AV entry, not the dead one
  CHECK(second != first);
  CHECK(av.inserted.size() == 2);
  const fi_addr_t other = insert_ok(table, 1, opaque_address(2));  // rebinding drops the old entry
  CHECK(av.removed == std::vector<fi_addr_t>{first, second});
  CHECK(insert_ok(table, 1, opaque_address(2)) == other);
  table.clear();
  CHECK(insert_ok(table, 1, opaque_address(2)) != other);
  CHECK(av.inserted.size() == 4);
  std::error_code ec = make_error_code(dma::errc::address_length);  // a stale error is cleared on success
  (void)table.insert(1, opaque_address(2), ec);
  CHECK_FALSE(ec);
}

TEST_CASE("rebinding a client to a new address releases its old entry", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  const fi_addr_t rebound = insert_ok(table, 1, opaque_address(2));
  CHECK(rebound == 101);
  CHECK(table.find(1) == fi_addr_t{101});
  CHECK(table.entries() == 1);
  // The old entry leaves the AV before the new address enters it.
  REQUIRE(av.calls.size() == 3);
  CHECK((!av.calls[1].insert && av.calls[1].handle == 100));
  CHECK((av.calls[2].insert && av.calls[2].handle == 101));

  SECTION("an entry another client still uses stays") {
    insert_ok(table, 2, opaque_address(2));
    insert_ok(table, 2, opaque_address(3));
    CHECK(table.use_count(1) == 1);
    CHECK(av.removed == std::vector<fi_addr_t>{100});
  }
  SECTION("joining an existing entry releases the old one without an insert") {
    insert_ok(table, 2, opaque_address(3));
    insert_ok(table, 2, opaque_address(2));
    CHECK(table.use_count(1) == 2);
    CHECK(av.removed == std::vector<fi_addr_t>{100, 102});
    CHECK(av.inserted.size() == 3);
  }
}

TEST_CASE("efa addresses differing only in qkey are one slot", "[peers]") {
  FakeAv av;
  auto table = av.table(FI_ADDR_EFA);
  insert_ok(table, 1, efa_address(1, 7, 0x1111));
  insert_ok(table, 2, efa_address(1, 7, 0x1111));
  const fi_addr_t fresh = insert_ok(table, 3, efa_address(1, 7, 0x2222));
  CHECK(fresh == 101);
  CHECK(table.entries() == 1);
  CHECK(table.clients() == 1);
  CHECK(table.find(1) == std::nullopt);
  CHECK(table.find(2) == std::nullopt);
  CHECK(table.evictions() == 2);
  // The stale incarnation leaves the AV before the new one enters: the reverse AV cannot hold both.
  REQUIRE(av.calls.size() == 3);
  CHECK((!av.calls[1].insert && av.calls[1].handle == 100));
  CHECK((av.calls[2].insert && av.calls[2].handle == 101));
}

TEST_CASE("efa addresses with different qpns are different slots", "[peers]") {
  FakeAv av;
  auto table = av.table(FI_ADDR_EFA);
  const Bytes base = efa_address(1, 0x0207, 0x1111);
  insert_ok(table, 1, base);
  Bytes other = base;
  SECTION("low qpn byte (16)") { other[16] ^= 1; }
  SECTION("high qpn byte (17)") { other[17] ^= 1; }
  insert_ok(table, 2, other);
  CHECK(table.entries() == 2);
  CHECK(table.find(1) == fi_addr_t{100});
  CHECK(table.find(2) == fi_addr_t{101});
  CHECK(table.evictions() == 0);
  CHECK(av.removed.empty());
}

TEST_CASE("efa rejects any length but the provider's 32 bytes", "[peers]") {
  FakeAv av;
  auto table = av.table(FI_ADDR_EFA);
  for (std::size_t length : {31u, 33u}) {
    std::error_code ec;
    const fi_addr_t handle = table.insert(1, Bytes(length, 0xab), ec);
    CHECK(ec == dma::make_error_code(dma::errc::address_length));
    CHECK(handle == FI_ADDR_NOTAVAIL);
  }
  CHECK(av.inserted.empty());
  CHECK(table.clients() == 0);
  CHECK(insert_ok(table, 1, Bytes(32, 0xab)) == 100);
  CHECK(av.inserted.size() == 1);
}

TEST_CASE("opaque addresses compare every byte", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  insert_ok(table, 2, opaque_address(2));
  CHECK(table.entries() == 2);
  CHECK(table.find(1) != table.find(2));
  CHECK(table.evictions() == 0);
  CHECK(av.removed.empty());

  SECTION("any length is accepted") {
    insert_ok(table, 3, Bytes(3, 0x01));
    CHECK(table.entries() == 3);
  }
}

TEST_CASE("a recycled queue pair evicts its dead incarnation", "[peers]") {
  FakeAv av;
  auto table = av.table(FI_ADDR_EFA);
  const Bytes stale = efa_address(9, 42, 0xabcd);
  Bytes recycled = stale;
  recycled[20] ^= 0xff;  // the QKEY
  insert_ok(table, 1, stale);
  insert_ok(table, 2, stale);
  insert_ok(table, 1, recycled);
  CHECK(table.clients() == 1);
  CHECK(table.find(1) == fi_addr_t{101});
  CHECK(table.find(2) == std::nullopt);
  CHECK(table.use_count(2) == 0);
  // Client 1 moved to the new incarnation; only client 2 lost its peer.
  CHECK(table.evictions() == 1);
  CHECK(av.removed == std::vector<fi_addr_t>{100});
  REQUIRE(av.live.size() == 1);
  CHECK(av.live.begin()->second == recycled);

  SECTION("the evicted client gets the new incarnation back on its next post") {
    insert_ok(table, 2, recycled);
    CHECK(table.use_count(1) == 2);
    CHECK(av.inserted.size() == 2);
  }
}

TEST_CASE("a failing insert leaves the table unchanged", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  const std::error_code injected = dma::make_error_code(dma::errc::av_insert_failed);
  av.fail_next = injected;
  std::error_code ec;
  const fi_addr_t handle = table.insert(2, opaque_address(2), ec);
  CHECK(ec == injected);
  CHECK(handle == FI_ADDR_NOTAVAIL);
  CHECK(table.entries() == 1);
  CHECK(table.clients() == 1);
  CHECK(table.find(2) == std::nullopt);
  CHECK(table.use_count(1) == 1);
  CHECK(av.removed.empty());
  // Nothing of the failure lingers: the next attempt inserts.
  CHECK(insert_ok(table, 2, opaque_address(2)) == 101);
}

TEST_CASE("a rebinding client whose insert fails is left unbound", "[peers]") {
  // Its old entry left the AV before the insert was tried, so there is nothing to restore.
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  av.fail_next = dma::make_error_code(dma::errc::av_insert_failed);
  std::error_code ec;
  table.insert(1, opaque_address(2), ec);
  CHECK(ec == dma::errc::av_insert_failed);
  CHECK(table.find(1) == std::nullopt);
  CHECK(table.entries() == 0);
  CHECK(av.removed == std::vector<fi_addr_t>{100});
}

TEST_CASE("clear removes every entry exactly once", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  insert_ok(table, 1, opaque_address(1));
  insert_ok(table, 2, opaque_address(1));
  insert_ok(table, 3, opaque_address(2));
  insert_ok(table, 4, opaque_address(3));
  table.clear();
  std::vector<fi_addr_t> removed = av.removed;
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<fi_addr_t>{100, 101, 102});
  CHECK(table.entries() == 0);
  CHECK(table.clients() == 0);
  // Releases and clears after the fact touch nothing.
  table.release(1);
  table.clear();
  CHECK(av.removed.size() == 3);
}

TEST_CASE("destroying the table leaves the AV to its own close", "[peers]") {
  FakeAv av;
  {
    auto table = av.table(opaque);
    insert_ok(table, 1, opaque_address(1));
  }
  CHECK(av.removed.empty());
}

namespace {

// What the table should hold: each client's address, and the clients a recycled slot evicted.
struct Model {
  bool efa;
  std::map<std::uint64_t, Bytes> bound;
  std::uint64_t evictions = 0;

  Bytes identity(const Bytes& address) const { return efa ? Bytes(address.begin(), address.begin() + 18) : address; }
  void insert(std::uint64_t client, const Bytes& address) {
    std::erase_if(bound, [&](const auto& binding) {
      if (binding.second == address || identity(binding.second) != identity(address)) return false;
      evictions += binding.first != client;
      return true;
    });
    bound[client] = address;
  }
  std::size_t entries() const {
    std::set<Bytes> distinct;
    for (const auto& [client, address] : bound)
      distinct.insert(address);
    return distinct.size();
  }
  std::size_t use_count(std::uint64_t client) const {
    auto held = bound.find(client);
    if (held == bound.end()) return 0;
    return static_cast<std::size_t>(
        std::count_if(bound.begin(), bound.end(), [&](const auto& b) { return b.second == held->second; }));
  }
};

void check_against(const PeerTable& table, const FakeAv& av, const Model& model) {
  REQUIRE(table.entries() == model.entries());
  REQUIRE(table.clients() == model.bound.size());
  REQUIRE(table.evictions() == model.evictions);
  REQUIRE(av.inserted.size() - av.removed.size() == table.entries());
  REQUIRE(av.live.size() == table.entries());
  // The AV never holds two live entries for one slot.
  std::set<Bytes> slots;
  for (const auto& [handle, address] : av.live)
    REQUIRE(slots.insert(model.identity(address)).second);
  for (std::uint64_t client = 0; client < 20; ++client) {
    REQUIRE(table.use_count(client) == model.use_count(client));
    auto handle = table.find(client);
    REQUIRE(handle.has_value() == model.bound.contains(client));
    if (handle) REQUIRE(av.live.at(*handle) == model.bound.at(client));
  }
}

}  // namespace

TEST_CASE("random inserts and releases keep the table, the AV and a model in step", "[peers]") {
  const bool efa = GENERATE(false, true);
  CAPTURE(efa);
  // Opaque: five distinct addresses. Efa: two slots with two incarnations each, plus one more slot.
  const std::array<Bytes, 5> addresses =
      efa ? std::array<Bytes, 5>{efa_address(1, 1, 10), efa_address(1, 1, 11), efa_address(2, 1, 10),
                                 efa_address(2, 1, 12), efa_address(3, 5, 10)}
          : std::array<Bytes, 5>{opaque_address(1), opaque_address(2), opaque_address(3), opaque_address(4),
                                 opaque_address(5)};
  FakeAv av;
  auto table = av.table(efa ? efa_format : opaque);
  Model model{efa, {}};
  std::mt19937 random(efa ? 2024 : 42);
  for (int step = 0; step < 1000; ++step) {
    CAPTURE(step);
    const std::uint64_t client = random() % 20;
    const bool insert = random() % 10 < 7;
    if (insert) {
      const Bytes& address = addresses[random() % addresses.size()];
      const std::size_t inserts_before = av.inserted.size();
      const bool already_held = model.bound.contains(client) && model.bound.at(client) == address;
      insert_ok(table, client, address);
      model.insert(client, address);
      if (already_held) REQUIRE(av.inserted.size() == inserts_before);
    } else {
      table.release(client);
      model.bound.erase(client);
    }
    if (step % 250 == 249) {
      table.clear();
      model.bound.clear();
    }
    check_against(table, av, model);
  }
  table.clear();
  CHECK(av.live.empty());
  CHECK(av.inserted.size() == av.removed.size());
}

TEST_CASE("a validating table refuses a bad address before it touches the AV or the binding", "[peers]") {
  FakeAv av;
  PeerTable table(
      opaque,
      [&](std::span<const std::uint8_t> address, fi_addr_t& handle) {
        handle = av.next++;
        av.inserted.emplace_back(address.begin(), address.end());
        return std::error_code{};
      },
      [&](fi_addr_t handle) { av.removed.push_back(handle); }, PeerTable::Validation::addresses);
  std::error_code ec;
  dma::detail::Peer* peer = table.acquire(1, opaque_address(1), ec);
  REQUIRE(peer != nullptr);
  Bytes port_zero = opaque_address(1);
  port_zero[2] = port_zero[3] = 0;
  CHECK(table.acquire(1, port_zero, ec) == nullptr);
  CHECK(ec == dma::errc::address_port_zero);
  CHECK(av.inserted.size() == 1);
  CHECK(table.find(1) == std::optional<fi_addr_t>(100));  // still bound to its first address
  table.settle(*peer);
}

TEST_CASE("acquire counts transfers on the entry, and the last binding is one comparison away", "[peers]") {
  FakeAv av;
  auto table = av.table(opaque);
  std::error_code ec;
  dma::detail::Peer* first = table.acquire(1, opaque_address(1), ec);
  dma::detail::Peer* again = table.acquire(1, opaque_address(1), ec);
  REQUIRE(first != nullptr);
  CHECK(again == first);
  CHECK(first->transfers == 2);
  table.release(1);  // removal waits for the transfers
  CHECK(av.removed.empty());
  table.settle(*first);
  table.settle(*first);
  CHECK(av.removed == std::vector<fi_addr_t>{100});
}
