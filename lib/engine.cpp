#include "dma/detail/engine.hpp"

#include "dma/advertisement.hpp"
#include "dma/detail/block_pool.hpp"
#include "dma/error.hpp"
#include "peer_table.hpp"
#include "region_cache.hpp"

#include <asio/bind_allocator.hpp>
#include <asio/bind_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <poll.h>

#include <array>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace dma::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Written only on the strand, read from anywhere: a relaxed load + store, no locked instruction.
class Counter {
 public:
  void add(std::uint64_t n = 1) noexcept {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  std::uint64_t get() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

std::string duration_text(std::chrono::nanoseconds d) {
  using namespace std::chrono;
  if (d % seconds(1) == nanoseconds(0)) return std::to_string(duration_cast<seconds>(d).count()) + "s";
  if (d % milliseconds(1) == nanoseconds(0)) return std::to_string(duration_cast<milliseconds>(d).count()) + "ms";
  if (d % microseconds(1) == nanoseconds(0)) return std::to_string(duration_cast<microseconds>(d).count()) + "µs";
  return std::to_string(d.count()) + "ns";
}

// Closes MRs on the engine's strand (the domain is FI_THREAD_DOMAIN). A lease can drop on any
// thread (a MemoryRegion released by its owner, invalidate() from an allocator hook): those MRs
// wait in a queue that the strand drains. After the endpoint closed, nothing is closed any more.
template <typename Strand>
class StrandCloser final : public MrCloser, public std::enable_shared_from_this<StrandCloser<Strand>> {
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
    if (schedule) {
      try {
        asio::post(strand_, [self = this->shared_from_this()] { self->drain(); });
      } catch (...) {
        // Out of memory while posting: the next drain on the strand (at the latest at shutdown) closes it.
      }
    }
  }

  // On the strand.
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

  // On the strand, before the domain closes: close what is queued, refuse the rest.
  void retire() noexcept {
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

std::atomic<std::uint64_t> local_key_counter{1};

// Inner is the executor under the strand: io_context's own executor when the service runs on an
// io_context (no type erasure on the hot path), any_io_executor otherwise.
template <typename Inner>
class EngineImpl final : public Engine, public std::enable_shared_from_this<EngineImpl<Inner>> {
  using strand_type = asio::strand<Inner>;
  using std::enable_shared_from_this<EngineImpl<Inner>>::shared_from_this;

 public:
  EngineImpl(const Inner& executor, const Configuration& configuration)
      : configuration_(configuration),
        strand_(asio::make_strand(executor)),
        closer_(std::make_shared<StrandCloser<strand_type>>(strand_)),
        backstop_(strand_),
        shutdown_timer_(strand_) {
    entries_.resize(std::max<std::size_t>(1, configuration_.cq_batch));
  }

  ~EngineImpl() override { abandon(); }

  void open(std::error_code& ec, std::string& what) {
    endpoint_.open(configuration_, ec);
    if (ec) {
      what = endpoint_.failed_step();
      return;
    }
    credits_ = endpoint_.credits();
    domain_key_ = endpoint_.domain();
    provider_keys_ = (endpoint_.describe().mr_mode & FI_MR_PROV_KEY) != 0;
    RegionCache::instance().set_limits(
        domain_key_, {configuration_.registration_cache_entries, configuration_.registration_cache_bytes});
    peers_.emplace(
        endpoint_.addr_format(),
        [this](std::span<const std::uint8_t> address, fi_addr_t& handle) {
          std::error_code insert_ec;
          handle = endpoint_.insert_address(address, insert_ec);
          return insert_ec;
        },
        [this](fi_addr_t handle) { (void)endpoint_.remove_address(handle); });
    if (endpoint_.wait_fd() >= 0 && configuration_.wait_mode != WaitMode::busy_poll) {
      // The fd belongs to libfabric: the descriptor is release()d, never closed, before fi_close(cq).
      descriptor_.emplace(strand_, endpoint_.wait_fd());
    }
  }

  // ---- any thread -------------------------------------------------------------------------
  void submit(Operation* op) override {
    outstanding_.fetch_add(1, std::memory_order_relaxed);
    bool schedule = false;
    // A handler that a reaper pass runs inline resubmits into that same pass: no strand post,
    // and no lock either, since only the strand touches pass_intake_.
    if (strand_.running_in_this_thread() && reaping_) {
      pass_intake_.push_back(op);
      joined_pass_.add();
      return;
    }
    {
      std::lock_guard lock(intake_mutex_);
      intake_.push_back(op);
      intake_waiting_.store(true, std::memory_order_release);
      schedule = !intake_scheduled_;
      intake_scheduled_ = true;
    }
    // The pool allocator, not Asio's thread-local recycling: this is freed on the strand's thread.
    if (schedule) {
      asio::post(strand_,
                 asio::bind_allocator(PoolAllocator<void>(), [self = shared_from_this()] { self->take_intake(); }));
    }
  }

  void cancel(Operation* op, std::uint64_t sequence) override {
    asio::post(strand_, [self = shared_from_this(), op, sequence] { self->cancel_pending(op, sequence); });
  }

  std::uint64_t next_sequence() noexcept override { return sequence_.fetch_add(1, std::memory_order_relaxed); }

  void remove_peer(std::uint64_t client_id) override {
    asio::post(strand_, [self = shared_from_this(), client_id] { self->remove_or_defer(client_id); });
  }

  void shutdown() override {
    asio::post(strand_, [self = shared_from_this()] { self->begin_shutdown(); });
  }

  std::size_t outstanding() const noexcept override { return outstanding_.load(std::memory_order_relaxed); }
  const std::vector<std::uint8_t>& local_address() const noexcept override { return endpoint_.local_address(); }
  EndpointInfo describe() const override { return endpoint_.describe(); }
  const Configuration& configuration() const noexcept override { return configuration_; }
  asio::any_io_executor strand() const noexcept override { return strand_; }

  void set_drain_hook(void (*hook)(void*), void* context) noexcept override {
    drain_hook_ = hook;
    drain_hook_context_ = context;
  }
  bool draining() const noexcept override { return reaping_ && strand_.running_in_this_thread(); }

  Metrics metrics() const noexcept override {
    Metrics m;
    m.posted = posted_.get();
    m.completed = completed_.get();
    m.failed = failed_.get();
    m.eagain = eagain_.get();
    m.cq_reads = cq_reads_.get();
    m.fd_wakeups = fd_wakeups_.get();
    m.spin_hits = spin_hits_.get();
    m.armed_late = armed_late_.get();
    m.backstop_hits = backstop_hits_.get();
    m.joined_pass = joined_pass_.get();
    m.context_less_errors = context_less_errors_.get();
    m.queue_errors = queue_errors_.get();
    m.registrations = registrations_.get();
    if (domain_key_ != nullptr) {
      const auto cache = RegionCache::instance().stats(domain_key_);
      m.cache_hits = cache.hits;
      m.cache_misses = cache.misses;
      m.cache_evictions = cache.evictions;
      m.cache_entries = cache.entries;
      m.cache_bytes = cache.bytes;
    }
    return m;
  }

  // ---- strand ------------------------------------------------------------------------------
  std::error_code insert_peer(std::uint64_t client_id, std::span<const std::uint8_t> address) override {
    if (!peers_) return errc::not_open;
    std::error_code ec = validate(address);
    if (!ec) (void)peers_->insert(client_id, address, ec);
    return ec;
  }

 private:
  std::error_code validate(std::span<const std::uint8_t> address) const;

  void take_intake() {
    {
      std::lock_guard lock(intake_mutex_);
      intake_scheduled_ = false;
    }
    absorb_intake();
    note_activity();
    post_pending();
    schedule_progress();
  }

  // Accepts whatever was submitted so far (on the strand): other threads' submissions first, then
  // this pass's own, which keeps each thread's order (a drain's first handler's resubmissions may
  // already have been accepted by post_joined_if_large). The lock is skipped when nothing waits.
  void absorb_intake() {
    OperationQueue batch;
    if (intake_waiting_.load(std::memory_order_acquire)) {
      std::lock_guard lock(intake_mutex_);
      batch.swap(intake_);
      intake_waiting_.store(false, std::memory_order_relaxed);
    }
    while (Operation* op = batch.pop_front())
      accept(op);
    accept_joined();
  }

  // Accepts what handlers running inside this pass resubmitted (strand only, no lock).
  void accept_joined() {
    while (Operation* op = pass_intake_.pop_front())
      accept(op);
  }

  void accept(Operation* op) {
    if (stopping_) return fail(op, errc::shutdown);
    if (op->peer_address.oversized()) return fail(op, errc::address_length);
    if (std::error_code ec = validate(op->peer_address)) return fail(op, ec);
    if (std::error_code ec = op->functions->resolve(*op)) return fail(op, ec);
    ++client_count(op->client_id);
    pending_.push_back(op);
  }

  void cancel_pending(Operation* op, std::uint64_t sequence) {
    // Compare before dereferencing: op may be long gone, and its address reused.
    for (Operation* it = pending_.front(); it != nullptr; it = it->next) {
      if (it != op || it->sequence != sequence) continue;
      pending_.remove(op);
      finish(op, asio::error::operation_aborted);
      return;
    }
  }

  // Posts while credits last. FI_MORE marks every post that has another one right behind it.
  void post_pending() {
    while (!pending_.empty() && in_flight_ < credits_) {
      Operation* op = pending_.front();
      std::error_code ec;
      const fi_addr_t peer = prepare(*op, ec);
      if (ec) {
        pending_.pop_front();
        finish(op, ec, 0, "preparing the post");
        continue;
      }
      const bool more = op->next != nullptr && in_flight_ + 1 < credits_;
      const ssize_t rc = post(*op, peer, more);
      if (rc == 0) {
        pending_.pop_front();
        ++in_flight_;
        posted_.add();
        continue;
      }
      if (rc == -FI_EAGAIN) {
        eagain_.add();
        if (stalled(*op)) continue;
        break;  // retried after the next CQ drain, never spun
      }
      pending_.pop_front();
      finish(op, fabric_error(rc), 0, rc_detail(rc, *op));
    }
  }

  // True when op went past its deadline and was failed (so the loop goes on with the next one).
  bool stalled(Operation& op) {
    const auto now = Clock::now();
    if (op.stalled_since == Clock::time_point{}) op.stalled_since = now;
    if (now - op.stalled_since < configuration_.progress_deadline) return false;
    pending_.pop_front();
    finish(&op, errc::progress_deadline, 0,
           "no progress posting for " + duration_text(configuration_.progress_deadline) +
               ": peer unreachable or transmit queue stuck");
    return true;
  }

  static std::string rc_detail(ssize_t rc, const Operation& op) {
    return std::string(op.direction == Direction::ToPeer ? "fi_writemsg" : "fi_readmsg") + " returned " +
           std::to_string(rc);
  }

  // The peer's AV handle (inserted on first use, as the Rust crate does on every post) and the
  // local descriptor where the provider needs one.
  fi_addr_t prepare(Operation& op, std::error_code& ec) {
    const fi_addr_t peer = peers_->insert(op.client_id, op.peer_address, ec);
    if (!ec && endpoint_.requires_local_mr() && !op.lease) lease_operand(op, ec);
    return peer;
  }

  // The registration-cache path of the Rust crate: a hit costs one lookup; on a miss, the
  // caller's CacheableSpan (when it contains the operand) is registered and cached, falling back to
  // the operand alone; without a span, the registration lives only as long as this transfer.
  void lease_operand(Operation& op, std::error_code& ec) {
    const auto start = reinterpret_cast<std::uintptr_t>(op.buffer);
    if (op.length > UINTPTR_MAX - start) {
      ec = errc::operand_range_overflows;
      return;
    }
    const std::uintptr_t end = start + op.length;
    auto& cache = RegionCache::instance();
    std::shared_ptr<Registration> lease = cache.covering(domain_key_, start, end);
    if (!lease) {
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
      if (!lease) return;
      if (cacheable) cache.track(domain_key_, base, stop, lease, false);
    }
    op.descriptor = lease->descriptor();
    op.lease = std::move(lease);
  }

  // A local-only registration (FI_READ | FI_WRITE: never remote access) with a key no other MR of
  // this domain uses, since tcp rejects a duplicate requested key.
  std::shared_ptr<Registration> register_range(std::uintptr_t base, std::uintptr_t end,
                                               std::shared_ptr<void> keep_alive, std::error_code& ec) {
    const std::uint64_t key = provider_keys_ ? 0 : local_key_counter.fetch_add(1, std::memory_order_relaxed);
    auto mr = endpoint_.register_memory(reinterpret_cast<const void*>(base), end - base, FI_READ | FI_WRITE, key, ec);
    if (ec) return nullptr;
    registrations_.add();
    return std::make_shared<Registration>(std::move(mr), closer_, std::move(keep_alive));
  }

  std::error_code pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive) override {
    if (closed_ || !peers_) return errc::not_open;
    if (length == 0) return errc::zero_length_region;
    if (length > UINTPTR_MAX - base) return errc::region_range_overflows;
    if (!endpoint_.requires_local_mr()) return {};
    std::error_code ec;
    auto registration = register_range(base, base + length, std::move(keep_alive), ec);
    if (registration) RegionCache::instance().track(domain_key_, base, base + length, std::move(registration), true);
    return ec;
  }

  ssize_t post(Operation& op, fi_addr_t peer, bool more) {
    iovec iov{op.buffer, op.length};
    fi_rma_iov rma{op.remote_address, op.length, op.remote_key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &op.descriptor;
    msg.iov_count = 1;
    msg.addr = peer;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op.as_context();
    const std::uint64_t flags = FI_COMPLETION | (more ? FI_MORE : 0);
    if (op.direction == Direction::ToPeer) {
      return fi_writemsg(endpoint_.endpoint(), &msg, flags | FI_DELIVERY_COMPLETE);
    }
    return fi_readmsg(endpoint_.endpoint(), &msg, flags);
  }

  // ---- completions -----------------------------------------------------------------------
  // Reads the CQ until it is empty, runs the drain hook, then accepts what the completion handlers
  // (and the hook) resubmitted inline, so the caller's post_pending() sends it in the same pass.
  // Returns how many operations it finished.
  std::size_t reap() {
    reaping_ = true;
    const std::size_t finished = drain_cq();
    if (finished != 0 && drain_hook_ != nullptr) drain_hook_(drain_hook_context_);
    reaping_ = false;
    if (finished != 0) absorb_intake();
    return finished;
  }

  std::size_t drain_cq() {
    std::size_t finished = 0;
    for (;;) {
      const ssize_t n = fi_cq_read(endpoint_.cq(), entries_.data(), entries_.size());
      if (n > 0) {
        cq_reads_.add();
        for (ssize_t i = 0; i < n; ++i) {
          --in_flight_;
          succeed(Operation::from_context(entries_[static_cast<std::size_t>(i)].op_context));
          // A large transfer the batch's first handler resubmitted goes out now, before the other
          // handlers run: the wire is busy again after one handler instead of n. Small ones wait
          // for the batch, where posting one early costs more than it saves (docs/performance.md).
          if (i == 0 && !pass_intake_.empty()) post_joined_if_large();
        }
        finished += static_cast<std::size_t>(n);
        if (static_cast<std::size_t>(n) < entries_.size()) return finished;
        continue;
      }
      if (n == -FI_EAVAIL) {
        finished += read_error();
        continue;
      }
      if (n != -FI_EAGAIN) queue_errors_.add();
      return finished;
    }
  }

  /// From this size up, a drain's first resubmission is posted before the rest of the batch runs:
  /// measured at 1 MiB +2-3 %, at 16 and 256 KiB no difference, at 64 B -3.5 % (docs/performance.md).
  static constexpr std::size_t eager_post_bytes = 64 * 1024;

  // Accepts what handlers of the running drain resubmitted so far (which resolves a write's length
  // from its source), and posts at once if the next operation in line is a large one.
  void post_joined_if_large() {
    accept_joined();
    if (!pending_.empty() && pending_.front()->length >= eager_post_bytes) post_pending();
  }

  std::size_t read_error() {
    fi_cq_err_entry entry{};
    const ssize_t rc = fi_cq_readerr(endpoint_.cq(), &entry, 0);
    if (rc <= 0) {
      queue_errors_.add();
      return 0;
    }
    if (entry.op_context == nullptr) {
      // An endpoint-level fault: nothing to complete, and nothing to dereference.
      context_less_errors_.add();
      return 0;
    }
    --in_flight_;
    char text[256] = {};
    const char* provider_text = fi_cq_strerror(endpoint_.cq(), entry.prov_errno, entry.err_data, text, sizeof text);
    std::error_code ec = fabric_error(entry.err);
    if (stopping_ && entry.err == FI_ECANCELED) ec = errc::shutdown;
    finish(Operation::from_context(entry.op_context), ec, entry.prov_errno,
           "completion error: " + std::string(fi_strerror(entry.err)) + " (err=" + std::to_string(entry.err) +
               "); provider: " + (provider_text != nullptr ? provider_text : "") +
               " (prov_errno=" + std::to_string(entry.prov_errno) + ")");
    return 1;
  }

  // Every accepted operation ends here exactly once.
  void finish(Operation* op, std::error_code ec, int provider_errno = 0, std::string detail = {}) {
    if (!ec) return succeed(op);
    release_operation(op);
    failed_.add();
    op->functions->complete(op, Outcome(ec, provider_errno, std::move(detail)));
  }

  // A CQ entry's completion: the hot path, with no error code or detail to build.
  void succeed(Operation* op) {
    release_operation(op);
    completed_.add();
    op->functions->complete(op, Outcome(TransferDone{op->length, std::nullopt}));
  }

  // What an accepted operation holds, given back before its handler runs.
  void release_operation(Operation* op) {
    op->lease.reset();
    settle(op->client_id);
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
  }

  void fail(Operation* op, std::error_code ec) {
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
    failed_.add();
    op->functions->complete(op, Outcome(ec));
  }

  // The in-flight count of client_id; the last client's node is remembered (a node of an
  // unordered_map keeps its address until erased), which spares a hash lookup per transfer.
  std::size_t& client_count(std::uint64_t client_id) {
    if (client_id != last_client_ || last_count_ == nullptr) {
      last_count_ = &by_client_[client_id];
      last_client_ = client_id;
    }
    return *last_count_;
  }

  void forget_client(std::uint64_t client_id) {
    if (client_id == last_client_) last_count_ = nullptr;
    by_client_.erase(client_id);
  }

  // One of client_id's accepted operations ended: a deferred removal may now go ahead. A count
  // that drops to 0 keeps its map node (so a steady client allocates nothing); remove_peer erases it.
  void settle(std::uint64_t client_id) {
    if (client_id == last_client_ && last_count_ != nullptr) {  // the usual case: one peer, over and over
      if (--*last_count_ != 0) return;
    } else {
      auto it = by_client_.find(client_id);
      if (it == by_client_.end() || --it->second != 0) return;
    }
    if (removal_pending_.erase(client_id) == 0) return;
    forget_client(client_id);
    if (peers_) peers_->release(client_id);
  }

  void remove_or_defer(std::uint64_t client_id) {
    auto it = by_client_.find(client_id);
    if (it != by_client_.end() && it->second != 0) {
      removal_pending_.insert(client_id);
      return;
    }
    if (it != by_client_.end()) forget_client(client_id);
    if (peers_) peers_->release(client_id);
  }

  // ---- progress ----------------------------------------------------------------------------
  bool idle() const noexcept { return in_flight_ == 0 && pending_.empty(); }

  // After any activity: reap, post, and make sure something will look at the CQ again.
  void schedule_progress(bool poll_again = false) {
    if (closed_) return;
    if (idle()) {
      if (stopping_) return close();
      return release_waits();
    }
    if (in_flight_ == 0) return arm_backstop(std::chrono::milliseconds(1));  // all stalled on EAGAIN
    if (configuration_.wait_mode == WaitMode::busy_poll || !descriptor_) return schedule_poll();
    if (poll_again) return schedule_poll();
    // adaptive: poll while the last activity is recent. Each poll is a handler of its own, so
    // completions delivered through the executor (and the caller's coroutines) run in between.
    if (configuration_.wait_mode == WaitMode::adaptive && Clock::now() < spin_until_) return schedule_poll();
    arm_wait();
  }

  // One pass of the reaper: drain, post what the drain made room for, wait again.
  //
  // A pass that reaped polls once more before the fd is armed, in every mode, if a transfer posted
  // before this pass is still in flight: under load its completion is in by the time this pass's
  // burst is posted, and fi_trywait would only report it after resetting the provider's wait
  // signal, which the next completion raises again (two system calls, plus the trywait itself, at
  // every burst boundary). When everything in flight was posted by this very pass (one transfer at
  // a time, or a whole window completed at once), the next completion is a round trip away: the
  // poll found nothing and the armed wait then woke once more, empty, right after it was armed,
  // which made two wake-ups per transfer in fd mode (docs/performance.md).
  void progress(bool polled = false) {
    if (closed_) return;  // a polling pass posted before the endpoint closed: the CQ is gone
    const std::uint64_t posted_before = posted_.get();
    const bool reaped = reap() != 0;
    if (reaped) {
      if (polled) spin_hits_.add();
      note_activity();
    }
    post_pending();
    const std::uint64_t posted_now = posted_.get() - posted_before;  // early posts included
    schedule_progress(reaped && in_flight_ > posted_now);
  }

  void note_activity() noexcept {
    if (configuration_.wait_mode == WaitMode::adaptive) spin_until_ = Clock::now() + configuration_.spin_budget;
  }

  void schedule_poll() {
    if (poll_scheduled_) return;
    poll_scheduled_ = true;
    asio::post(strand_, asio::bind_allocator(PoolAllocator<void>(), [self = shared_from_this()] {
                 self->poll_scheduled_ = false;
                 self->progress(true);
               }));
  }

  void arm_wait() {
    if (wait_armed_) return;
    fid* fids[] = {&endpoint_.cq()->fid};
    const int rc = fi_trywait(endpoint_.fabric(), fids, 1);
    if (rc == -FI_EAGAIN) return schedule_poll();  // completions are ready: yield, then drain
    if (rc != 0) return schedule_poll();           // no usable wait object: poll
    wait_armed_ = true;
    armed_at_ = Clock::now();
    descriptor_->async_wait(asio::posix::descriptor_base::wait_read,
                            [self = shared_from_this()](std::error_code ec) { self->on_wake(ec); });
    // An edge that fired between fi_trywait and the arm is lost to an epoll reactor; one read now
    // catches whatever it announced.
    if (reap() != 0) {
      armed_late_.add();
      post_pending();
      if (idle()) return release_waits();  // that read finished the last transfer
    }
    arm_backstop(configuration_.backstop_interval);
  }

  // An idle engine keeps nothing pending on the executor, so io_context::run() returns as soon as
  // the last transfer completes (the backstop would hold it up to backstop_interval, a wait on a
  // silent fd for ever). The flags drop at once: a cancelled handler that runs after a re-arm
  // must not clear the new arm's flag, so aborted handlers touch nothing.
  void release_waits() {
    if (backstop_armed_) {
      backstop_armed_ = false;
      backstop_.cancel();
    }
    if (wait_armed_) {
      wait_armed_ = false;
      descriptor_->cancel();
    }
  }

  void on_wake(std::error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    wait_armed_ = false;
    if (closed_) return;
    fd_wakeups_.add();
    progress();
  }

  void arm_backstop(std::chrono::nanoseconds interval) {
    if (backstop_armed_) return;
    backstop_armed_ = true;
    backstop_.expires_after(interval);
    backstop_.async_wait([self = shared_from_this()](std::error_code ec) { self->on_backstop(ec); });
  }

  void on_backstop(std::error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    backstop_armed_ = false;
    if (closed_) return;
    // Completions that sat in the CQ while the fd wait was armed for a whole interval, with the fd
    // silent, mean a wake-up was lost. Completions found sooner, or while the fd is readable (its
    // wake-up is on its way to the strand, only slower than this timer), were merely beaten to it.
    const bool waited = wait_armed_ && Clock::now() - armed_at_ >= configuration_.backstop_interval;
    const bool silent = waited && !fd_readable();
    if (reap() != 0 && silent) backstop_hits_.add();
    post_pending();
    schedule_progress();
    if (!idle() && !backstop_armed_) arm_backstop(configuration_.backstop_interval);
  }

  bool fd_readable() const noexcept {
    pollfd p{endpoint_.wait_fd(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  // ---- shutdown ----------------------------------------------------------------------------
  void begin_shutdown() {
    if (stopping_) return;
    stopping_ = true;
    OperationQueue batch;
    {
      std::lock_guard lock(intake_mutex_);
      batch.swap(intake_);
      intake_waiting_.store(false, std::memory_order_relaxed);
    }
    while (Operation* op = batch.pop_front())
      fail(op, errc::shutdown);
    while (Operation* op = pass_intake_.pop_front())
      fail(op, errc::shutdown);
    while (Operation* op = pending_.pop_front())
      finish(op, errc::shutdown, 0, "never posted");
    if (idle()) return close();
    shutdown_timer_.expires_after(configuration_.progress_deadline);
    shutdown_timer_.async_wait([self = shared_from_this()](std::error_code ec) {
      if (!ec && !self->closed_) self->flush_and_close();
    });
    schedule_progress();
  }

  // Posted operations that outlived the grace period: closing the endpoint makes the provider hand
  // every one of them back (FI_ECANCELED), and only then is their memory released.
  void flush_and_close() {
    endpoint_.close_endpoint();
    for (int round = 0; round < 1000 && in_flight_ > 0; ++round)
      reap();
    close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    backstop_.cancel();
    shutdown_timer_.cancel();
    if (descriptor_) {
      descriptor_->cancel();
      (void)descriptor_->release();
      descriptor_.reset();
    }
    if (peers_) peers_->clear();
    peers_.reset();
    release_registrations();
    endpoint_.close();
  }

  // Every MR of this domain closes before the domain does.
  void release_registrations() noexcept {
    if (domain_key_ != nullptr) RegionCache::instance().clear_domain(domain_key_);
    closer_->retire();
  }

  // The execution context is going away with work still posted: flush and free without invoking.
  void abandon() noexcept {
    if (descriptor_) {
      (void)descriptor_->release();
      descriptor_.reset();
    }
    if (endpoint_.cq() == nullptr) return;
    while (Operation* op = pending_.pop_front())
      op->functions->destroy(op);
    {
      std::lock_guard lock(intake_mutex_);
      while (Operation* op = intake_.pop_front())
        op->functions->destroy(op);
    }
    while (Operation* op = pass_intake_.pop_front())
      op->functions->destroy(op);
    if (in_flight_ > 0) {
      endpoint_.close_endpoint();
      for (int round = 0; round < 1000 && in_flight_ > 0; ++round) {
        const ssize_t n = fi_cq_read(endpoint_.cq(), entries_.data(), entries_.size());
        if (n > 0) {
          for (ssize_t i = 0; i < n; ++i)
            destroy_in_flight(entries_[static_cast<std::size_t>(i)].op_context);
        } else if (n == -FI_EAVAIL) {
          fi_cq_err_entry entry{};
          if (fi_cq_readerr(endpoint_.cq(), &entry, 0) > 0 && entry.op_context != nullptr) {
            destroy_in_flight(entry.op_context);
          }
        }
      }
    }
    if (peers_) peers_->clear();
    release_registrations();
    endpoint_.close();
  }

  void destroy_in_flight(void* context) noexcept {
    --in_flight_;
    Operation* op = Operation::from_context(context);
    op->lease.reset();
    op->functions->destroy(op);
  }

  Configuration configuration_;
  strand_type strand_;
  Endpoint endpoint_;
  std::optional<PeerTable> peers_;
  std::shared_ptr<StrandCloser<strand_type>> closer_;
  const void* domain_key_ = nullptr;
  bool provider_keys_ = false;
  // Typed on the strand itself: an any_io_executor holding a strand is too big for its small
  // buffer, and every copy of it (one per completion) would allocate.
  using Descriptor = asio::posix::basic_stream_descriptor<strand_type>;
  using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, strand_type>;
  std::optional<Descriptor> descriptor_;
  Timer backstop_;
  Timer shutdown_timer_;

  std::mutex intake_mutex_;
  OperationQueue intake_;
  std::atomic<bool> intake_waiting_{false};  ///< intake_ is not empty (written under intake_mutex_)
  OperationQueue pass_intake_;               ///< resubmitted from handlers inside a reaper pass (strand only)
  bool intake_scheduled_ = false;
  std::atomic<std::size_t> outstanding_{0};
  std::atomic<std::uint64_t> sequence_{1};

  OperationQueue pending_;
  std::size_t in_flight_ = 0;
  std::size_t credits_ = 1;
  std::unordered_map<std::uint64_t, std::size_t> by_client_;
  std::uint64_t last_client_ = 0;
  std::size_t* last_count_ = nullptr;  ///< &by_client_[last_client_], or null
  std::unordered_set<std::uint64_t> removal_pending_;
  std::vector<fi_cq_entry> entries_;
  bool wait_armed_ = false;
  bool reaping_ = false;
  void (*drain_hook_)(void*) = nullptr;  ///< the callback layer's batch delivery (set_drain_hook)
  void* drain_hook_context_ = nullptr;
  Clock::time_point spin_until_{};
  Clock::time_point armed_at_{};
  bool backstop_armed_ = false;
  bool poll_scheduled_ = false;
  bool stopping_ = false;
  bool closed_ = false;

  Counter posted_, completed_, failed_, eagain_, cq_reads_, fd_wakeups_, spin_hits_, armed_late_, backstop_hits_,
      joined_pass_, context_less_errors_, queue_errors_, registrations_;
};

template <typename Inner>
std::error_code EngineImpl<Inner>::validate(std::span<const std::uint8_t> address) const {
  return validate_address(address, endpoint_.addr_format());
}

}  // namespace

std::shared_ptr<Engine> Engine::create(const asio::any_io_executor& executor, const Configuration& configuration,
                                       std::error_code& ec, std::string& what) {
  if (const auto* io = executor.target<asio::io_context::executor_type>()) {
    auto engine = std::make_shared<EngineImpl<asio::io_context::executor_type>>(*io, configuration);
    engine->open(ec, what);
    return ec ? nullptr : std::shared_ptr<Engine>(std::move(engine));
  }
  auto engine = std::make_shared<EngineImpl<asio::any_io_executor>>(executor, configuration);
  engine->open(ec, what);
  return ec ? nullptr : std::shared_ptr<Engine>(std::move(engine));
}

}  // namespace dma::detail
