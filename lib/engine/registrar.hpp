// The registrar: local registration of operands (FI_MR_LOCAL providers, or forced), through the
// process-wide registration cache, and the closing of MRs on the engine's strand. Knows nothing
// of the endpoint beyond one function that registers memory; nothing here runs unless the
// provider needs local registration.
#pragma once

#include "counter.hpp"
#include "operation_state.hpp"
#include "region_cache.hpp"

#include <dma/configuration.hpp>
#include <dma/endpoint.hpp>
#include <dma/metrics.hpp>

#include <asio/post.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

namespace dma::detail {

/// An MrCloser that can be told the domain is about to close: it closes what it holds, then
/// refuses (releases without closing) whatever comes after.
class RetiringCloser : public MrCloser {
 public:
  virtual void retire() noexcept = 0;
};

/// Closes MRs on a strand (the domain is FI_THREAD_DOMAIN). A lease can drop on any thread (a
/// MemoryRegion released by its owner, invalidate() from an allocator hook): those MRs wait in a
/// queue that the strand drains. After retire(), nothing is closed any more.
template <typename Strand>
class StrandCloser final : public RetiringCloser, public std::enable_shared_from_this<StrandCloser<Strand>> {
 public:
  explicit StrandCloser(Strand strand) : strand_(std::move(strand)) {}

  void close(Fid<fid_mr>&& mr, std::shared_ptr<void> keep_alive) noexcept override {
    if (strand_.running_in_this_thread()) {
      if (!dead_) mr.reset();
      (void)mr.release();
      return;
    }
    bool schedule = false;
    {
      std::lock_guard lock(mutex_);
      if (dead_) {
        (void)mr.release();  // the domain is gone and took its MRs with it
        return;
      }
      queue_.push_back({std::move(mr), std::move(keep_alive)});
      schedule = !scheduled_;
      scheduled_ = true;
    }
    if (!schedule) return;
    try {
      asio::post(strand_, [self = this->shared_from_this()] { self->drain(); });
    } catch (...) {
      // Out of memory while posting: the next drain on the strand (at the latest retire()) closes it.
    }
  }

  /// On the strand: closes what other threads queued.
  void drain() noexcept {
    std::vector<Pending> closing;
    {
      std::lock_guard lock(mutex_);
      closing.swap(queue_);
      scheduled_ = false;
    }
    for (auto& pending : closing)
      pending.mr.reset();  // then keep_alive goes with the vector
  }

  /// On the strand, before the domain closes.
  void retire() noexcept override {
    drain();
    std::lock_guard lock(mutex_);
    dead_ = true;
  }

 private:
  struct Pending {
    Fid<fid_mr> mr;
    std::shared_ptr<void> keep_alive;
  };
  Strand strand_;
  std::mutex mutex_;
  std::vector<Pending> queue_;
  bool scheduled_ = false;
  bool dead_ = false;
};

class Registrar {
 public:
  /// fi_mr_reg of [base, base + length) for FI_READ | FI_WRITE with the requested key.
  using RegisterFn =
      std::function<Fid<fid_mr>(const void* base, std::size_t length, std::uint64_t key, std::error_code& ec)>;

  struct Setup {
    const void* domain = nullptr;  ///< the registration cache's key for this domain
    bool needed = false;           ///< the provider needs local descriptors (EndpointInfo::requires_local_mr)
    bool provider_keys = false;    ///< FI_MR_PROV_KEY: the provider picks keys
    CacheLimits limits;
    RegisterFn register_memory;
  };

  /// The setup for an open endpoint's domain, with the configuration's cache limits; it registers
  /// through endpoint, which must outlive the registrar's use of it.
  static Setup setup_for(Endpoint& endpoint, const Configuration& configuration);

  explicit Registrar(std::shared_ptr<RetiringCloser> closer) noexcept : closer_(std::move(closer)) {}
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;

  void open(Setup setup);

  /// The operand's local descriptor where the provider needs one (on the strand, before posting).
  void prepare(Operation& op, std::error_code& ec) {
    if (setup_.needed && !state(op).lease && op.length != 0) lease(op, ec);  // 0 bytes need no descriptor
  }

  /// The local descriptor of one of op's buffers, [base, base + length), with its registration
  /// in `lease`; null (and no lease) where the provider needs no local registration.
  void* describe_buffer(const Operation& op, std::byte* base, std::size_t length, std::shared_ptr<void>& lease,
                        std::error_code& ec);
  bool needed() const noexcept { return setup_.needed; }

  /// Registers [base, base + length) and tracks it as a pin (a MemoryRegion), keeping keep_alive
  /// until the MR closes. Nothing to do where the provider needs no local registration.
  std::error_code pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive);

  /// Closes every MR of the domain (on the strand, before the domain closes). Idempotent.
  void release() noexcept;

  std::uint64_t registrations() const noexcept { return registrations_.get(); }
  /// The cache's numbers for this domain (zero before open()).
  CacheStats cache_stats() const;
  /// Copies its counter and the cache's numbers into their Metrics fields.
  void report(Metrics& m) const;

 private:
  void lease(Operation& op, std::error_code& ec);
  std::shared_ptr<Registration> lease_range(const Operation& op, std::uintptr_t start, std::size_t length,
                                            std::error_code& ec);
  std::shared_ptr<Registration> register_range(std::uintptr_t base, std::uintptr_t end,
                                               std::shared_ptr<void> keep_alive, std::error_code& ec);

  std::shared_ptr<RetiringCloser> closer_;
  Setup setup_;
  Counter registrations_;
};

}  // namespace dma::detail
