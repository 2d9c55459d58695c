#include "registrar.hpp"

#include <dma/error.hpp>

#include <rdma/fi_domain.h>

#include <atomic>

namespace dma::detail {
namespace {

// tcp rejects a requested key that another MR of the domain uses: every local MR gets its own.
std::atomic<std::uint64_t> local_key_counter{1};

}  // namespace

void Registrar::open(Setup setup) {
  setup_ = std::move(setup);
  RegionCache::instance().set_limits(setup_.domain, setup_.limits);
}

// The registration-cache path of the Rust crate: a hit costs one lookup; on a miss, the caller's
// CacheableSpan (when it contains the operand) is registered and cached, falling back to the
// operand alone; without a span, the registration lives only as long as this transfer.
void Registrar::lease(Operation& op, std::error_code& ec) {
  std::shared_ptr<Registration> lease = lease_range(op, reinterpret_cast<std::uintptr_t>(op.buffer), op.length, ec);
  if (!lease) return;
  state(op).descriptor = lease->descriptor();
  state(op).lease = std::move(lease);
}

void* Registrar::describe_buffer(const Operation& op, std::byte* base, std::size_t length, std::shared_ptr<void>& lease,
                                 std::error_code& ec) {
  if (!setup_.needed || length == 0) return nullptr;
  std::shared_ptr<Registration> registration = lease_range(op, reinterpret_cast<std::uintptr_t>(base), length, ec);
  if (!registration) return nullptr;
  void* descriptor = registration->descriptor();
  lease = std::move(registration);
  return descriptor;
}

std::shared_ptr<Registration> Registrar::lease_range(const Operation& op, std::uintptr_t start, std::size_t length,
                                                     std::error_code& ec) {
  if (length > UINTPTR_MAX - start) {
    ec = errc::operand_range_overflows;
    return nullptr;
  }
  const std::uintptr_t end = start + length;
  auto& cache = RegionCache::instance();
  std::shared_ptr<Registration> lease = cache.covering(setup_.domain, start, end);
  if (lease) return lease;
  const auto span = op.functions->cacheable_span(op);
  const bool cacheable = span && span->contains(start, end);
  std::uintptr_t base = cacheable ? span->base : start;
  std::uintptr_t stop = cacheable ? span->end : end;
  lease = register_range(base, stop, {}, ec);
  if (!lease && cacheable) {
    ec.clear();
    base = start;
    stop = end;
    lease = register_range(base, stop, {}, ec);
  }
  if (!lease) return nullptr;
  if (cacheable) cache.track(setup_.domain, base, stop, lease, false);
  return lease;
}

std::error_code Registrar::pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive) {
  if (length == 0) return errc::zero_length_region;
  if (length > UINTPTR_MAX - base) return errc::region_range_overflows;
  if (!setup_.needed) return {};
  std::error_code ec;
  auto registration = register_range(base, base + length, std::move(keep_alive), ec);
  if (registration) RegionCache::instance().track(setup_.domain, base, base + length, std::move(registration), true);
  return ec;
}

// Local access only (FI_READ | FI_WRITE, never remote), with a key no other MR of the domain uses.
std::shared_ptr<Registration> Registrar::register_range(std::uintptr_t base, std::uintptr_t end,
                                                        std::shared_ptr<void> keep_alive, std::error_code& ec) {
  const std::uint64_t key = setup_.provider_keys ? 0 : local_key_counter.fetch_add(1, std::memory_order_relaxed);
  // The range starts at an address a caller's pointer gave (the cache keys ranges by address).
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  auto mr = setup_.register_memory(reinterpret_cast<const void*>(base), end - base, key, ec);
  if (ec) return nullptr;
  registrations_.add();
  return std::make_shared<Registration>(std::move(mr), closer_, std::move(keep_alive));
}

Registrar::Setup Registrar::setup_for(Endpoint& endpoint, const Configuration& c) {
  return {endpoint.domain(),
          endpoint.requires_local_mr(),
          (endpoint.describe().mr_mode & FI_MR_PROV_KEY) != 0,
          {c.registration_cache_entries, c.registration_cache_bytes},
          [&endpoint](const void* base, std::size_t length, std::uint64_t key, std::error_code& e) {
            return endpoint.register_memory(base, length, FI_READ | FI_WRITE, key, e);
          }};
}

void Registrar::release() noexcept {
  if (setup_.domain != nullptr) RegionCache::instance().clear_domain(setup_.domain);
  closer_->retire();
}

CacheStats Registrar::cache_stats() const {
  return setup_.domain != nullptr ? RegionCache::instance().stats(setup_.domain) : CacheStats{};
}

void Registrar::report(Metrics& m) const {
  m.registrations = registrations();
  const CacheStats cache = cache_stats();
  m.cache_hits = cache.hits;
  m.cache_misses = cache.misses;
  m.cache_evictions = cache.evictions;
  m.cache_entries = cache.entries;
  m.cache_bytes = cache.bytes;
}

}  // namespace dma::detail
