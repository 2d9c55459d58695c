// Failing peers, as a user sees them: dead, restarted, frozen and hostile targets in processes of
// their own (ended by PID), and what the service's transfers report. Deadlines are configured
// short so the suite stays quick; the time bounds are generous, never a measurement.
#include "../catch.hpp"
#include "../child_process.hpp"
#include "../sanitizer.hpp"
#include "run_until.hpp"

#include <dma/dma.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <dirent.h>
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using test::address_sanitizer;
using test::sanitized;

using test::run_until;

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Payload {
  std::vector<std::byte> bytes;
  int id = 0;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t n) {
    bytes.resize(n);
    return bytes;
  }
};

using Service = dma::asynchronous::FabricService<Payload>;

std::string fault_target() { return test::sibling_program("DMA_FAULT_TARGET", "fault-target"); }

/// A fault-target process and its advertisement.
struct Peer {
  std::unique_ptr<test::Child> child;
  dma::Advertisement ad;

  static Peer start(std::size_t size = 1 << 20, std::optional<std::uint16_t> port = std::nullopt) {
    std::vector<std::string> args{fault_target(), "--size", std::to_string(size)};
    if (port) {
      args.push_back("--port");
      args.push_back(std::to_string(*port));
    }
    Peer peer{std::make_unique<test::Child>(args), {}};
    const std::string line = peer.child->line();
    INFO("fault-target printed: " << line);
    const std::string prefix = "advertisement: ";
    REQUIRE(line.rfind(prefix, 0) == 0);
    peer.ad = dma::Advertisement::parse(line.substr(prefix.size()));
    return peer;
  }
  std::uint16_t port() const { return static_cast<std::uint16_t>(ad.address[2] << 8 | ad.address[3]); }

  /// A peer at a port the test picked (so that a restart can take the same one), or none after
  /// 20 ports were taken; `salt` keeps two tests' choices apart.
  static std::optional<Peer> start_at_a_port_of_its_own(std::size_t size, unsigned salt) {
    std::mt19937 random(static_cast<unsigned>(getpid()) ^ salt);
    for (int attempt = 0; attempt < 20; ++attempt) {
      const auto port = static_cast<std::uint16_t>(20000 + random() % 30000);
      Peer candidate = Peer::start(size, port);
      if (candidate.port() == port) return candidate;
    }
    return std::nullopt;
  }
};

dma::Configuration configuration() {
  dma::Configuration c;
  c.bind = "127.0.0.1";
  return c;
}

/// Completions by transfer id, counted so a second delivery shows.
struct Ledger {
  std::map<int, std::vector<dma::Outcome>> outcomes;
  std::map<int, Clock::time_point> at;
  std::size_t delivered = 0;

  auto handler(int id) {
    return [this, id](std::error_code, dma::Completion<Payload> c) {
      outcomes[id].push_back(c.outcome);
      at[id] = Clock::now();
      ++delivered;
    };
  }
  bool exactly_once(int first, int count) const {
    for (int id = first; id < first + count; ++id) {
      auto it = outcomes.find(id);
      if (it == outcomes.end() || it->second.size() != 1) return false;
    }
    return true;
  }
  std::size_t count_if(int first, int count, const std::function<bool(const dma::Outcome&)>& pred) const {
    std::size_t n = 0;
    for (int id = first; id < first + count; ++id) {
      auto it = outcomes.find(id);
      if (it != outcomes.end() && !it->second.empty() && pred(it->second.front())) ++n;
    }
    return n;
  }
  const dma::Outcome& of(int id) const { return outcomes.at(id).front(); }
};

dma::TransferRequest<Payload> write_to(const dma::Advertisement& ad, std::uint64_t client, std::size_t size, int id) {
  dma::TransferRequest<Payload> r;
  r.client_id = client;
  r.set_peer(ad);
  r.direction = dma::Direction::ToPeer;
  r.caller_context.bytes.assign(size, std::byte{static_cast<unsigned char>(id)});
  r.caller_context.id = id;
  return r;
}

/// Runs io until pred holds or the bound passes; returns whether pred held.
std::size_t open_fds() {
  std::size_t n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir) != nullptr)
      ++n;
    closedir(dir);
  }
  return n;
}

// Resident memory in KiB, after handing the allocator's free pages back to the system, so that
// memory freed by earlier tests (whose payloads reach hundreds of MiB) does not count.
std::size_t rss_kib() {
  ::malloc_trim(0);
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      std::size_t kib = 0;
      status >> kib;
      return kib;
    }
    status.ignore(1 << 12, '\n');
  }
  return 0;
}

/// The messages a service logs through Configuration::log_handler.
struct LogCapture {
  std::mutex mutex;
  std::vector<std::pair<dma::LogLevel, std::string>> messages;

  dma::LogHandler handler() {
    return dma::LogHandler(
        [this](dma::LogLevel level, std::string_view message) {
          std::lock_guard lock(mutex);
          messages.emplace_back(level, std::string(message));
        },
        dma::LogLevel::debug);
  }
  /// How many messages at `level` start with `prefix` and contain `part`.
  std::size_t count(dma::LogLevel level, std::string_view prefix, std::string_view part = {}) {
    std::lock_guard lock(mutex);
    return static_cast<std::size_t>(std::count_if(messages.begin(), messages.end(), [&](const auto& m) {
      return m.first == level && m.second.rfind(prefix, 0) == 0 && m.second.find(part) != std::string::npos;
    }));
  }
  std::string all() {
    std::lock_guard lock(mutex);
    std::string text;
    for (const auto& m : messages)
      text += std::string(dma::to_string(m.first)) + ": " + m.second + "\n";
    return text;
  }
};

bool is_timed_out(const dma::Outcome& o) { return o.error() == std::errc::timed_out; }
bool is_ok(const dma::Outcome& o) { return o.ok(); }

}  // namespace

TEST_CASE("writes queued to a dead peer do not delay a healthy peer's write", "[faults][dead]") {
  Peer dead = Peer::start();
  dead.child->kill_now();
  Peer healthy = Peer::start();
  asio::io_context io;
  LogCapture log;
  auto config = configuration();
  config.log_handler = log.handler();
  Service service(io, config);
  Ledger ledger;
  for (int id = 0; id < 5; ++id)
    service.submit(write_to(dead.ad, 1, 4096, id), ledger.handler(id));
  const auto start = Clock::now();
  service.submit(write_to(healthy.ad, 2, 4096, 5), ledger.handler(5));

  REQUIRE(run_until(
      io, [&] { return ledger.outcomes.count(5) != 0; }, 10s));
  INFO(ledger.of(5).message());
  CHECK(ledger.of(5).ok());
  CHECK(ledger.at[5] - start < 500ms);

  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 6; }, 10s));
  CHECK(ledger.exactly_once(0, 6));
  for (int id = 0; id < 5; ++id) {
    INFO(ledger.of(id).message());
    CHECK(ledger.of(id).error() == dma::condition::peer_unreachable);
  }
  CHECK(service.outstanding() == 0);
  // progress_deadline of refused posts marks the dead peer unreachable, and says so once.
  INFO("logged:\n" << log.all());
  CHECK(log.count(dma::LogLevel::warning, "peer unreachable: " + dma::encode_hex(dead.ad.address)) == 1);
  CHECK(log.count(dma::LogLevel::warning, "peer unreachable: ", "no connection within") == 1);
  CHECK(log.count(dma::LogLevel::warning, "peer unreachable: " + dma::encode_hex(healthy.ad.address)) == 0);
}

TEST_CASE("a killed target's 1000 queued writes are each delivered once, and a restarted one is reachable",
          "[faults][kill]") {
  constexpr int total = 1000;
  constexpr std::size_t size = 256 * 1024;
  Peer peer = Peer::start(size);
  asio::io_context io;
  Service service(io, configuration());
  Ledger ledger;
  const auto start = Clock::now();
  for (int id = 0; id < total; ++id)
    service.submit(write_to(peer.ad, 1, size, id), ledger.handler(id));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered >= 20; }, 10s));
  peer.child->kill_now();

  REQUIRE(run_until(
      io, [&] { return ledger.delivered == total; }, 20s));
  CHECK(Clock::now() - start < 20s);
  CHECK(ledger.exactly_once(0, total));
  const std::size_t ok = ledger.count_if(0, total, is_ok);
  INFO("succeeded before the kill: " << ok);
  CHECK(ok >= 20);
  CHECK(ok < static_cast<std::size_t>(total));
  CHECK(service.outstanding() == 0);

  // At a new port, the same client writes again without remove_peer.
  Peer again = Peer::start(size);
  service.submit(write_to(again.ad, 1, 4096, total), ledger.handler(total));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == total + 1; }, 10s));
  INFO(ledger.of(total).message());
  CHECK(ledger.of(total).ok());
}

TEST_CASE("a target restarted at the same port is written to again once its back-off has passed", "[faults][kill]") {
  auto config = configuration();
  config.progress_deadline = 300ms;
  config.unreachable_backoff = 500ms;
  config.unreachable_backoff_max = 1s;
  std::optional<Peer> peer = Peer::start_at_a_port_of_its_own(4096, 0);
  REQUIRE(peer);
  const std::uint16_t port = peer->port();
  asio::io_context io;
  Service service(io, config);
  Ledger ledger;
  service.submit(write_to(peer->ad, 1, 4096, 0), ledger.handler(0));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  REQUIRE(ledger.of(0).ok());

  peer->child->kill_now();
  service.submit(write_to(peer->ad, 1, 4096, 1), ledger.handler(1));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 2; }, 10s));
  INFO(ledger.of(1).message());
  CHECK_FALSE(ledger.of(1).ok());

  Peer restarted = Peer::start(4096, port);
  REQUIRE(restarted.port() == port);
  // Submit until one lands: the first ones may still find the peer backing off.
  int id = 2;
  const bool landed = run_until(
      io,
      [&] {
        if (ledger.outcomes.count(id) != 0) {
          if (ledger.of(id).ok()) return true;
          ++id;
          std::this_thread::sleep_for(50ms);  // it failed fast: the peer still backs off
        }
        if (ledger.at.count(id) == 0) {
          service.submit(write_to(restarted.ad, 1, 4096, id), ledger.handler(id));
          ledger.at[id] = Clock::now();
        }
        return false;
      },
      15s);
  CHECK(landed);
  CHECK(service.metrics().reconnects >= 1);
}

TEST_CASE("writes posted and queued to a frozen peer fail at their deadline; a healthy peer never notices",
          "[faults][frozen]") {
  constexpr int total = 200;
  Peer frozen = Peer::start(1 << 20);
  Peer healthy = Peer::start(1 << 20);
  auto config = configuration();
  config.transfer_deadline = 2s;
  LogCapture log;
  config.log_handler = log.handler();
  asio::io_context io;
  Service service(io, config);
  Ledger ledger;
  service.submit(write_to(frozen.ad, 1, 4096, -1), ledger.handler(-1));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  REQUIRE(ledger.of(-1).ok());

  frozen.child->signal(SIGSTOP);
  const auto start = Clock::now();
  for (int id = 0; id < total; ++id)
    service.submit(write_to(frozen.ad, 1, 64 * 1024, id), ledger.handler(id));
  // The healthy peer keeps its latency meanwhile.
  int healthy_ok = 0;
  for (int round = 0; round < 10; ++round) {
    const int id = 1000 + round;
    service.submit(write_to(healthy.ad, 2, 4096, id), ledger.handler(id));
    REQUIRE(run_until(
        io, [&] { return ledger.outcomes.count(id) != 0; }, 5s));
    healthy_ok += ledger.of(id).ok() ? 1 : 0;
  }
  INFO("a healthy outcome: " << ledger.of(1000).message());
  CHECK(healthy_ok == 10);

  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1 + total + 10; }, 10s));
  CHECK(Clock::now() - start < config.transfer_deadline + 2s);
  CHECK(ledger.exactly_once(0, total));
  INFO("first and last frozen outcomes: " << ledger.of(0).message() << " / " << ledger.of(total - 1).message());
  CHECK(ledger.count_if(0, total, is_timed_out) == total);
  CHECK(service.metrics().endpoint_replacements >= 1);
  CHECK(service.outstanding() == 0);

  // The next transfer to the frozen peer fails fast while it backs off.
  service.submit(write_to(frozen.ad, 1, 4096, 2000), ledger.handler(2000));
  REQUIRE(run_until(
      io, [&] { return ledger.outcomes.count(2000) != 0; }, 2s));
  CHECK(ledger.of(2000).error() == dma::condition::peer_unreachable);
  frozen.child->signal(SIGCONT);

  // The deadline's sweep reports the late transfers, and the frozen peer is marked unreachable.
  INFO("logged:\n" << log.all());
  const std::string frozen_hex = dma::encode_hex(frozen.ad.address);
  CHECK(log.count(dma::LogLevel::warning, "transfers timed out: ", frozen_hex) >= 1);
  CHECK(log.count(dma::LogLevel::warning, "peer unreachable: " + frozen_hex) >= 1);
  CHECK(log.count(dma::LogLevel::warning, "transfers timed out: ", dma::encode_hex(healthy.ad.address)) == 0);
  CHECK(log.count(dma::LogLevel::info, "endpoint replaced: ") >= 1);
}

TEST_CASE("co_await (submit || timer) returns soon after the timer for a posted and for a queued transfer",
          "[faults][cancel]") {
  using namespace asio::experimental::awaitable_operators;
  Peer frozen = Peer::start(1 << 20);
  auto config = configuration();
  config.max_in_flight = 1;  // the second transfer waits in the queue behind the first
  asio::io_context io;
  Service service(io, config);
  Ledger ledger;
  service.submit(write_to(frozen.ad, 1, 4096, 0), ledger.handler(0));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  frozen.child->signal(SIGSTOP);

  struct Result {
    std::size_t index = 9;
    Clock::duration after_timer{};
    std::optional<std::error_code> error;
  };
  Result results[2];
  auto race = [&](int which) -> asio::awaitable<void> {
    asio::steady_timer timer(io, 300ms);
    auto request = write_to(frozen.ad, 1, 1 << 20, 10 + which);
    const auto fired = Clock::now() + 300ms;
    auto outcome = co_await (service.submit(std::move(request)) || timer.async_wait(asio::use_awaitable));
    results[which].index = outcome.index();
    results[which].after_timer = Clock::now() - fired;
    if (outcome.index() == 0) results[which].error = std::get<0>(outcome).outcome.error();
  };
  int finished = 0;
  for (int which = 0; which < 2; ++which)
    asio::co_spawn(io, race(which), [&](std::exception_ptr) { ++finished; });
  REQUIRE(run_until(
      io, [&] { return finished == 2; }, 10s));
  for (const auto& r : results) {
    CHECK(r.index == 1);
    CHECK(r.after_timer < 2s);
  }
  CHECK(service.metrics().cancelled == 2);
  CHECK(service.outstanding() == 0);
  frozen.child->signal(SIGCONT);
}

// Whether io ran the awaitable race to its end: the raced submit's outcome, and when it returned.
struct Race {
  std::size_t index = 9;
  Clock::time_point returned{};
  bool finished = false;
};

TEST_CASE("a posted transfer cancelled by submit || timer returns soon after the timer, whatever else is posted",
          "[faults][cancel]") {
  using namespace asio::experimental::awaitable_operators;
  constexpr int posted = 64;
  constexpr int healthy_writes = 100;
  constexpr auto their_deadline = 5s;
  Peer frozen = Peer::start(1 << 20);
  Peer healthy = Peer::start(1 << 20);
  asio::io_context io;
  auto config = configuration();
  config.max_in_flight = 128;  // the raced write is posted too, not queued behind the 64
  Service service(io, config);
  Ledger ledger;
  service.submit(write_to(frozen.ad, 1, 4096, -1), ledger.handler(-1));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  frozen.child->signal(SIGSTOP);

  const auto start = Clock::now();
  for (int id = 0; id < posted; ++id) {
    auto r = write_to(frozen.ad, 1, 64 * 1024, id);
    r.deadline = their_deadline;
    service.submit(std::move(r), ledger.handler(id));
  }
  (void)run_until(
      io, [] { return false; }, 100ms);  // posted
  Race race;
  const auto fired = Clock::now() + 2s;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(io, fired);
        auto outcome =
            co_await (service.submit(write_to(frozen.ad, 1, 64 * 1024, 500)) || timer.async_wait(asio::use_awaitable));
        race.index = outcome.index();
        race.returned = Clock::now();
      },
      [&](std::exception_ptr) { race.finished = true; });
  // A healthy peer's writes go on meanwhile, one after another.
  int healthy_next = 1000;
  service.submit(write_to(healthy.ad, 2, 4096, healthy_next), ledger.handler(healthy_next));
  REQUIRE(run_until(
      io,
      [&] {
        if (ledger.outcomes.count(healthy_next) != 0 && healthy_next < 1000 + healthy_writes - 1) {
          ++healthy_next;
          service.submit(write_to(healthy.ad, 2, 4096, healthy_next), ledger.handler(healthy_next));
        }
        return race.finished && ledger.outcomes.count(1000 + healthy_writes - 1) != 0;
      },
      20s));
  CHECK(race.index == 1);
  INFO("returned " << std::chrono::duration_cast<std::chrono::milliseconds>(race.returned - fired).count()
                   << " ms after the timer");
  CHECK(race.returned - fired < (sanitized ? 5s : 1s));
  CHECK(ledger.count_if(1000, healthy_writes, is_ok) == static_cast<std::size_t>(healthy_writes));

  // The 64 others still complete, once each, at their own deadline.
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1 + posted + healthy_writes; }, 20s));
  CHECK(ledger.exactly_once(0, posted));
  CHECK(ledger.count_if(0, posted, is_timed_out) == static_cast<std::size_t>(posted));
  for (int id = 0; id < posted; ++id)
    CHECK(ledger.at[id] - start >= their_deadline);
  INFO("a late one: " << ledger.of(0).message());
  CHECK(ledger.of(0).message().find("deadline") != std::string::npos);
  CHECK(service.metrics().reposted >= 1);
  CHECK(service.outstanding() == 0);
  frozen.child->signal(SIGCONT);
}

TEST_CASE("a posted transfer's 1 s deadline holds among 64 posted with 30 s deadlines; they land once the peer resumes",
          "[faults][deadline]") {
  constexpr int posted = 64;
  Peer frozen = Peer::start(1 << 20);
  asio::io_context io;
  auto config = configuration();  // the default 30 s deadline
  config.max_in_flight = 128;     // the short one is posted too, not queued behind the 64
  Service service(io, config);
  Ledger ledger;
  service.submit(write_to(frozen.ad, 1, 4096, -1), ledger.handler(-1));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  frozen.child->signal(SIGSTOP);
  for (int id = 0; id < posted; ++id)
    service.submit(write_to(frozen.ad, 1, 64 * 1024, id), ledger.handler(id));
  (void)run_until(
      io, [] { return false; }, 100ms);  // posted
  auto short_one = write_to(frozen.ad, 1, 64 * 1024, 100);
  short_one.deadline = 1s;
  const auto start = Clock::now();
  service.submit(std::move(short_one), ledger.handler(100));
  REQUIRE(run_until(
      io, [&] { return ledger.outcomes.count(100) != 0; }, 20s));
  INFO(ledger.of(100).message());
  CHECK(is_timed_out(ledger.of(100)));
  CHECK(ledger.at[100] - start < (sanitized ? 6s : 2s));
  CHECK(ledger.of(100).message().find("deadline of 1s") != std::string::npos);
  CHECK(ledger.delivered == 2);  // the others wait for their own deadline

  // Resumed, the peer takes them on the fresh endpoint: each completes once.
  frozen.child->signal(SIGCONT);
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 2 + posted; }, 25s));
  CHECK(ledger.exactly_once(0, posted));
  INFO("one of them: " << ledger.of(0).message());
  CHECK(ledger.count_if(0, posted, is_ok) == static_cast<std::size_t>(posted));
  CHECK(service.outstanding() == 0);
}

TEST_CASE("a segmented write handed back by another's deadline goes again and lands whole once the peer resumes",
          "[faults][deadline][segments]") {
  constexpr std::size_t size = 16 << 20;
  Peer frozen = Peer::start(size);
  Peer other = Peer::start(4096);  // frozen too; the short write goes there (behind the segmented
                                   // one, in its peer's queue, it would never be posted)
  asio::io_context io;
  auto config = configuration();
  config.max_segment_bytes = 1 << 20;
  Service service(io, config);
  Ledger ledger;
  service.submit(write_to(frozen.ad, 1, 4096, -1), ledger.handler(-1));
  service.submit(write_to(other.ad, 2, 4096, -2), ledger.handler(-2));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 2; }, 10s));
  frozen.child->signal(SIGSTOP);
  other.child->signal(SIGSTOP);

  auto big = write_to(frozen.ad, 1, size, 0);
  for (std::size_t i = 0; i < size; ++i)
    big.caller_context.bytes[i] = static_cast<std::byte>((i * 7 + i / 4096) & 0xff);
  const std::vector<std::byte> expected = big.caller_context.bytes;
  service.submit(std::move(big), ledger.handler(0));
  (void)run_until(
      io, [] { return false; }, 100ms);  // its first posts are out
  auto short_one = write_to(other.ad, 2, 4096, 1);
  short_one.deadline = 300ms;
  service.submit(std::move(short_one), ledger.handler(1));
  REQUIRE(run_until(
      io, [&] { return ledger.outcomes.count(1) != 0; }, 20s));
  CHECK(is_timed_out(ledger.of(1)));
  CHECK(ledger.outcomes.count(0) == 0);
  CHECK(service.metrics().reposted >= 1);

  frozen.child->signal(SIGCONT);
  other.child->signal(SIGCONT);
  REQUIRE(run_until(
      io, [&] { return ledger.outcomes.count(0) != 0; }, 30s));
  INFO(ledger.of(0).message());
  REQUIRE(ledger.of(0).ok());
  CHECK(ledger.exactly_once(0, 2));

  // Read it back: every byte of the segmented write is there.
  dma::TransferRequest<Payload> read;
  read.client_id = 1;
  read.set_peer(frozen.ad);
  read.direction = dma::Direction::FromPeer;
  read.length = size;
  service.submit(std::move(read), [&](std::error_code, dma::Completion<Payload> c) {
    INFO(c.outcome.message());
    REQUIRE(c.outcome.ok());
    CHECK(std::equal(c.caller_context.bytes.begin(), c.caller_context.bytes.end(), expected.begin()));
    ++ledger.delivered;
  });
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 5; }, 10s));
  CHECK(service.outstanding() == 0);
}

TEST_CASE("a write with immediate data handed back by another's deadline fails, never posted twice",
          "[faults][deadline][notification]") {
  Peer frozen = Peer::start(1 << 20);
  asio::io_context io;
  Service service(io, configuration());
  Ledger ledger;
  service.submit(write_to(frozen.ad, 1, 4096, -1), ledger.handler(-1));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  frozen.child->signal(SIGSTOP);
  auto notifying = write_to(frozen.ad, 1, 64 * 1024, 0);
  notifying.immediate_data = 42;
  service.submit(std::move(notifying), ledger.handler(0));
  service.submit(write_to(frozen.ad, 1, 64 * 1024, 1), ledger.handler(1));
  (void)run_until(
      io, [] { return false; }, 100ms);  // posted
  auto short_one = write_to(frozen.ad, 1, 4096, 2);
  short_one.deadline = 300ms;
  service.submit(std::move(short_one), ledger.handler(2));
  REQUIRE(run_until(
      io, [&] { return ledger.outcomes.count(2) != 0 && ledger.outcomes.count(0) != 0; }, 20s));
  CHECK(is_timed_out(ledger.of(2)));
  INFO(ledger.of(0).message());
  CHECK(ledger.of(0).error() == dma::errc::connection_lost);
  CHECK(ledger.of(0).message().find("immediate data") != std::string::npos);
  CHECK(ledger.outcomes.count(1) == 0);  // the plain write goes again, and waits for its deadline

  frozen.child->signal(SIGCONT);
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 4; }, 30s));
  CHECK(ledger.of(1).ok());
  CHECK(ledger.exactly_once(0, 3));
}

TEST_CASE("close() with writes posted to a frozen peer delivers each within progress_deadline plus 2 s",
          "[faults][shutdown]") {
  Peer frozen = Peer::start(1 << 20);
  asio::io_context io;
  auto service = std::make_unique<Service>(io, configuration());
  Ledger ledger;
  service->submit(write_to(frozen.ad, 1, 4096, -1), ledger.handler(-1));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  frozen.child->signal(SIGSTOP);
  for (int id = 0; id < 100; ++id)
    service->submit(write_to(frozen.ad, 1, 64 * 1024, id), ledger.handler(id));
  io.restart();
  io.run_for(100ms);  // posted
  const auto start = Clock::now();
  service.reset();  // close(), then the service object is gone
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 101; }, 10s));
  CHECK(Clock::now() - start < dma::Configuration{}.progress_deadline + 2s);
  CHECK(ledger.exactly_once(0, 100));
  CHECK(ledger.count_if(0, 100, [](const dma::Outcome& o) { return o.error() == dma::errc::shutdown; }) == 100);
  frozen.child->signal(SIGCONT);
}

TEST_CASE("the callback service's destructor returns with writes posted to a frozen peer", "[faults][shutdown]") {
  Peer frozen = Peer::start(1 << 20);
  std::mutex mutex;
  std::vector<dma::Outcome> seen;
  auto service = dma::FabricService<Payload>::start(
      configuration(),
      [&](std::span<dma::Completion<Payload>> batch) {
        std::lock_guard lock(mutex);
        for (auto& c : batch)
          seen.push_back(c.outcome);
      },
      nullptr);
  REQUIRE_FALSE(service->submit(write_to(frozen.ad, 1, 4096, 0)));
  const auto warm = Clock::now() + 10s;
  while (Clock::now() < warm) {
    {
      std::lock_guard lock(mutex);
      if (!seen.empty()) break;
    }
    std::this_thread::sleep_for(2ms);
  }
  frozen.child->signal(SIGSTOP);
  for (int id = 1; id <= 50; ++id)
    REQUIRE_FALSE(service->submit(write_to(frozen.ad, 1, 64 * 1024, id)));
  std::this_thread::sleep_for(100ms);
  const auto start = Clock::now();
  service.reset();
  CHECK(Clock::now() - start < dma::Configuration{}.progress_deadline + 2s);
  std::lock_guard lock(mutex);
  CHECK(seen.size() == 51);
  frozen.child->signal(SIGCONT);
}

// Stopping a service closes its endpoint. On tcp;ofi_rxm before libfabric 1.18 that close hands a
// read whose response is half received back twice and crashes inside fi_close
// (docs/notes/rxm-close-crash.md); the peer stopped while it sent the response leaves exactly that.
// DMA_FAULT_REPEAT sets the rounds (4 unless set).
TEST_CASE("the callback service's stop with reads half received from a frozen peer hands each back once",
          "[faults][shutdown]") {
  constexpr std::size_t size = 16 << 20;
  constexpr int reads = 4;
  const char* repeat = std::getenv("DMA_FAULT_REPEAT");
  const int rounds = repeat != nullptr && std::atoi(repeat) > 0 ? std::atoi(repeat) : 4;
  for (int round = 0; round < rounds; ++round) {
    Peer frozen = Peer::start(size);
    std::mutex mutex;
    std::map<int, int> seen;
    std::size_t delivered = 0;
    auto service = dma::FabricService<Payload>::start(
        configuration(),
        [&](std::span<dma::Completion<Payload>> batch) {
          std::lock_guard lock(mutex);
          for (auto& c : batch) {
            ++seen[c.caller_context.id];
            ++delivered;
          }
        },
        nullptr);
    auto read = [&](int id) {
      dma::TransferRequest<Payload> r;
      r.client_id = 1;
      r.set_peer(frozen.ad);
      r.direction = dma::Direction::FromPeer;
      r.length = size;
      r.caller_context.id = id;
      return r;
    };
    auto delivered_now = [&] {
      std::lock_guard lock(mutex);
      return delivered;
    };
    REQUIRE_FALSE(service->submit(read(0)));  // connects
    const auto warm = Clock::now() + 20s;
    while (delivered_now() == 0 && Clock::now() < warm)
      std::this_thread::sleep_for(1ms);
    REQUIRE(delivered_now() == 1);
    for (int id = 1; id <= reads; ++id)
      REQUIRE_FALSE(service->submit(read(id)));
    // Responses under way: the peer starts sending some milliseconds after the requests.
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + (round * 7) % 45));
    frozen.child->signal(SIGSTOP);
    const auto start = Clock::now();
    service.reset();
    const auto took = Clock::now() - start;
    INFO("round " << round << ": stop took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                  << " ms");
    CHECK(took < dma::Configuration{}.progress_deadline + (sanitized ? 20s : 5s));
    std::lock_guard lock(mutex);
    CHECK(delivered == reads + 1);
    for (int id = 0; id <= reads; ++id)
      CHECK(seen[id] == 1);
    frozen.child->signal(SIGCONT);
  }
}

TEST_CASE("a write with a wrong key fails alone; the next correct write to that target succeeds", "[faults][hostile]") {
  Peer peer = Peer::start(4096);
  asio::io_context io;
  Service service(io, configuration());
  Ledger ledger;
  auto bad_key = write_to(peer.ad, 1, 4096, 0);
  bad_key.remote_key ^= 0x5a5a;
  service.submit(std::move(bad_key), ledger.handler(0));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  INFO(ledger.of(0).message());
  CHECK(ledger.of(0).error() == dma::errc::connection_lost);
  CHECK(ledger.of(0).error() == dma::condition::connection_lost);

  // A second client sharing the address, and the first one again: both land, no back-off.
  service.submit(write_to(peer.ad, 2, 4096, 1), ledger.handler(1));
  service.submit(write_to(peer.ad, 1, 4096, 2), ledger.handler(2));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 3; }, 10s));
  INFO(ledger.of(1).message() << " / " << ledger.of(2).message());
  CHECK(ledger.of(1).ok());
  CHECK(ledger.of(2).ok());

  auto past_end = write_to(peer.ad, 1, 8192, 3);  // the region has 4096 bytes
  service.submit(std::move(past_end), ledger.handler(3));
  service.submit(write_to(peer.ad, 1, 4096, 4), ledger.handler(4));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 5; }, 10s));
  CHECK(ledger.of(3).error() == dma::errc::connection_lost);
  // Posted right behind the bad one, the correct write may share its torn-down connection.
  auto retry = write_to(peer.ad, 1, 4096, 5);
  service.submit(std::move(retry), ledger.handler(5));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 6; }, 10s));
  CHECK(ledger.of(5).ok());
  CHECK(service.metrics().peers_marked_unreachable == 0);
}

TEST_CASE("one client's wrong keys fail alone while another client writes 1,000 times to the same target",
          "[faults][hostile]") {
  constexpr int total = 1000;
  constexpr int wrong = 5;
  constexpr std::size_t size = 64 * 1024;
  Peer peer = Peer::start(size);
  asio::io_context io;
  Service service(io, configuration());
  Ledger ledger;
  // Client 2 keeps 32 writes in flight; client 1 sends a wrong key every 150 completions.
  int next = 0, wrong_sent = 0;
  auto top_up = [&] {
    const auto in_flight = [&] { return next + wrong_sent - static_cast<int>(ledger.delivered); };
    while (next < total && in_flight() < 32) {
      service.submit(write_to(peer.ad, 2, size, next), ledger.handler(next));
      ++next;
    }
    if (wrong_sent < wrong && static_cast<int>(ledger.delivered) >= 150 * (wrong_sent + 1)) {
      auto bad = write_to(peer.ad, 1, 4096, 5000 + wrong_sent);
      bad.remote_key ^= 0x5a5a;
      service.submit(std::move(bad), ledger.handler(5000 + wrong_sent));
      ++wrong_sent;
    }
  };
  REQUIRE(run_until(
      io,
      [&] {
        top_up();
        return ledger.delivered == static_cast<std::size_t>(total + wrong);
      },
      60s));
  CHECK(ledger.exactly_once(0, total));
  CHECK(ledger.exactly_once(5000, wrong));
  for (int id = 0; id < total; ++id) {
    if (ledger.of(id).ok()) continue;
    FAIL_CHECK("write " << id << " failed: " << ledger.of(id).message());
    break;
  }
  CHECK(ledger.count_if(0, total, is_ok) == static_cast<std::size_t>(total));
  for (int id = 5000; id < 5000 + wrong; ++id) {
    INFO(ledger.of(id).message());
    CHECK(ledger.of(id).error() == dma::errc::connection_lost);
  }
  CHECK(service.metrics().peers_marked_unreachable == 0);
  INFO("posted again alone: " << service.metrics().isolated_retries);
  CHECK(service.metrics().isolated_retries >= static_cast<std::uint64_t>(wrong));  // each wrong key once, at least
  CHECK(service.outstanding() == 0);
}

TEST_CASE("add_peer with a restarted peer's advertisement ends its back-off at once", "[faults][kill]") {
  auto config = configuration();
  config.progress_deadline = 300ms;
  config.unreachable_backoff = 30s;  // far longer than the test: only add_peer can end it
  config.unreachable_backoff_max = 30s;
  std::optional<Peer> peer = Peer::start_at_a_port_of_its_own(4096, 0x9e37u);
  REQUIRE(peer);
  const std::uint16_t port = peer->port();
  asio::io_context io;
  Service service(io, config);
  Ledger ledger;
  service.submit(write_to(peer->ad, 1, 4096, 0), ledger.handler(0));
  REQUIRE(run_until(
      io, [&] { return ledger.delivered == 1; }, 10s));
  REQUIRE(ledger.of(0).ok());
  peer->child->kill_now();
  // Writes fail until one finds the peer backing off.
  int id = 1;
  for (; id < 10; ++id) {
    service.submit(write_to(peer->ad, 1, 4096, id), ledger.handler(id));
    REQUIRE(run_until(
        io, [&] { return ledger.outcomes.count(id) != 0; }, 10s));
    INFO(ledger.of(id).message());
    REQUIRE_FALSE(ledger.of(id).ok());
    if (ledger.of(id).error() == dma::errc::peer_unreachable) break;
  }
  REQUIRE(id < 10);

  Peer restarted = Peer::start(4096, port);
  REQUIRE(restarted.port() == port);
  std::optional<std::error_code> added;
  service.add_peer(1, restarted.ad.address, [&](std::error_code ec) { added = ec; });
  REQUIRE(run_until(
      io, [&] { return added.has_value(); }, 10s));
  CHECK_FALSE(*added);
  service.submit(write_to(restarted.ad, 1, 4096, 100), ledger.handler(100));
  REQUIRE(run_until(
      io, [&] { return ledger.outcomes.count(100) != 0; }, 10s));
  INFO(ledger.of(100).message());
  CHECK(ledger.of(100).ok());
}

TEST_CASE("a service that cannot open returns or throws its error and the process goes on", "[faults][start]") {
  dma::Configuration efa;
  efa.providers = {dma::Provider::efa_direct};
  std::error_code ec;
  auto service = dma::FabricService<Payload>::start(
      efa, [](std::span<dma::Completion<Payload>>) {}, nullptr, ec);
  CHECK(service == nullptr);
  CHECK(ec);
  CHECK_THROWS_AS(dma::FabricService<Payload>::start(
                      efa, [](std::span<dma::Completion<Payload>>) {}, nullptr),
                  std::system_error);
  asio::io_context io;
  CHECK_THROWS_AS(Service(io, efa), std::system_error);
  dma::Configuration bad = configuration();
  bad.unreachable_backoff_max = 1ms;
  bad.unreachable_backoff = 1s;
  std::error_code bad_ec;
  Service closed(io.get_executor());
  closed.open(bad, bad_ec);
  CHECK(bad_ec == dma::errc::invalid_configuration);
}

TEST_CASE("100 torn-down and rebuilt connections and 100 endpoint replacements leak no fd and no memory",
          "[faults][leaks]") {
  Peer peer = Peer::start(64 << 20);
  asio::io_context io;
  Service service(io, configuration());
  Ledger ledger;
  int id = 0;
  auto cycle_bad_key = [&] {
    auto bad = write_to(peer.ad, 1, 4096, id);
    bad.remote_key ^= 1;
    service.submit(std::move(bad), ledger.handler(id));
    ++id;
    service.submit(write_to(peer.ad, 1, 4096, id), ledger.handler(id));
    ++id;
    const std::size_t want = static_cast<std::size_t>(id);
    REQUIRE(run_until(
        io, [&] { return ledger.delivered == want; }, 10s));
    if (!ledger.of(id - 1).ok()) {  // it shared the torn-down connection: the next one lands
      service.submit(write_to(peer.ad, 1, 4096, id), ledger.handler(id));
      ++id;
      const std::size_t again = static_cast<std::size_t>(id);
      REQUIRE(run_until(
          io, [&] { return ledger.delivered == again; }, 10s));
      REQUIRE(ledger.of(id - 1).ok());
    }
  };
  // One 64 MiB source for every cancelled write, so the process's size does not depend on
  // whether a payload happens to be alive when it is measured.
  struct Shared {
    std::shared_ptr<const std::vector<std::byte>> bytes;
    std::span<const std::byte> source() const { return *bytes; }
  };
  dma::asynchronous::FabricService<Shared> big_service(io, configuration());
  const auto big_bytes = std::make_shared<const std::vector<std::byte>>(64 << 20, std::byte{0x3c});
  std::size_t cancelled_done = 0;
  const auto small_bytes = std::make_shared<const std::vector<std::byte>>(4096, std::byte{0x3c});
  auto cycle_cancel = [&] {
    // The current endpoint connects with the peer running; then the peer freezes, so the big
    // write is still in flight when it is cancelled, however fast the machine moves 64 MiB.
    dma::TransferRequest<Shared> warm;
    warm.client_id = 1;
    warm.set_peer(peer.ad);
    warm.caller_context.bytes = small_bytes;
    bool warmed = false;
    big_service.submit(std::move(warm), [&](std::error_code, dma::Completion<Shared> c) { warmed = c.outcome.ok(); });
    REQUIRE(run_until(
        io, [&] { return warmed; }, 10s));
    peer.child->signal(SIGSTOP);
    asio::cancellation_signal signal;
    dma::TransferRequest<Shared> big;
    big.client_id = 1;
    big.set_peer(peer.ad);
    big.caller_context.bytes = big_bytes;
    const auto posted = big_service.metrics().posted;
    const std::size_t want = cancelled_done + 1;
    big_service.submit(std::move(big),
                       asio::bind_cancellation_slot(
                           signal.slot(), [&](std::error_code, dma::Completion<Shared>) { ++cancelled_done; }));
    REQUIRE(run_until(
        io, [&] { return big_service.metrics().posted > posted; }, 10s));
    signal.emit(asio::cancellation_type::terminal);  // the peer is frozen: still in flight
    const bool cancelled = run_until(
        io, [&] { return cancelled_done == want; }, 10s);
    peer.child->signal(SIGCONT);
    REQUIRE(cancelled);
  };
  for (int i = 0; i < 5; ++i) {
    cycle_bad_key();
    cycle_cancel();
  }
  const std::size_t fds = open_fds();
  const std::size_t rss = rss_kib();
  for (int i = 0; i < 100; ++i)
    cycle_bad_key();
  for (int i = 0; i < 100; ++i)
    cycle_cancel();
  CHECK(ledger.exactly_once(0, id));
  CHECK(big_service.metrics().endpoint_replacements >= 90);
  INFO("fds " << fds << " -> " << open_fds() << ", rss " << rss << " -> " << rss_kib() << " KiB");
  CHECK(open_fds() <= fds + 2);
  // AddressSanitizer keeps freed memory in its quarantine (256 MiB), so a closed endpoint's pools
  // stay resident there; LeakSanitizer checks for leaks in that build instead.
  if (!address_sanitizer) CHECK(rss_kib() < rss + rss / 10 + 8 * 1024);
  CHECK(service.outstanding() == 0);
  CHECK(big_service.outstanding() == 0);
}

namespace {

// A view of a buffer the test keeps, so many large transfers share one.
struct Slice {
  std::span<std::byte> bytes;
  int id = 0;
  std::span<const std::byte> source() const { return bytes; }
};

}  // namespace

TEST_CASE("a peer killed mid-stripe fails each striped or segmented write once", "[faults][kill][stripe]") {
  const std::size_t endpoints = GENERATE(std::size_t{1}, std::size_t{4});
  INFO(endpoints << " endpoints, 16 MiB writes in 1 MiB segments");
  constexpr std::size_t size = 16 << 20;
  constexpr int total = 100;
  Peer peer = Peer::start(size);
  asio::io_context io;
  auto c = configuration();
  c.endpoints = endpoints;
  c.stripe_threshold = 1 << 20;
  c.max_segment_bytes = 1 << 20;
  dma::asynchronous::FabricService<Slice> service(io, c);
  std::vector<std::byte> buffer(size, std::byte{0x3c});
  std::map<int, int> calls;
  std::size_t delivered = 0, ok = 0;
  for (int id = 0; id < total; ++id) {
    dma::TransferRequest<Slice> r;
    r.client_id = 1;
    r.set_peer(peer.ad);
    r.caller_context = {buffer, id};
    service.submit(std::move(r), [&](std::error_code, dma::Completion<Slice> done) {
      ++calls[done.caller_context.id];
      if (done.outcome.ok()) ++ok;
      // Killed from the second completion's handler, so the rest are still posted or queued
      // however fast the machine moves them.
      if (++delivered == 2) peer.child->kill_now();
    });
  }
  REQUIRE(run_until(
      io, [&] { return delivered == static_cast<std::size_t>(total); }, 30s));
  CHECK(calls.size() == static_cast<std::size_t>(total));
  CHECK(std::all_of(calls.begin(), calls.end(), [](const auto& entry) { return entry.second == 1; }));
  INFO("succeeded before the kill: " << ok);
  CHECK(ok >= 2);
  CHECK(ok < static_cast<std::size_t>(total));
  CHECK(service.outstanding() == 0);
  // Nothing more arrives later.
  (void)run_until(
      io, [] { return false; }, 300ms);
  CHECK(delivered == static_cast<std::size_t>(total));
  CHECK(service.metrics().posts_in_flight == 0);
}
