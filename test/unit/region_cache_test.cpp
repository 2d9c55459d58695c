// The registration cache over a real tcp domain: which entries a lookup finds, which ones leave
// (invalidate, the limits, same-base replacement, clear_domain), and when each MR is closed.
#include "region_cache.hpp"
#include "../catch.hpp"

#include <dma/endpoint.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

using dma::detail::CacheLimits;
using dma::detail::Fid;
using dma::detail::MrCloser;
using dma::detail::RegionCache;
using dma::detail::Registration;

namespace {

constexpr std::size_t KiB = 1024;

// tcp refuses a requested key it already handed out (-FI_ENOKEY).
std::uint64_t next_key() {
  static std::atomic<std::uint64_t> key{1};
  return key++;
}

// Records which registrations were closed, by the tag each one keeps alive. Deferred, it holds the
// MRs until drain() closes them on the calling thread, as the engine's strand does.
class RecordingCloser : public MrCloser {
 public:
  explicit RecordingCloser(bool deferred = false) : deferred_(deferred) {}

  void close(Fid<fid_mr>&& mr, std::shared_ptr<void> keep_alive) noexcept override {
    std::lock_guard lock(mutex_);
    if (deferred_) {
      pending_.push_back({std::move(mr), std::move(keep_alive)});
      return;
    }
    mr.reset();
    closed_.push_back(*static_cast<int*>(keep_alive.get()));
  }

  void drain() {
    std::vector<Pending> pending;
    {
      std::lock_guard lock(mutex_);
      pending.swap(pending_);
    }
    for (auto& p : pending) {
      REQUIRE(p.mr.reset() == 0);
      std::lock_guard lock(mutex_);
      closed_.push_back(*static_cast<int*>(p.keep_alive.get()));
    }
  }

  bool closed(int tag) const { return times_closed(tag) != 0; }
  std::size_t times_closed(int tag) const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count(closed_.begin(), closed_.end(), tag));
  }
  std::size_t closes() const {
    std::lock_guard lock(mutex_);
    return closed_.size();
  }

 private:
  struct Pending {
    Fid<fid_mr> mr;
    std::shared_ptr<void> keep_alive;
  };
  bool deferred_;
  mutable std::mutex mutex_;
  std::vector<Pending> pending_;
  std::vector<int> closed_;
};

// One tcp domain and 1 MiB to register in it. Clears its domain from the cache before the domain
// closes, as the library does.
struct Fabric {
  explicit Fabric(bool deferred = false) : closer(std::make_shared<RecordingCloser>(deferred)) {
    dma::Configuration configuration;
    configuration.bind = "127.0.0.1";
    endpoint.open(configuration);
  }
  ~Fabric() {
    cache().clear_domain(domain());
    closer->drain();
  }
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  static RegionCache& cache() { return RegionCache::instance(); }
  const void* domain() const { return endpoint.domain(); }
  std::uintptr_t at(std::size_t offset) const { return reinterpret_cast<std::uintptr_t>(memory.data()) + offset; }

  /// A registration over [base, base + length) whose keep_alive is a fresh tag, returned in `tag`.
  std::shared_ptr<Registration> register_range(const std::byte* base, std::size_t length, int& tag) {
    std::error_code ec;
    auto mr = endpoint.register_memory(base, length, FI_READ | FI_WRITE, next_key(), ec);
    REQUIRE_FALSE(ec);
    tag = next_tag++;
    return std::make_shared<Registration>(std::move(mr), closer, std::make_shared<int>(tag));
  }

  /// Registers [offset, offset + length) of this fabric's memory; the cache is its only holder.
  int track(std::size_t offset, std::size_t length, bool pinned = false) {
    return track_range(memory.data() + offset, length, pinned);
  }
  /// The same for any memory, e.g. another fabric's.
  int track_range(const std::byte* base, std::size_t length, bool pinned = false) {
    int tag = 0;
    auto registration = register_range(base, length, tag);
    const auto start = reinterpret_cast<std::uintptr_t>(base);
    cache().track(domain(), start, start + length, std::move(registration), pinned);
    return tag;
  }

  std::shared_ptr<Registration> covering(std::size_t offset, std::size_t length) {
    return cache().covering(domain(), at(offset), at(offset + length));
  }
  bool cached(std::size_t offset, std::size_t length) { return covering(offset, length) != nullptr; }
  dma::detail::CacheStats stats() const { return cache().stats(domain()); }

  dma::Endpoint endpoint;
  std::vector<std::byte> memory = std::vector<std::byte>(1024 * KiB);
  std::shared_ptr<RecordingCloser> closer;
  int next_tag = 1;
};

bool descriptor_is_current(const Registration& registration) {
  return registration.mr() != nullptr && registration.descriptor() == fi_mr_desc(registration.mr());
}

}  // namespace

TEST_CASE("freeing one value does not deregister a neighbour that is still in flight", "[cache]") {
  Fabric f;
  const int span = f.track(0, 64 * KiB);
  auto lease = f.covering(0, 4 * KiB);
  REQUIRE(lease);
  CHECK(lease.use_count() == 2);

  Fabric::cache().invalidate(f.at(32 * KiB), f.at(32 * KiB + 8));

  CHECK_FALSE(f.covering(0, 4 * KiB));
  CHECK(lease.use_count() == 1);
  CHECK_FALSE(f.closer->closed(span));
  CHECK(descriptor_is_current(*lease));

  lease.reset();
  CHECK(f.closer->times_closed(span) == 1);
}

TEST_CASE("a cacheable span widens the registration", "[cache]") {
  Fabric f;
  f.track(0, 64 * KiB);
  auto first = f.covering(0, 16);
  auto far_end = f.covering(64 * KiB - 16, 16);
  REQUIRE(first);
  CHECK(far_end == first);
  CHECK_FALSE(f.covering(64 * KiB - 16, 32));  // crosses the span's end
  CHECK(f.stats().hits == 2);
  CHECK(f.stats().misses == 1);
}

TEST_CASE("a registration handed to a caller outlives its cache entry", "[cache]") {
  Fabric f;
  const int span = f.track(0, 64 * KiB);
  auto lease = f.covering(0, 4 * KiB);
  REQUIRE(lease);

  Fabric::cache().invalidate(f.at(0), f.at(64 * KiB));

  CHECK(f.stats().entries == 0);
  CHECK_FALSE(f.closer->closed(span));
  CHECK(descriptor_is_current(*lease));
  lease.reset();
  CHECK(f.closer->closed(span));
}

TEST_CASE("a pinned span serves the operands inside it", "[cache]") {
  Fabric f;
  f.track(0, 256 * KiB, true);
  auto start = f.covering(0, 64);
  REQUIRE(start);
  CHECK(f.covering(100 * KiB, 4 * KiB) == start);
  CHECK(f.covering(256 * KiB - 1, 1) == start);
  CHECK(f.covering(0, 256 * KiB) == start);
  CHECK_FALSE(f.covering(256 * KiB - 1, 2));
  CHECK_FALSE(f.covering(256 * KiB, 1));
  CHECK(f.stats().hits == 4);
  CHECK(f.stats().misses == 2);
}

TEST_CASE("dropping a region retires its registration and the spans overlapping it", "[cache]") {
  Fabric f;
  const int region = f.track(0, 64 * KiB, true);
  const int overlapping = f.track(32 * KiB, 64 * KiB);
  const int beyond = f.track(64 * KiB, 64 * KiB);  // starts where the region ends

  Fabric::cache().invalidate(f.at(0), f.at(64 * KiB));

  CHECK_FALSE(f.cached(0, 16));
  CHECK_FALSE(f.cached(32 * KiB, 16));
  CHECK(f.cached(64 * KiB, 16));
  CHECK(f.closer->closed(region));
  CHECK(f.closer->closed(overlapping));
  CHECK_FALSE(f.closer->closed(beyond));
  CHECK(f.stats().invalidations == 2);
  CHECK(f.stats().entries == 1);
  CHECK(f.stats().bytes == 64 * KiB);
}

TEST_CASE("a region outliving its endpoint closes nothing twice", "[cache]") {
  Fabric f;
  const int region = f.track(0, 64 * KiB, true);
  const int span = f.track(128 * KiB, 64 * KiB);
  auto lease = f.covering(128 * KiB, 16);
  REQUIRE(lease);

  Fabric::cache().clear_domain(f.domain());
  CHECK(f.closer->times_closed(region) == 1);
  CHECK_FALSE(f.closer->closed(span));
  CHECK(f.stats().entries == 0);

  Fabric::cache().invalidate(f.at(0), f.at(256 * KiB));
  Fabric::cache().clear_domain(f.domain());
  CHECK(f.closer->closes() == 1);
  CHECK_FALSE(f.covering(0, 16));

  lease.reset();
  CHECK(f.closer->times_closed(span) == 1);
  CHECK(f.closer->closes() == 2);
}

TEST_CASE("descriptors stay valid while reclaims run underneath", "[cache]") {
  Fabric f(true);  // MRs close on this thread only, like the engine's strand
  constexpr std::size_t extents = 8;
  constexpr std::size_t extent = 64 * KiB;
  constexpr int rounds = 60;
  for (std::size_t i = 0; i < extents; ++i)
    f.track(i * extent, extent, i % 2 == 0);

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> stale{0};
  std::vector<std::thread> readers;
  readers.reserve(4);
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&, r] {
      while (!stop.load(std::memory_order_relaxed)) {
        for (std::size_t i = 0; i < extents; ++i) {
          const std::size_t offset = i * extent + static_cast<std::size_t>(r) * 512;
          auto lease = Fabric::cache().covering(f.domain(), f.at(offset), f.at(offset + 256));
          if (!lease) continue;
          if (!descriptor_is_current(*lease)) ++stale;
          ++hits;
        }
      }
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (hits.load() < 64 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();

  for (int round = 0; round < rounds && std::chrono::steady_clock::now() < deadline; ++round) {
    for (std::size_t i = 0; i < extents; ++i) {
      Fabric::cache().invalidate(f.at(i * extent + 4 * KiB), f.at(i * extent + 8 * KiB));
      f.track(i * extent, extent, (i + static_cast<std::size_t>(round)) % 2 == 0);
    }
    f.closer->drain();
  }
  const bool in_time = std::chrono::steady_clock::now() < deadline;
  stop = true;
  for (auto& reader : readers)
    reader.join();
  f.closer->drain();

  CHECK(in_time);
  CHECK(hits.load() > 0);
  CHECK(stale.load() == 0);
  CHECK(f.stats().entries == extents);
  CHECK(f.stats().invalidations == extents * rounds);
  CHECK(f.closer->closes() == extents * rounds);  // every replaced MR, each once
}

TEST_CASE("the least recently used span is evicted first when over the entry limit", "[cache]") {
  Fabric f;
  Fabric::cache().set_limits(f.domain(), CacheLimits{3, 0});
  const int a = f.track(0, 16 * KiB);
  const int b = f.track(16 * KiB, 16 * KiB);
  const int c = f.track(32 * KiB, 16 * KiB);
  REQUIRE(f.covering(0, 16));  // refreshes a: b is now the least recently used

  const int d = f.track(48 * KiB, 16 * KiB);

  CHECK(f.closer->closed(b));
  for (int kept : {a, c, d})
    CHECK_FALSE(f.closer->closed(kept));
  CHECK_FALSE(f.cached(16 * KiB, 16));
  CHECK(f.stats().entries == 3);
  CHECK(f.stats().evictions == 1);
}

TEST_CASE("the least recently used spans are evicted first when over the byte limit", "[cache]") {
  Fabric f;
  Fabric::cache().set_limits(f.domain(), CacheLimits{0, 64 * KiB});
  const int a = f.track(0, 16 * KiB);
  const int b = f.track(16 * KiB, 16 * KiB);
  const int c = f.track(32 * KiB, 16 * KiB);
  REQUIRE(f.covering(0, 16));

  const int d = f.track(64 * KiB, 32 * KiB);  // 80 KiB: b alone has to go

  CHECK(f.closer->closed(b));
  for (int kept : {a, c, d})
    CHECK_FALSE(f.closer->closed(kept));
  CHECK(f.stats().bytes == 64 * KiB);
  CHECK(f.stats().evictions == 1);
}

TEST_CASE("a span larger than the byte limit stays cached and pushes out every other span", "[cache]") {
  Fabric f;
  Fabric::cache().set_limits(f.domain(), CacheLimits{0, 64 * KiB});
  const int a = f.track(0, 16 * KiB);
  const int b = f.track(16 * KiB, 16 * KiB);

  const int big = f.track(128 * KiB, 128 * KiB);

  CHECK(f.closer->closed(a));
  CHECK(f.closer->closed(b));
  CHECK_FALSE(f.closer->closed(big));
  CHECK(f.covering(128 * KiB, 128 * KiB));
  CHECK(f.stats().entries == 1);
  CHECK(f.stats().evictions == 2);
}

TEST_CASE("pinned spans are never evicted", "[cache]") {
  Fabric f;
  Fabric::cache().set_limits(f.domain(), CacheLimits{1, 16 * KiB});
  const int pinned = f.track(0, 256 * KiB, true);
  const int a = f.track(256 * KiB, 8 * KiB);
  const int b = f.track(264 * KiB, 8 * KiB);
  CHECK(f.closer->closed(a));
  CHECK_FALSE(f.closer->closed(b));

  Fabric::cache().set_limits(f.domain(), CacheLimits{1, 1});  // evicts at once

  CHECK(f.closer->closed(b));
  CHECK_FALSE(f.closer->closed(pinned));
  CHECK(f.cached(100 * KiB, 16));
  CHECK(f.stats().entries == 1);
  CHECK(f.stats().bytes == 256 * KiB);
  CHECK(f.stats().evictions == 2);
}

TEST_CASE("the counters count hits, misses, evictions and invalidations per domain", "[cache]") {
  Fabric f;
  CHECK(f.stats().misses == 0);
  CHECK_FALSE(f.covering(0, 16));  // a domain the cache has not seen yet
  CHECK(f.stats().misses == 1);

  Fabric::cache().set_limits(f.domain(), CacheLimits{1, 0});
  f.track(0, 16 * KiB);
  f.track(16 * KiB, 16 * KiB);
  CHECK(f.covering(16 * KiB, 16));
  CHECK(f.covering(20 * KiB, 16));
  CHECK_FALSE(f.covering(0, 16));
  Fabric::cache().invalidate(f.at(0), f.at(1024 * KiB));

  const auto stats = f.stats();
  CHECK(stats.hits == 2);
  CHECK(stats.misses == 2);
  CHECK(stats.evictions == 1);
  CHECK(stats.invalidations == 1);
  CHECK(stats.entries == 0);
  CHECK(stats.bytes == 0);

  Fabric::cache().clear_domain(f.domain());
  CHECK(Fabric::cache().stats(f.domain()).hits == 0);
}

TEST_CASE("tracking the same base replaces the entry and lets the old registration go", "[cache]") {
  Fabric f;
  Fabric::cache().set_limits(f.domain(), CacheLimits{0, 48 * KiB});
  const int small = f.track(0, 16 * KiB);
  auto lease = f.covering(0, 16);
  REQUIRE(lease);

  const int wide = f.track(0, 32 * KiB);

  auto replaced = f.covering(16 * KiB, 16 * KiB);
  REQUIRE(replaced);
  CHECK(replaced != lease);
  CHECK_FALSE(f.closer->closed(small));
  lease.reset();
  CHECK(f.closer->closed(small));
  CHECK(f.stats().entries == 1);
  CHECK(f.stats().bytes == 32 * KiB);

  // Pinned in place of a span: it no longer counts against the limits.
  const int pinned = f.track(0, 32 * KiB, true);
  const int other = f.track(64 * KiB, 32 * KiB);
  CHECK_FALSE(f.closer->closed(pinned));
  CHECK_FALSE(f.closer->closed(other));
  CHECK(f.stats().evictions == 0);
  CHECK(f.stats().bytes == 64 * KiB);
  CHECK_FALSE(f.closer->closed(wide));  // `replaced` still holds it
  replaced.reset();
  CHECK(f.closer->closed(wide));
}

TEST_CASE("invalidating an untracked range is harmless", "[cache]") {
  Fabric f;
  Fabric::cache().invalidate(f.at(0), f.at(64 * KiB));  // a domain with nothing, or unknown
  const int span = f.track(16 * KiB, 16 * KiB);

  Fabric::cache().invalidate(f.at(0), f.at(16 * KiB));         // ends where the span starts
  Fabric::cache().invalidate(f.at(32 * KiB), f.at(64 * KiB));  // starts where it ends
  Fabric::cache().invalidate(f.at(20 * KiB), f.at(20 * KiB));  // empty
  Fabric::cache().invalidate(f.at(512 * KiB), f.at(1024 * KiB));

  CHECK(f.cached(16 * KiB, 16 * KiB));
  CHECK_FALSE(f.closer->closed(span));
  CHECK(f.stats().invalidations == 0);
}

TEST_CASE("invalidate finds every entry reaching into the range, nested ones too", "[cache]") {
  Fabric f;
  const int outer = f.track(0, 256 * KiB, true);
  const int before = f.track(16 * KiB, 16 * KiB);
  const int holding = f.track(40 * KiB, 8 * KiB);
  const int after = f.track(64 * KiB, 64 * KiB);

  Fabric::cache().invalidate(f.at(44 * KiB), f.at(45 * KiB));

  CHECK(f.closer->closed(outer));
  CHECK(f.closer->closed(holding));
  CHECK_FALSE(f.closer->closed(before));
  CHECK_FALSE(f.closer->closed(after));
  CHECK(f.stats().invalidations == 2);

  Fabric::cache().invalidate(f.at(20 * KiB), f.at(100 * KiB));
  CHECK(f.closer->closed(before));
  CHECK(f.closer->closed(after));
  CHECK(f.stats().entries == 0);
}

TEST_CASE("domains are independent: invalidate reaches every one, clear_domain only its own", "[cache]") {
  Fabric a;
  Fabric b;
  REQUIRE(a.domain() != b.domain());
  Fabric::cache().set_limits(a.domain(), CacheLimits{1, 0});
  const int in_a = a.track(0, 64 * KiB);
  const int in_b = b.track_range(a.memory.data(), 64 * KiB);  // the same memory in both domains
  const int only_b = b.track_range(a.memory.data() + 128 * KiB, 64 * KiB);
  const int other_in_b = b.track(0, 64 * KiB);

  Fabric::cache().invalidate(a.at(0), a.at(16));
  CHECK(a.closer->closed(in_a));
  CHECK(b.closer->closed(in_b));
  CHECK_FALSE(b.closer->closed(only_b));
  CHECK(a.stats().invalidations == 1);
  CHECK(b.stats().invalidations == 1);
  CHECK(b.stats().evictions == 0);  // a's limits are a's

  a.track(0, 64 * KiB);
  Fabric::cache().clear_domain(a.domain());
  CHECK(a.stats().entries == 0);
  CHECK(b.stats().entries == 2);
  CHECK_FALSE(b.closer->closed(other_in_b));
}

TEST_CASE("a registration without a closer closes its MR and then lets go of what it keeps alive", "[cache]") {
  Fabric f;
  std::error_code ec;
  auto mr = f.endpoint.register_memory(f.memory.data(), 4 * KiB, FI_READ | FI_WRITE, next_key(), ec);
  REQUIRE_FALSE(ec);
  void* const descriptor = fi_mr_desc(mr.get());
  auto storage = std::make_shared<int>(7);
  std::weak_ptr<int> watch = storage;
  {
    Registration registration(std::move(mr), nullptr, std::move(storage));
    CHECK(registration.descriptor() == descriptor);
    CHECK_FALSE(watch.expired());
  }
  CHECK(watch.expired());
}
