// The process-global registration cache (seed §5.3) with the LRU and size bounds the seed lacks.
//
// Nothing is freed under the lock: a removed entry's map node and LRU node are moved into a local
// Retired (node handles and splice neither allocate nor free), which dies after the lock is let go.
// So the MR closes, and every free that could reach an allocator hook calling invalidate(), happen
// outside the lock.
#include "region_cache.hpp"

#include <algorithm>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <utility>

namespace dma::detail {

Registration::Registration(Fid<fid_mr> mr, std::shared_ptr<MrCloser> closer, std::shared_ptr<void> keep_alive) noexcept
    : mr_(std::move(mr)), closer_(std::move(closer)), keep_alive_(std::move(keep_alive)) {
  if (mr_) descriptor_ = fi_mr_desc(mr_.get());
}

Registration::~Registration() {
  if (closer_) {
    closer_->close(std::move(mr_), std::move(keep_alive_));
    return;
  }
  mr_.reset();  // before keep_alive_: the storage outlives its registration
  keep_alive_.reset();
}

namespace {

using Lru = std::list<std::uintptr_t>;  // evictable bases, most recently used first

struct Entry {
  std::uintptr_t end;
  std::shared_ptr<Registration> registration;
  bool pinned;
  Lru::iterator lru;  // meaningful only when !pinned
};

using Entries = std::map<std::uintptr_t, Entry>;

struct Retired;

struct Domain {
  Entries entries;
  Lru lru;
  std::size_t evictable_bytes = 0;
  std::size_t bytes = 0;
  // The longest entry since the map was last empty: bounds how far below a range invalidate looks
  // for entries reaching into it (entries may nest or overlap, so ends are not ordered by base).
  std::size_t max_length = 0;
  CacheLimits limits;
  CacheStats stats;

  bool over_limits() const noexcept {
    return (limits.max_entries != 0 && lru.size() > limits.max_entries) ||
           (limits.max_bytes != 0 && evictable_bytes > limits.max_bytes);
  }
  void remove(Entries::iterator it, Retired& retired) noexcept;
  void evict(Retired& retired, const std::uintptr_t* keep) noexcept;
};

/// What one call removed; destroyed after the lock is let go, which closes (or hands to its
/// closer) each MR whose last reference was the cache's.
struct Retired {
  std::multimap<std::uintptr_t, Entry> entries;  // Entries' node type; bases may repeat across domains
  Lru lru;
  std::map<const void*, Domain> domains;  // clear_domain
};

void Domain::remove(Entries::iterator it, Retired& retired) noexcept {
  const std::size_t length = it->second.end - it->first;
  bytes -= length;
  if (!it->second.pinned) {
    evictable_bytes -= length;
    retired.lru.splice(retired.lru.end(), lru, it->second.lru);
  }
  retired.entries.insert(entries.extract(it));
  if (entries.empty()) max_length = 0;
}

/// Least recently used first, never `keep` (the entry just tracked). A span larger than max_bytes
/// on its own therefore stays cached, since the operands inside it are about to use it, and pushes
/// out every other evictable entry.
void Domain::evict(Retired& retired, const std::uintptr_t* keep) noexcept {
  while (over_limits() && !lru.empty() && !(keep != nullptr && lru.back() == *keep)) {
    remove(entries.find(lru.back()), retired);
    ++stats.evictions;
  }
}

}  // namespace

struct RegionCache::State {
  std::mutex mutex;
  std::map<const void*, Domain> domains;  // few domains: a comparison or two beats hashing
};

RegionCache::State& RegionCache::state() const {
  // Never destroyed: invalidate() may run from allocator hooks during static destruction.
  static State* const state = new State;
  return *state;
}

RegionCache& RegionCache::instance() {
  static RegionCache cache;
  return cache;
}

void RegionCache::set_limits(const void* domain, CacheLimits limits) {
  Retired retired;
  State& s = state();
  std::lock_guard lock(s.mutex);
  Domain& d = s.domains[domain];
  d.limits = limits;
  d.evict(retired, nullptr);
}

std::shared_ptr<Registration> RegionCache::covering(const void* domain, std::uintptr_t start, std::uintptr_t end) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto found = s.domains.find(domain);
  if (found == s.domains.end()) {
    // Counted all the same, so the first miss of a domain shows in its stats; costs one
    // allocation on a path that is about to call fi_mr_reg.
    ++s.domains[domain].stats.misses;
    return nullptr;
  }
  Domain& d = found->second;
  // The single candidate: the entry with the greatest base <= start.
  auto it = d.entries.upper_bound(start);
  if (it == d.entries.begin() || end < start || std::prev(it)->second.end < end) {
    ++d.stats.misses;
    return nullptr;
  }
  Entry& entry = std::prev(it)->second;
  if (!entry.pinned) d.lru.splice(d.lru.begin(), d.lru, entry.lru);
  ++d.stats.hits;
  return entry.registration;
}

void RegionCache::track(const void* domain, std::uintptr_t base, std::uintptr_t end,
                        std::shared_ptr<Registration> registration, bool pinned) {
  if (end <= base || !registration) return;
  // The entry is built before the lock: only a domain's first entry allocates under it.
  Entries fresh;
  auto node = fresh.extract(fresh.emplace(base, Entry{end, std::move(registration), pinned, {}}).first);
  Lru fresh_lru;
  if (!pinned) fresh_lru.push_back(base);

  Retired retired;
  State& s = state();
  std::lock_guard lock(s.mutex);
  Domain& d = s.domains[domain];
  if (auto same = d.entries.find(base); same != d.entries.end()) d.remove(same, retired);
  const std::size_t length = end - base;
  if (!pinned) {
    node.mapped().lru = fresh_lru.begin();
    d.lru.splice(d.lru.begin(), fresh_lru);
    d.evictable_bytes += length;
  }
  d.entries.insert(std::move(node));
  d.bytes += length;
  d.max_length = std::max(d.max_length, length);
  d.evict(retired, &base);
}

void RegionCache::invalidate(std::uintptr_t start, std::uintptr_t end) {
  if (end <= start) return;
  Retired retired;
  State& s = state();
  std::lock_guard lock(s.mutex);
  for (auto& [key, d] : s.domains) {
    auto it = d.entries.lower_bound(start);
    // Entries below start that reach into the range: only those within max_length of it can.
    for (auto below = it; below != d.entries.begin();) {
      --below;
      if (start - below->first >= d.max_length) break;
      if (below->second.end > start) {
        d.remove(below++, retired);
        ++d.stats.invalidations;
      }
    }
    while (it != d.entries.end() && it->first < end) {
      d.remove(it++, retired);
      ++d.stats.invalidations;
    }
  }
}

void RegionCache::clear_domain(const void* domain) {
  Retired retired;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (auto found = s.domains.find(domain); found != s.domains.end()) {
    retired.domains.insert(s.domains.extract(found));
  }
}

CacheStats RegionCache::stats(const void* domain) const {
  State& s = state();
  std::lock_guard lock(s.mutex);
  auto found = s.domains.find(domain);
  if (found == s.domains.end()) return {};
  CacheStats stats = found->second.stats;
  stats.entries = found->second.entries.size();
  stats.bytes = found->second.bytes;
  return stats;
}

}  // namespace dma::detail
