// Local registrations (FI_READ | FI_WRITE, never remote access) and the process-global cache of
// them, keyed by domain. Leases are shared_ptr<Registration>: retiring an entry (invalidate, LRU
// eviction, MemoryRegion drop, domain clear) is immediate, but the MR is closed only when the last
// in-flight transfer holding a lease lets go.
#pragma once

#include <dma/detail/fid.hpp>

#include <rdma/fi_domain.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace dma::detail {

/// Closes MRs where the endpoint allows it (the engine's strand, since the domain is
/// FI_THREAD_DOMAIN). keep_alive is released only after the MR is closed: it is what keeps a
/// MemoryRegion's storage alive while a registration over it still exists.
class MrCloser {
 public:
  virtual ~MrCloser() = default;
  virtual void close(Fid<fid_mr>&& mr, std::shared_ptr<void> keep_alive) noexcept = 0;
};

/// One local registration. Always held through shared_ptr; the destructor hands the MR to its
/// closer (or closes it at once when there is no closer).
class Registration {
 public:
  Registration(Fid<fid_mr> mr, std::shared_ptr<MrCloser> closer, std::shared_ptr<void> keep_alive = {}) noexcept;
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  /// fi_mr_desc of the MR, read once at construction.
  void* descriptor() const noexcept { return descriptor_; }
  fid_mr* mr() const noexcept { return mr_.get(); }

 private:
  Fid<fid_mr> mr_;
  void* descriptor_ = nullptr;
  std::shared_ptr<MrCloser> closer_;
  std::shared_ptr<void> keep_alive_;
};

/// Bounds for one domain's evictable (CacheableSpan) entries; 0 means unbounded.
struct CacheLimits {
  std::size_t max_entries = 0;
  std::size_t max_bytes = 0;
};

struct CacheStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;      ///< entries pushed out by the limits (least recently used first)
  std::uint64_t invalidations = 0;  ///< entries removed by invalidate()
  std::size_t entries = 0;          ///< every entry, pinned ones included
  std::size_t bytes = 0;            ///< bytes of every entry, pinned ones included
};

/// The process-global registration cache. Every member is thread-safe; references are released
/// outside the lock (a close under the lock could re-enter through an allocator hook).
class RegionCache {
 public:
  static RegionCache& instance();

  /// Sets the bounds for domain (evicting at once if it is over them).
  void set_limits(const void* domain, CacheLimits limits);

  /// A lease on the entry with the greatest base <= start, if it also covers end (the Rust
  /// crate's single-candidate rule). Counts a hit or a miss, and refreshes the entry's LRU position.
  /// A hit takes one lock and one map lookup and allocates nothing. A miss on a domain the cache
  /// does not know is counted too, which starts that domain's stats.
  std::shared_ptr<Registration> covering(const void* domain, std::uintptr_t start, std::uintptr_t end);

  /// Tracks [base, end) for domain, replacing an entry with the same base. Pinned entries
  /// (MemoryRegion) are never evicted by the limits; the others are, least recently used first,
  /// though never the entry just tracked: one span over max_bytes alone stays and evicts the rest.
  /// An empty range or a null registration is not tracked.
  void track(const void* domain, std::uintptr_t base, std::uintptr_t end, std::shared_ptr<Registration> registration,
             bool pinned);

  /// On every domain, removes each entry overlapping [start, end). Harmless over untracked ranges.
  void invalidate(std::uintptr_t start, std::uintptr_t end);

  /// Forgets every entry of domain, its limits and its stats (before the domain closes).
  void clear_domain(const void* domain);

  CacheStats stats(const void* domain) const;

 private:
  RegionCache() = default;
  struct State;
  State& state() const;
};

}  // namespace dma::detail
