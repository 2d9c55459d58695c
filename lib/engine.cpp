#include "dma/detail/engine.hpp"

#include "dma/advertisement.hpp"
#include "dma/detail/block_pool.hpp"
#include "dma/error.hpp"
#include "peer_flow.hpp"
#include "peer_table.hpp"
#include "reclaimer.hpp"
#include "region_cache.hpp"

#include <asio/bind_allocator.hpp>
#include <asio/bind_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>

#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <poll.h>

#include <array>
#include <cerrno>
#include <deque>
#include <mutex>
#include <optional>

namespace dma::detail {
namespace {

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

// now + d without overflow; no_deadline (or anything past the clock's range) never fires.
Clock::time_point deadline_after(Clock::time_point now, std::chrono::nanoseconds d) noexcept {
  if (d >= Clock::time_point::max() - now) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(d);
}

// The connection broke under the transfer: the tcp provider flushes a torn-down connection's
// transfers with these (and a peer that rejected one transfer tears its connection down too).
bool connection_error(int err) noexcept {
  return err == FI_ECANCELED || err == FI_ENOTCONN || err == FI_ECONNRESET || err == FI_ECONNABORTED || err == EPIPE ||
         err == FI_ESHUTDOWN;
}

// The provider says the peer cannot be reached at all: back off as after a refused connection.
bool unreachable_error(int err) noexcept { return err == FI_EHOSTUNREACH || err == FI_ENETUNREACH; }

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
//
// The engine coordinates its parts, all on one strand: the intake (any thread → strand), the
// peer table with each peer's flow (queue and health), the poster (credits, FI_MORE bursts,
// -FI_EAGAIN parks the peer), the CQ reaper and its wait policy, the deadline sweep, and the
// reclaimer (posted transfers the provider will not return by itself).
template <typename Inner>
class EngineImpl final : public Engine, public std::enable_shared_from_this<EngineImpl<Inner>> {
  using strand_type = asio::strand<Inner>;
  using std::enable_shared_from_this<EngineImpl<Inner>>::shared_from_this;

 public:
  EngineImpl(const Inner& executor, const Configuration& configuration)
      : configuration_(configuration),
        strand_(asio::make_strand(executor)),
        closer_(std::make_shared<StrandCloser<strand_type>>(strand_)),
        reclaimer_([this](std::error_code& ec) { return endpoint_.replace_endpoint(ec); }),
        backstop_(strand_),
        shutdown_timer_(strand_) {
    entries_.resize(std::max<std::size_t>(1, configuration_.cq_batch));
  }

  ~EngineImpl() override { abandon(); }

  void open(std::error_code& ec, std::string& what) {
    if (configuration_.unreachable_backoff_max < configuration_.unreachable_backoff ||
        configuration_.unreachable_backoff.count() < 0 || configuration_.transfer_deadline.count() <= 0 ||
        configuration_.progress_deadline.count() <= 0) {
      ec = errc::invalid_configuration;
      what =
          "transfer_deadline and progress_deadline must be positive, and 0 <= unreachable_backoff <= "
          "unreachable_backoff_max";
      return;
    }
    endpoint_.open(configuration_, ec);
    if (ec) {
      what = endpoint_.failed_step();
      return;
    }
    credits_ = endpoint_.credits();
    limit_ = std::max<std::size_t>(credits_, endpoint_.in_flight_limit());
    domain_key_ = endpoint_.domain();
    provider_keys_ = (endpoint_.describe().mr_mode & FI_MR_PROV_KEY) != 0;
    addresses_.push_back(endpoint_.local_address());
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
    asio::post(strand_, [self = shared_from_this(), op, sequence] { self->cancel_outstanding(op, sequence); });
  }

  std::uint64_t next_sequence() noexcept override { return sequence_.fetch_add(1, std::memory_order_relaxed); }

  void remove_peer(std::uint64_t client_id) override {
    asio::post(strand_, [self = shared_from_this(), client_id] {
      if (self->peers_) self->peers_->release(client_id);
    });
  }

  void shutdown() override {
    asio::post(strand_, [self = shared_from_this()] { self->begin_shutdown(); });
  }

  std::size_t outstanding() const noexcept override { return outstanding_.load(std::memory_order_relaxed); }
  // Replacing the endpoint changes the address; earlier ones stay valid for spans already handed out.
  const std::vector<std::uint8_t>& local_address() const noexcept override {
    std::lock_guard lock(address_mutex_);
    return addresses_.back();
  }
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
    m.timed_out = timed_out_.get();
    m.cancelled = cancelled_.get();
    m.peers_marked_unreachable = marked_unreachable_.get();
    m.reconnects = reconnects_.get();
    m.endpoint_replacements = replacements_.get();
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
    if (!peers_ || stopping_) return errc::not_open;
    std::error_code ec = validate(address);
    if (!ec) (void)peers_->insert(client_id, address, ec);
    return ec;
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

 private:
  std::error_code validate(std::span<const std::uint8_t> address) const {
    return validate_address(address, endpoint_.addr_format());
  }

  // ---- intake ------------------------------------------------------------------------------
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
    if (batch.empty() && pass_intake_.empty()) return;
    accept_clock_ = Clock::now();  // one reading for the whole batch: deadlines count from here
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
    if (std::error_code ec = op->functions->resolve(*op)) return fail(op, ec);
    // A client posting to the peer it posted to last: the address was validated on insertion.
    Peer* peer = peers_->acquire_known(op->client_id, op->peer_address);
    if (peer == nullptr) {
      std::error_code ec = validate(op->peer_address);
      if (!ec) peer = peers_->acquire(op->client_id, op->peer_address, ec);
      if (peer == nullptr) return fail(op, ec);
    }
    op->peer = peer;
    op->deadline =
        deadline_after(accept_clock_, op->lifetime.count() >= 0 ? op->lifetime : configuration_.transfer_deadline);
    if (op->deadline < next_deadline_) next_deadline_ = op->deadline;
    accepted_.push_back(op);
    if (peer->flow.backing_off(accept_clock_)) {
      return finish(op, errc::peer_unreachable, 0,
                    "the peer was marked unreachable; retried after " + duration_text(time_left(peer->flow)));
    }
    peer->flow.queue.push_back(op);
    ++queued_;
    if (peer->flow.place == PeerFlow::Place::idle) flows_.ready(peer->flow);
  }

  std::chrono::nanoseconds time_left(const PeerFlow& flow) const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(flow.unreachable_until - accept_clock_);
  }

  // ---- posting -----------------------------------------------------------------------------
  // Posts while credits last, one transfer per peer in turn. FI_MORE marks every post that has
  // another one right behind it. A peer that refuses a post (-FI_EAGAIN) is parked until the
  // next drain; the others go on.
  void post_pending() {
    if (!endpoint_.is_open()) return;
    if (flows_.any_parked()) flows_.unpark_all();
    while (in_flight_ < limit_) {
      PeerFlow* flow = flows_.front();
      if (flow == nullptr) return;
      if (flow->in_flight >= credits_) {
        flows_.remove(*flow);  // its credits are used up; it rejoins when one comes back
        continue;
      }
      Peer& peer = peer_of(*flow);
      if (flow->refresh && !reconnect(peer)) continue;
      Operation* op = flow->queue.front();
      std::error_code ec;
      prepare(*op, ec);
      if (ec) {
        dequeue(*flow);
        finish(op, ec, 0, "preparing the post");
        continue;
      }
      const bool more = ((op->next != nullptr && flow->in_flight + 1 < credits_) || flows_.others_ready(*flow)) &&
                        in_flight_ + 1 < limit_;
      const ssize_t rc = post(*op, peer.handle, more);
      if (rc == 0) {
        dequeue(*flow);
        op->posted = true;
        reclaimer_.posted(*op);
        ++in_flight_;
        ++flow->in_flight;
        posted_.add();
        flow->stalled_since = {};
        if (flow->place == PeerFlow::Place::ready) flows_.posted(*flow);
        continue;
      }
      if (rc == -FI_EAGAIN) {
        eagain_.add();
        stalled(*flow);
        continue;
      }
      dequeue(*flow);
      finish(op, fabric_error(rc), 0, rc_detail(rc, *op));
    }
  }

  static Peer& peer_of(PeerFlow& flow) noexcept {
    return *reinterpret_cast<Peer*>(reinterpret_cast<char*>(&flow) - offsetof(Peer, flow));
  }

  // Pops the flow's front operation; a flow with nothing left leaves the round-robin.
  void dequeue(PeerFlow& flow) noexcept {
    (void)flow.queue.pop_front();
    --queued_;
    if (flow.queue.empty()) flows_.remove(flow);
  }

  // The peer's connection broke: its address-vector entry is replaced before its next post, once
  // none of its transfers is posted any more (the provider must not see the old entry go while it
  // still holds transfers on it). Returns whether the flow may post now.
  bool reconnect(Peer& peer) {
    PeerFlow& flow = peer.flow;
    if (flow.in_flight != 0) {
      flows_.remove(flow);  // rejoins when its last posted transfer comes back
      return false;
    }
    flow.refresh = false;
    reconnects_.add();
    if (std::error_code ec = peers_->refresh(peer)) {
      fail_queue(flow, ec, "a fresh address-vector entry for the peer");
      return false;
    }
    return true;
  }

  // A post was refused. Past progress_deadline of refusals in a row the peer is marked
  // unreachable: rxm reports a refused or unanswered connection only this way.
  void stalled(PeerFlow& flow) {
    const auto now = Clock::now();
    if (flow.stalled_since == Clock::time_point{}) flow.stalled_since = now;
    if (now - flow.stalled_since < configuration_.progress_deadline) return flows_.park(flow);
    if (flow.connected) {
      mark_unreachable(flow, now, errc::progress_deadline,
                       "no progress posting for " + duration_text(configuration_.progress_deadline) +
                           ": peer unreachable or transmit queue stuck");
    } else {
      mark_unreachable(flow, now, errc::connection_refused,
                       "no connection within " + duration_text(configuration_.progress_deadline));
    }
  }

  // Fails the peer's queue with ec and makes its next transfers fail at once for the back-off.
  void mark_unreachable(PeerFlow& flow, Clock::time_point now, std::error_code ec, const std::string& detail) {
    flow.mark_unreachable(now, configuration_.unreachable_backoff, configuration_.unreachable_backoff_max);
    marked_unreachable_.add();
    fail_queue(flow, ec, detail);
  }

  void fail_queue(PeerFlow& flow, std::error_code ec, const std::string& detail) {
    flows_.remove(flow);
    while (!flow.queue.empty()) {
      Operation* op = flow.queue.front();
      dequeue(flow);
      finish(op, ec, 0, detail);
    }
  }

  static std::string rc_detail(ssize_t rc, const Operation& op) {
    return std::string(op.direction == Direction::ToPeer ? "fi_writemsg" : "fi_readmsg") + " returned " +
           std::to_string(rc);
  }

  // The local descriptor where the provider needs one.
  void prepare(Operation& op, std::error_code& ec) {
    if (endpoint_.requires_local_mr() && !op.lease) lease_operand(op, ec);
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
    std::size_t finished = drain_cq();
    // A replaced endpoint holds only doomed transfers now (its last healthy one just came back,
    // or a sweep or cancellation doomed the rest): close it, and complete what it hands back in
    // this same drain.
    if (reclaim_due_) {
      reclaim_due_ = false;
      if (reclaim_step()) {
        finished += drain_cq();
        reclaimer_.collect();
      }
    }
    if (finished != 0 && drain_hook_ != nullptr) drain_hook_(drain_hook_context_);
    reaping_ = false;
    if (finished != 0) absorb_intake();
    return finished;
  }

  // Drains the current endpoint's CQ, then those of replaced endpoints still returning transfers.
  std::size_t drain_cq() {
    std::size_t finished = drain(endpoint_.cq());
    if (reclaimer_.retiring() != 0) reclaimer_.for_each_retired_cq([&](fid_cq* cq) { finished += drain(cq); });
    return finished;
  }

  std::size_t drain(fid_cq* cq) {
    std::size_t finished = 0;
    for (;;) {
      const ssize_t n = fi_cq_read(cq, entries_.data(), entries_.size());
      if (n > 0) {
        cq_reads_.add();
        for (ssize_t i = 0; i < n; ++i) {
          returned_ok(Operation::from_context(entries_[static_cast<std::size_t>(i)].op_context));
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
        const int read = read_error(cq);
        if (read < 0) return finished;  // fi_cq_readerr failed: never spin on -FI_EAVAIL
        finished += static_cast<std::size_t>(read);
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
    const PeerFlow* flow = flows_.front();
    if (flow != nullptr && flow->queue.front()->length >= eager_post_bytes) post_pending();
  }

  // The provider handed op back (successfully or not): the bookkeeping of a posted transfer.
  void returned(Operation* op) noexcept {
    --in_flight_;
    if (reclaimer_.returned(*op)) reclaim_due_ = true;
    PeerFlow& flow = op->peer->flow;
    --flow.in_flight;
    // Out of the round-robin with work left: its credits were used up, or it waited for this to
    // replace its address-vector entry. Either way it may post again.
    if (flow.place == PeerFlow::Place::idle && !flow.queue.empty() && (!flow.refresh || flow.in_flight == 0)) {
      flows_.ready(flow);
    }
  }

  // A CQ entry's completion: the hot path, with no error code or detail to build.
  void returned_ok(Operation* op) {
    returned(op);
    op->peer->flow.succeeded();
    succeed(op);
  }

  // Returns 1 when it completed an operation, 0 for an entry without one, -1 when fi_cq_readerr failed.
  int read_error(fid_cq* cq) {
    fi_cq_err_entry entry{};
    const ssize_t rc = fi_cq_readerr(cq, &entry, 0);
    if (rc <= 0) {
      queue_errors_.add();
      return -1;
    }
    if (entry.op_context == nullptr) {
      // An endpoint-level fault: nothing to complete, and nothing to dereference.
      context_less_errors_.add();
      return 0;
    }
    Operation* op = Operation::from_context(entry.op_context);
    returned(op);
    std::string detail = "completion error: " + std::string(fi_strerror(entry.err)) +
                         " (err=" + std::to_string(entry.err) + ", prov_errno=" + std::to_string(entry.prov_errno) +
                         ")";
    // rxm reads the endpoint's state to format an entry: never for one a closed endpoint returned.
    if (!reclaimer_.closed(*op)) {
      char text[256] = {};
      const char* provider_text = fi_cq_strerror(cq, entry.prov_errno, entry.err_data, text, sizeof text);
      if (provider_text != nullptr && *provider_text != '\0') detail += "; provider: " + std::string(provider_text);
    }
    if (op->doom != Doom::none) {
      finish(op, doom_error(op->doom), entry.prov_errno, std::move(detail));
      return 1;
    }
    PeerFlow& flow = op->peer->flow;
    if (connection_error(entry.err)) {
      // Says nothing of the peer's health (a rejected transfer tears the connection down too): no
      // back-off, the next transfer reconnects at once.
      flow.refresh = true;
      flow.connected = false;
      finish(op, errc::connection_lost, entry.prov_errno, std::move(detail));
      return 1;
    }
    std::error_code ec = fabric_error(entry.err);
    if (unreachable_error(entry.err) && !flow.backing_off(Clock::now())) {
      mark_unreachable(flow, Clock::now(), ec, detail);
    }
    finish(op, ec, entry.prov_errno, std::move(detail));
    return 1;
  }

  static std::error_code doom_error(Doom doom) noexcept {
    switch (doom) {
      case Doom::deadline:
        return errc::timed_out;
      case Doom::cancelled:
        return asio::error::operation_aborted;
      default:
        return errc::shutdown;
    }
  }

  // Every accepted operation ends in finish() or succeed() exactly once.
  void finish(Operation* op, std::error_code ec, int provider_errno = 0, std::string detail = {}) {
    if (!ec) return succeed(op);
    release_operation(op);
    failed_.add();
    if (ec == errc::timed_out) timed_out_.add();
    if (ec == asio::error::operation_aborted) cancelled_.add();
    op->functions->complete(op, Outcome(ec, provider_errno, std::move(detail)));
  }

  void succeed(Operation* op) {
    release_operation(op);
    completed_.add();
    op->functions->complete(op, Outcome(TransferDone{op->length, std::nullopt}));
  }

  // What an accepted operation holds, given back before its handler runs.
  void release_operation(Operation* op) {
    accepted_.unlink(op);
    op->lease.reset();
    peers_->settle(*op->peer);
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
  }

  // An operation refused before it was accepted: it holds nothing yet.
  void fail(Operation* op, std::error_code ec) {
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
    failed_.add();
    op->functions->complete(op, Outcome(ec));
  }

  // ---- deadlines, cancellation, reclaiming --------------------------------------------------
  // Fails the queued transfers past their deadline and dooms the posted ones; a peer whose posted
  // transfer timed out is marked unreachable, after the sweep, so its other transfers that timed
  // out too report the deadline.
  void sweep(Clock::time_point now) {
    if (now < next_deadline_) return;
    next_deadline_ = Clock::time_point::max();
    std::vector<PeerFlow*> late_peers;
    std::vector<PeerFlow*> queues;
    for (Operation* op = accepted_.oldest(); op != nullptr; op = op->newer) {
      if (op->doom != Doom::none) continue;
      if (op->deadline > now) {
        next_deadline_ = std::min(next_deadline_, op->deadline);
        continue;
      }
      PeerFlow& flow = op->peer->flow;
      if (op->posted) {
        reclaimer_.doom(*op, Doom::deadline);
        if (!flow.marked) late_peers.push_back(&flow);
      } else {
        op->doom = Doom::deadline;  // queued: failed below, in one pass over its queue
        if (!flow.marked) queues.push_back(&flow);
      }
      flow.marked = true;
    }
    for (PeerFlow* flow : queues) {
      flow->queue.remove_if([](const Operation& op) { return op.doom != Doom::none; },
                            [&](Operation* op) {
                              --queued_;
                              finish(op, errc::timed_out, 0,
                                     "queued for its whole deadline: the peer took no posts in time");
                            });
      if (flow->queue.empty()) flows_.remove(*flow);
    }
    for (PeerFlow* flow : late_peers) {
      if (!flow->backing_off(now)) {
        mark_unreachable(*flow, now, errc::timed_out,
                         "the peer did not complete a transfer posted to it within its deadline; this one was "
                         "queued behind it");
      }
    }
    for (PeerFlow* flow : queues)
      flow->marked = false;
    for (PeerFlow* flow : late_peers)
      flow->marked = false;
    reclaim();
  }

  void cancel_outstanding(Operation* op, std::uint64_t sequence) {
    // Compare before dereferencing: op may be long gone, and its address reused.
    if (!accepted_.contains(op) || op->sequence != sequence || op->doom != Doom::none) return;
    if (!op->posted) {
      PeerFlow& flow = op->peer->flow;
      flow.queue.remove(op);
      --queued_;
      if (flow.queue.empty()) flows_.remove(flow);
      finish(op, asio::error::operation_aborted);
      return schedule_progress();
    }
    reclaimer_.doom(*op, Doom::cancelled);
    reclaim();
  }

  // Lets the reclaimer replace or close endpoints, through a reaper pass: a closed endpoint has
  // handed its transfers to its CQ by the time fi_close returns, and they complete in that pass.
  void reclaim() {
    reclaim_due_ = true;
    (void)reap();
    post_pending();
    schedule_progress();
  }

  // Returns whether it closed a replaced endpoint.
  bool reclaim_step() {
    std::error_code ec;
    const std::uint64_t before = reclaimer_.replacements();
    const bool closed_one = reclaimer_.step(ec);
    if (reclaimer_.replacements() != before) adopt_new_endpoint();
    if (ec) queue_errors_.add();  // no fresh endpoint: the doomed transfers wait for the next try
    return closed_one;
  }

  // The endpoint was replaced: new address, new CQ, new wait fd.
  void adopt_new_endpoint() {
    replacements_.add();
    {
      std::lock_guard lock(address_mutex_);
      addresses_.push_back(endpoint_.local_address());
    }
    if (!descriptor_) return;
    wait_armed_ = false;  // its handler runs as operation_aborted and touches nothing
    descriptor_->cancel();
    (void)descriptor_->release();
    descriptor_.reset();
    if (endpoint_.wait_fd() >= 0) descriptor_.emplace(strand_, endpoint_.wait_fd());
  }

  // ---- progress ----------------------------------------------------------------------------
  bool idle() const noexcept { return in_flight_ == 0 && queued_ == 0; }

  // After any activity: make sure something will look at the CQ again, and that the backstop
  // (which also runs the deadline sweep) ticks while anything is outstanding.
  void schedule_progress(bool poll_again = false) {
    if (closed_) return;
    if (idle()) {
      if (stopping_) return close();
      return release_waits();
    }
    if (in_flight_ == 0) return wait_for_stall();  // every peer with work is parked on -FI_EAGAIN
    stall_retry_ = std::chrono::milliseconds(1);
    arm_backstop(configuration_.backstop_interval);
    if (configuration_.wait_mode == WaitMode::busy_poll || !descriptor_) return schedule_poll();
    if (poll_again) return schedule_poll();
    // adaptive: poll while the last activity is recent. Each poll is a handler of its own, so
    // completions delivered through the executor (and the caller's coroutines) run in between.
    if (configuration_.wait_mode == WaitMode::adaptive && Clock::now() < spin_until_) return schedule_poll();
    arm_wait();
  }

  // Nothing is posted and the queued peers refused their posts (a connection forming or refused):
  // wait on the fd, which fires when a connection comes up, and retry on a timer that backs off
  // from 1 ms to the backstop interval, never spinning.
  void wait_for_stall() {
    if (descriptor_ && configuration_.wait_mode != WaitMode::busy_poll) (void)try_arm_fd();
    arm_backstop(stall_retry_);
    stall_retry_ = std::min<std::chrono::nanoseconds>(stall_retry_ * 2, configuration_.backstop_interval);
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
    if (!try_arm_fd()) return schedule_poll();  // completions are ready, or no usable wait object
    // An edge that fired between fi_trywait and the arm is lost to an epoll reactor; one read now
    // catches whatever it announced.
    if (reap() != 0) {
      armed_late_.add();
      post_pending();
      if (idle()) return release_waits();  // that read finished the last transfer
    }
  }

  // fi_trywait, then one async_wait on the fd; false when the provider says not to wait.
  bool try_arm_fd() {
    if (wait_armed_) return true;
    fid* fids[] = {&endpoint_.cq()->fid};
    if (fi_trywait(endpoint_.fabric(), fids, 1) != 0) return false;
    wait_armed_ = true;
    armed_at_ = Clock::now();
    descriptor_->async_wait(asio::posix::descriptor_base::wait_read,
                            [self = shared_from_this()](std::error_code ec) { self->on_wake(ec); });
    return true;
  }

  // An idle engine keeps nothing pending on the executor, so io_context::run() returns as soon as
  // the last transfer completes (the backstop would hold it up to backstop_interval, a wait on a
  // silent fd for ever). The flags drop at once: a cancelled handler that runs after a re-arm
  // must not clear the new arm's flag, so aborted handlers touch nothing.
  void release_waits() {
    next_deadline_ = Clock::time_point::max();
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
    const auto now = Clock::now();
    // Completions that sat in the CQ while the fd wait was armed for a whole interval, with the fd
    // silent, mean a wake-up was lost. Completions found sooner, or while the fd is readable (its
    // wake-up is on its way to the strand, only slower than this timer), were merely beaten to it.
    const bool waited = wait_armed_ && now - armed_at_ >= configuration_.backstop_interval;
    const bool silent = waited && !fd_readable();
    if (reap() != 0 && silent) backstop_hits_.add();
    sweep(now);
    post_pending();
    schedule_progress();
  }

  bool fd_readable() const noexcept {
    pollfd p{endpoint_.wait_fd(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  // ---- shutdown ----------------------------------------------------------------------------
  // Fails what was never posted, gives posted transfers progress_deadline to finish, then hands
  // back the rest by closing the endpoints.
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
    std::vector<PeerFlow*> queues;
    for (Operation* op = accepted_.oldest(); op != nullptr; op = op->newer) {
      if (op->posted || op->peer->flow.marked) continue;
      op->peer->flow.marked = true;
      queues.push_back(&op->peer->flow);
    }
    for (PeerFlow* flow : queues) {
      flow->marked = false;
      fail_queue(*flow, errc::shutdown, "never posted");
    }
    if (idle()) return close();
    shutdown_timer_.expires_after(configuration_.progress_deadline);
    shutdown_timer_.async_wait([self = shared_from_this()](std::error_code ec) {
      if (!ec && !self->closed_) self->flush_and_close();
    });
    schedule_progress();
  }

  // Posted operations that outlived the grace period: closing the endpoints makes the provider
  // hand every one of them back (FI_ECANCELED), and only then is their memory released.
  void flush_and_close() {
    for (Operation* op = accepted_.oldest(); op != nullptr; op = op->newer)
      reclaimer_.doom(*op, Doom::shutdown);
    reclaimer_.close_all();
    endpoint_.close_endpoint();
    for (int round = 0; round < 100 && in_flight_ > 0; ++round)
      (void)drain_cq();
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
    reclaimer_.close_all();
    endpoint_.close_endpoint();
    // Whatever the provider never handed back cannot come back now; the CQs close below.
    while (Operation* op = accepted_.oldest()) {
      if (op->posted) --in_flight_;
      finish(op, doom_error(op->doom == Doom::none ? Doom::shutdown : op->doom), 0, "the provider never returned it");
    }
    reclaimer_.clear();
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
    {
      std::lock_guard lock(intake_mutex_);
      while (Operation* op = intake_.pop_front())
        op->functions->destroy(op);
    }
    while (Operation* op = pass_intake_.pop_front())
      op->functions->destroy(op);
    reclaimer_.close_all();
    endpoint_.close_endpoint();
    // The endpoints are closed: the provider holds none of these any more.
    while (Operation* op = accepted_.oldest()) {
      accepted_.unlink(op);
      op->lease.reset();
      op->functions->destroy(op);
    }
    reclaimer_.clear();
    if (peers_) peers_->clear();
    release_registrations();
    endpoint_.close();
  }

  Configuration configuration_;
  strand_type strand_;
  Endpoint endpoint_;
  std::optional<PeerTable> peers_;
  std::shared_ptr<StrandCloser<strand_type>> closer_;
  Reclaimer reclaimer_;
  const void* domain_key_ = nullptr;
  bool provider_keys_ = false;
  mutable std::mutex address_mutex_;
  std::deque<std::vector<std::uint8_t>> addresses_;  ///< every local address so far, the current one last
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

  OutstandingList accepted_;  ///< every accepted operation until it completes, oldest first
  FlowScheduler flows_;
  std::size_t queued_ = 0;  ///< accepted, not yet posted (in the peers' queues)
  std::size_t in_flight_ = 0;
  std::size_t credits_ = 1;  ///< per peer
  std::size_t limit_ = 1;    ///< all peers together
  Clock::time_point accept_clock_{};
  Clock::time_point next_deadline_ = Clock::time_point::max();  ///< no accepted deadline is earlier
  std::chrono::nanoseconds stall_retry_ = std::chrono::milliseconds(1);
  std::vector<fi_cq_entry> entries_;
  bool wait_armed_ = false;
  bool reaping_ = false;
  bool reclaim_due_ = false;             ///< a replaced endpoint holds only doomed transfers now
  void (*drain_hook_)(void*) = nullptr;  ///< the callback layer's batch delivery (set_drain_hook)
  void* drain_hook_context_ = nullptr;
  Clock::time_point spin_until_{};
  Clock::time_point armed_at_{};
  bool backstop_armed_ = false;
  bool poll_scheduled_ = false;
  bool stopping_ = false;
  bool closed_ = false;

  Counter posted_, completed_, failed_, eagain_, cq_reads_, fd_wakeups_, spin_hits_, armed_late_, backstop_hits_,
      joined_pass_, context_less_errors_, queue_errors_, registrations_, timed_out_, cancelled_, marked_unreachable_,
      reconnects_, replacements_;
};

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
