// The engine: a coordinator of parts that each have one job, all on one strand.
//
//   Intake          intake.hpp              submissions from any thread, and resubmissions inside a pass
//   PeerTable       peer_table.*            AV entries, refcounted by clients and accepted transfers
//   Poster          poster.*                credits, FI_MORE bursts, -FI_EAGAIN, reconnects
//   Registrar       registrar.*             local descriptors, the registration cache, MR closes
//   Segmenter       segmenter.*             transfers one post cannot carry: their lists, plans, posts
//   CqWatcher       ../progress/cq_watcher.hpp  the drain, fi_trywait, the fd, the backstop, the wait policy
//   Reclaimer       reclaimer.*             posted transfers the provider will not return by itself
//   Ledger          ledger.hpp              accepting, each transfer's one exit, deadlines, cancels
//   (sorting)       completion_error.*      what an error completion means for its transfer and peer
//   Shutdown        shutdown.hpp            the grace period, the flush, the close, the abandon
//   AddressHistory  address_history.hpp     every local address so far, the current one last
//
// The engine itself sets the parts up, wires them together, accepts transfers, and runs the passes.
#include "open_engine.hpp"

#include "address_history.hpp"
#include "completion_error.hpp"
#include "connection_cut.hpp"
#include "counter.hpp"
#include "cq_watcher.hpp"
#include "hosts.hpp"
#include "intake.hpp"
#include "latency_recorder.hpp"
#include "ledger.hpp"
#include "log.hpp"
#include "peer_table.hpp"
#include "poster.hpp"
#include "reclaimer.hpp"
#include "registrar.hpp"
#include "segmenter.hpp"
#include "shutdown.hpp"

#include <dma/advertisement.hpp>
#include <dma/detail/block_pool.hpp>
#include <dma/error.hpp>

#include <rdma/fabric.h>

#include <asio/bind_allocator.hpp>
#include <asio/error.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>

#include <algorithm>
#include <optional>
#include <string_view>
#include <typeinfo>

namespace dma::detail {

// The public headers carry no libfabric type: PostContext's scratch stands in for fi_context2.
static_assert(sizeof(PostContext::provider_context) == sizeof(fi_context2) &&
              offsetof(PostContext, provider_context) == 0 && alignof(PostContext) >= alignof(fi_context2));

namespace {

// The drain running on this thread, if any: what drain_position() reports, and how submit() tells
// a resubmission from a handler of this engine's own drain. A drain may run inside another one's
// handler (a strand dispatched inline), so each restores the one it found.
thread_local const DrainPlace* current_drain = nullptr;

std::error_code check(const Configuration& c, std::string& what) {
  if (c.unreachable_backoff_max < c.unreachable_backoff || c.unreachable_backoff.count() < 0 ||
      c.transfer_deadline.count() <= 0 || c.progress_deadline.count() <= 0) {
    what =
        "transfer_deadline and progress_deadline must be positive, and 0 <= unreachable_backoff <= "
        "unreachable_backoff_max";
    return errc::invalid_configuration;
  }
  if (c.segment_window == 0 || c.segment_window > SegmentTracker::max_window) {
    what = "segment_window must be 1 to " + std::to_string(SegmentTracker::max_window) + ", not " +
           std::to_string(c.segment_window);
    return errc::invalid_configuration;
  }
  return {};
}

// Inner is the executor under the strand: io_context's own executor when the service runs on an
// io_context (no type erasure on the hot path), any_io_executor otherwise.
template <typename Inner>
class EngineImpl final : public Engine, public std::enable_shared_from_this<EngineImpl<Inner>> {
  using strand_type = asio::strand<Inner>;
  using Watcher = CqWatcher<strand_type>;
  // Typed on the strand itself: an any_io_executor holding a strand is too big for its small
  // buffer, and every copy of it (one per completion) would allocate.
  using Timer = asio::basic_waitable_timer<Clock, asio::wait_traits<Clock>, strand_type>;

 public:
  EngineImpl(const Inner& executor, const Configuration& configuration)
      : configuration_(configuration),
        log_(configuration.log_handler),
        strand_(asio::make_strand(executor)),
        registrar_(std::make_shared<StrandCloser<strand_type>>(strand_)),
        ledger_(configuration.transfer_deadline),
        reclaimer_([this](std::error_code& ec) { return endpoint_.replace_endpoint(ec); },
                   closing_frees_reads_twice(configured_provider(configuration)),
                   [this](std::uint32_t generation, std::vector<std::vector<std::uint8_t>>& peers) {
                     read_peers_on(generation, peers);
                   }),
        watcher_(strand_, configuration_, WaitPolicy::WithoutFd::poll),
        shutdown_(strand_, configuration_.progress_deadline,
                  {endpoint_, peers_, registrar_, ledger_, reclaimer_, poster_, intake_, watcher_, log_}) {
    poster_.set_log(log_);
    ledger_.set_log(log_);
    ledger_.set_segmenter(segmenter_);
    watcher_.set_log(log_);
  }

  // abandon() is noexcept; what the check sees is the members' destructors (Asio's timers and
  // descriptors, libfabric's handles), which throw nothing either.
  ~EngineImpl() override { shutdown_.abandon(); }  // NOLINT(bugprone-exception-escape)

  void open(std::error_code& ec, std::string& what) {
    if ((ec = check(configuration_, what))) return;
    endpoint_.open(configuration_, ec);
    if (ec) {
      what = endpoint_.failed_step();
      return;
    }
    poster_.set_limits(Poster::limits_for(endpoint_, configuration_));
    registrar_.open(Registrar::setup_for(endpoint_, configuration_));
    segmenter_.set_limits(segment_limits(*endpoint_.info(), configuration_), configuration_.segment_window);
    addresses_.push(endpoint_.local_address());
    ledger_.bind(&PeerTable::open_for(peers_, endpoint_));
    peers_->set_log(log_);
    watcher_.attach(endpoint_.fabric(), endpoint_.cq(), endpoint_.wait_fd());
  }

  // ---- any thread ----------------------------------------------------------------------------
  void submit(Operation* op) override {
    begin_state(*op);
    ledger_.submitted();
    if (current_drain == &place_) {  // this engine's reaper, on this thread: a handler resubmitting
      intake_.push_joined(op);
      joined_pass_.add();
      return;
    }
    // The pool allocator, not Asio's thread-local recycling: this is freed on the strand's thread.
    if (intake_.push(op)) {
      asio::post(strand_,
                 asio::bind_allocator(PoolAllocator<void>(), [self = shared_from_this()] { self->take_intake(); }));
    }
  }
  void warm_up(Operation* op) override { submit(op); }
  void cancel(Operation* op, std::uint64_t sequence, CancelScope scope) override {
    asio::post(strand_,
               [self = shared_from_this(), op, sequence, scope] { self->cancel_outstanding(op, sequence, scope); });
  }
  std::uint64_t next_sequence() noexcept override { return ledger_.next_sequence(); }
  void remove_peer(std::uint64_t client_id) override {
    asio::post(strand_, [self = shared_from_this(), client_id] {
      if (self->peers_) self->peers_->release(client_id);
    });
  }
  void shutdown() override {
    asio::post(strand_, [self = shared_from_this()] { self->shutdown_.begin(*self); });
  }

  std::size_t outstanding() const noexcept override { return ledger_.outstanding(); }
  const std::vector<std::uint8_t>& local_address() const noexcept override { return addresses_.current(); }
  EndpointInfo describe() const override { return endpoint_.describe(); }
  const Configuration& configuration() const noexcept override { return configuration_; }
  std::vector<std::vector<std::uint8_t>> endpoint_addresses() const override { return {addresses_.current()}; }
  std::size_t endpoints() const noexcept override { return 1; }
  Metrics metrics() const noexcept override {
    Metrics m;
    poster_.report(m);
    ledger_.report(m);
    watcher_.counters().report(m);
    registrar_.report(m);
    reclaimer_.report(m);
    m.joined_pass = joined_pass_.get();
    m.context_less_errors = context_less_errors_.get();
    m.queue_errors += queue_errors_.get();
    m.latency = latency_.snapshot();
    m.segmented = segmented_.get();
    m.reposted = reposted_.get();
    m.isolated_retries = isolated_retries_.get();
    return m;
  }

  // ---- strand --------------------------------------------------------------------------------
  // The application vouches for the peer (add_peer): a back-off from an earlier incarnation at
  // this address ends, where a transfer that merely names the address would find it.
  void insert_peer(std::uint64_t client_id, std::vector<std::uint8_t> address, Done done) override {
    asio::post(strand_, [self = shared_from_this(), client_id, address = std::move(address), done = std::move(done)] {
      done(self->insert_peer_now(client_id, address));
    });
  }
  void pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive, Done done) override {
    asio::post(strand_,
               [self = shared_from_this(), base, length, keep_alive = std::move(keep_alive),
                done = std::move(done)]() mutable { done(self->pin_now(base, length, std::move(keep_alive))); });
  }
  std::error_code insert_peer_now(std::uint64_t client_id, std::span<const std::uint8_t> address) {
    if (!peers_ || shutdown_.stopping()) return errc::not_open;
    std::error_code ec;
    (void)peers_->insert(client_id, address, ec);
    if (!ec) {
      if (Peer* peer = peers_->bound(client_id)) peer->flow.forgive();
    }
    return ec;
  }
  std::error_code pin_now(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive) {
    if (shutdown_.closed() || !peers_) return errc::not_open;
    return registrar_.pin(base, length, std::move(keep_alive));
  }

  // The watcher's waits land here.
  void on_cq_event(CqEvent event) {
    watcher_.accept(event);
    if (shutdown_.closed()) return;  // a polling pass posted before the endpoint closed: the CQ is gone
    if (event != CqEvent::backstop) return progress(event == CqEvent::poll);
    if (reap() != 0) watcher_.backstop_found();
    const auto now = Clock::now();
    if (ledger_.sweep(now, reclaimer_, poster_, *this) || reclaimer_.grace_over(now)) reclaim();
    post_pending();
    schedule_progress();
  }

  // The watcher's drain sink.
  void completed(void* context, DrainPlace place) {
    place_ = place;
    if (context == nullptr) return context_less_success();
    if (PostContext::of(context).segment) return segment_completed(*SegmentSlot::from_context(context));
    Operation* op = Operation::from_context(context);
    returned(op);
    const OperationState& s = state(*op);
    s.peer->flow.succeeded();
    latency_.record(s.accepted, drain_clock());
    ledger_.succeed(op);
  }
  // A large transfer the batch's first handler resubmitted goes out now, before the other
  // handlers run: the wire is busy again after one handler instead of n. Small ones wait for the
  // batch, where posting one early costs more than it saves (docs/notes/performance.md: measured at
  // 1 MiB +2-3 %, at 16 and 256 KiB no difference, at 64 B -3.5 %).
  void first_done() {
    if (intake_.joined_empty()) return;
    accept_joined();
    const PeerFlow* flow = poster_.front();
    if (flow != nullptr && flow->queue.front()->length >= eager_post_bytes) post_pending();
  }
  // Returns 1 when it completed an operation, 0 for an entry without one.
  int failed(fid_cq* cq, const fi_cq_err_entry& entry) {
    place_ = DrainPlace::last;
    if (entry.op_context == nullptr) {
      context_less_errors_.add();  // an endpoint-level fault: nothing to complete or dereference
      const std::uint64_t count = context_less_errors_.get();
      if (log_occurrence(count)) {
        log_(LogLevel::warning, [&] {
          return "completion error without an operation: " + error_detail(cq, entry, true) + "; " +
                 std::to_string(count) + " so far";
        });
      }
      return 0;
    }
    if (PostContext::of(entry.op_context).segment) {
      segment_failed(cq, entry, *SegmentSlot::from_context(entry.op_context));
      return 1;
    }
    Operation* op = Operation::from_context(entry.op_context);
    returned(op);
    (void)drain_clock();
    const OperationState& s = state(*op);
    if (reclaimer_.closed(*op) && s.doom == Doom::none) return hand_back(op) ? 0 : 1;
    std::string detail = s.doom != Doom::none ? doom_detail(*op) : error_detail(cq, entry, true);
    const ErrorSort sort = sort_failure(op, entry, detail, poster_, log_, *this);
    if (sort.peer == ErrorSort::PeerFate::reconnect && retry_alone(op)) return 0;
    if (s.suspect) detail += "; posted again alone after its connection broke, it failed again";
    ledger_.finish(op, sort.ec, entry.prov_errno, std::move(detail));
    return 1;
  }

  // The poster's host.
  std::error_code prepare(Operation& op) {
    if (state(op).segments != nullptr) return {};  // planned when it was first at its queue's front
    if (segmenter_.needed(op)) {
      segmented_.add();
      return segmenter_.plan(op, &describe_buffer, this, prepare_detail_);
    }
    std::error_code ec;
    registrar_.prepare(op, ec);
    return ec;
  }
  void fail_prepared(Operation* op, std::error_code ec) {
    ledger_.finish(op, ec, 0,
                   prepare_detail_.empty() ? std::string("preparing the post") : std::exchange(prepare_detail_, {}));
  }
  ssize_t post(Operation& op, fi_addr_t peer, bool more) {
    if (state(op).segments != nullptr) {
      return Segmenter::post(endpoint_.endpoint(), op, peer, more, endpoint_.transmit_complete_flag());
    }
    return post_rma(endpoint_.endpoint(), op, peer, more, endpoint_.transmit_complete_flag());
  }
  void posted(Operation& op) noexcept {
    if (state(op).segments != nullptr) return Segmenter::posted(op, reclaimer_.posted_segment());
    reclaimer_.posted(op);
  }
  std::error_code refresh(Peer& peer) { return peers_->refresh(peer); }
  // A transfer that took some of its posts already completes once they are back.
  void fail_queued(Operation* op, std::error_code ec, std::string detail) {
    if (const OperationState& s = state(*op); s.segments != nullptr && s.posted) {
      if (s.segments->tracker.fail(ec, 0, std::move(detail))) finish_segmented(op);
      return;
    }
    ledger_.finish(op, ec, 0, std::move(detail));
  }
  SegmentStep segment_step(Operation& op) noexcept { return Segmenter::step(op); }
  bool segment_continues(const Operation& op) const noexcept { return Segmenter::continues(op); }
  bool segment_all_posted(const Operation& op) const noexcept { return Segmenter::all_posted(op); }
  void stop_segmented(Operation* op) {
    SegmentTracker& tracker = state(*op).segments->tracker;
    if (!tracker.failed()) {
      (void)tracker.fail(
          doom_error(state(*op).doom), 0,
          "stopped before its last post: " + std::to_string(tracker.posts()) + " of its posts were made");
    }
    finish_segmented(op);
  }

  // The shutdown's host (ShutdownHost), besides the poster's.
  using std::enable_shared_from_this<EngineImpl<Inner>>::shared_from_this;
  // After any activity: make sure something will look at the CQ again, and that the backstop
  // (which also runs the deadline sweep) ticks while anything is outstanding.
  void schedule_progress(bool poll_again = false) {
    if (shutdown_.closed()) return;
    if (poster_.idle()) {
      if (shutdown_.stopping()) return shutdown_.close(*this);
      return release_waits();
    }
    auto self = shared_from_this();
    if (poster_.in_flight() == 0) {
      // Every peer with work refused its post (a connection forming or refused): the fd fires when
      // a connection comes up, and a retry timer backs off from 1 ms to the backstop interval.
      (void)watcher_.try_arm(self);
      watcher_.arm_backstop(stall_retry_, self);
      stall_retry_ = std::min<std::chrono::nanoseconds>(stall_retry_ * 2, configuration_.backstop_interval);
      return;
    }
    stall_retry_ = std::chrono::milliseconds(1);
    watcher_.arm_backstop(self);
    if (watcher_.wait(self, poll_again) != CqWaited::armed) return;
    if (reap() == 0) return;  // the read after arming (CqWaited::armed)
    watcher_.armed_late_found();
    post_pending();
    if (poster_.idle()) release_waits();
  }
  // The current endpoint's CQ, then those of replaced endpoints still returning transfers.
  std::size_t drain_cqs() {
    drain_stamped_ = false;
    std::size_t finished = watcher_.drain(endpoint_.cq(), *this);
    if (reclaimer_.retiring() != 0) {
      reclaimer_.for_each_retired_cq([&](fid_cq* cq) { finished += watcher_.drain(cq, *this); });
    }
    return finished;
  }
  // The endpoints are closed and op's posts never came back (shutdown): settles them all.
  void abandoned(Operation* op) {
    if (state(*op).segments == nullptr) return returned(op);
    SegmentTracker& tracker = state(*op).segments->tracker;
    tracker.for_each_in_flight([&](SegmentSlot& slot) {
      segment_returned(*op, slot);
      (void)tracker.returned(slot, errc::shutdown);
    });
    (void)poster_.withdraw(op);
  }

 private:
  static constexpr std::size_t eager_post_bytes = std::size_t{64} * 1024;
  // Passes one progress() runs back to back while each reaps and asks for another look; what
  // bounds how long a run of them keeps other handlers of the executor waiting.
  static constexpr std::size_t inline_passes = 16;

  // ---- intake --------------------------------------------------------------------------------
  void take_intake() {
    intake_.taken();
    absorb_intake();
    watcher_.note_activity();
    post_pending();
    schedule_progress();
  }

  // Other threads' submissions first, then this pass's own, which keeps each thread's order (a
  // drain's first handler's resubmissions may already have been accepted by first_done()).
  void absorb_intake() {
    OperationQueue batch = intake_.take_waiting();
    if (batch.empty() && intake_.joined_empty()) return;
    accept_clock_ = Clock::now();  // one reading for the whole batch: deadlines count from here
    while (Operation* op = batch.pop_front())
      accept(op);
    accept_joined();
  }
  void accept_joined() {
    while (Operation* op = intake_.pop_joined())
      accept(op);
  }

  void accept(Operation* op) {
    if (shutdown_.stopping()) return ledger_.refuse(op, errc::shutdown);
    if (std::error_code ec = check_immediate_data(op->request, endpoint_.cq_data_size())) return ledger_.refuse(op, ec);
    ledger_.admit(op, accept_clock_, poster_);
  }

  void post_pending() {
    if (endpoint_.is_open()) poster_.post_pending(*this);
  }

  // ---- progress ------------------------------------------------------------------------------
  // One pass: drain, post what the drain made room for, wait again. While passes reap and ask to
  // look once more, the next look runs at once, up to inline_passes in all: as a handler of its
  // own it would first wait for a round of the executor's queue, which runs the reactor (an
  // epoll_wait) that a completion already on its way does not need. The first inline pass that
  // finds nothing hands over as its predecessor would have: one more polling pass.
  void progress(bool polled) {
    bool again = false;
    for (std::size_t pass = 0; pass < inline_passes; ++pass) {
      const std::uint64_t posted_before = poster_.posted();
      const bool reaped = reap() != 0;
      if (reaped) {
        if (polled || pass > 0) watcher_.poll_found();
        watcher_.note_activity();
      }
      post_pending();
      if (pass > 0 && !reaped) break;
      const std::uint64_t posted_now = poster_.posted() - posted_before;  // early posts included
      again = WaitPolicy::poll_once_more(reaped, poster_.in_flight(), posted_now);
      if (!again || shutdown_.closed()) break;
    }
    schedule_progress(again);
  }

  // An idle engine keeps nothing pending on the executor, so io_context::run() returns as soon as
  // the last transfer completes.
  void release_waits() {
    ledger_.forget_deadlines();
    watcher_.release();
  }

  // Drains the CQs, then accepts what the completion handlers resubmitted inline, so the caller's
  // post_pending() sends it in the same pass. Returns how many operations it finished.
  std::size_t reap() {
    const DrainPlace* outer = std::exchange(current_drain, &place_);
    std::size_t finished = drain_cqs();
    // A replaced endpoint holds only doomed transfers now: close it, and complete what it hands
    // back in this same drain.
    if (reclaim_due_) {
      reclaim_due_ = false;
      if (reclaim_step()) {
        finished += drain_cqs();
        reclaimer_.collect();
      }
    }
    current_drain = outer;
    if (finished != 0) absorb_intake();
    return finished;
  }

  // ---- completion ----------------------------------------------------------------------------
  // One clock reading per drain, at its first completion: every completion of the drain is
  // stamped with it, and what the drain's handlers submit is accepted at it (not at an older
  // intake's reading, which would shorten their deadlines).
  Clock::time_point drain_clock() noexcept {
    if (!drain_stamped_) {
      drain_stamped_ = true;
      accept_clock_ = Clock::now();
    }
    return accept_clock_;
  }
  // The provider handed op back (successfully or not): the bookkeeping of a posted transfer.
  void returned(Operation* op) noexcept {
    const OperationState& s = state(*op);
    if (s.suspect) s.peer->flow.isolating = false;
    if (reclaimer_.returned(*op)) reclaim_due_ = true;
    poster_.returned(s.peer->flow);
  }

  // ---- segmented transfers ------------------------------------------------------------------
  static SegmentLimits segment_limits(const fi_info& info, const Configuration& c) noexcept {
    SegmentLimits limits;
    limits.max_bytes = info.ep_attr->max_msg_size != 0 ? info.ep_attr->max_msg_size : SIZE_MAX;
    if (c.max_segment_bytes != 0) limits.max_bytes = std::min(limits.max_bytes, c.max_segment_bytes);
    limits.iov_limit = std::max<std::size_t>(info.tx_attr->iov_limit, 1);
    limits.rma_iov_limit = std::max<std::size_t>(info.tx_attr->rma_iov_limit, 1);
    return limits;
  }
  static void* describe_buffer(void* host, const Operation& op, std::byte* base, std::size_t length,
                               std::shared_ptr<void>& lease, std::error_code& ec) {
    return static_cast<EngineImpl*>(host)->registrar_.describe_buffer(op, base, length, lease, ec);
  }
  // One post of op came back: the bookkeeping of a posted transfer, per post.
  void segment_returned(Operation& op, const SegmentSlot& slot) noexcept {
    if (reclaimer_.returned_segment(slot.generation, state(op).doom != Doom::none)) reclaim_due_ = true;
    poster_.returned(state(op).peer->flow);
  }
  void segment_completed(SegmentSlot& slot) {
    Operation* op = owner_of(slot);
    segment_returned(*op, slot);
    const OperationState& s = state(*op);
    s.peer->flow.succeeded();
    if (s.segments->tracker.returned(slot)) finish_segmented(op);
  }
  // The peer's fate is settled before the post is taken back, so a queue failed on the way
  // (an unreachable peer) finds this transfer still waiting for it.
  void segment_failed(fid_cq* cq, const fi_cq_err_entry& entry, SegmentSlot& slot) {
    Operation* op = owner_of(slot);
    segment_returned(*op, slot);
    (void)drain_clock();
    const bool closed = reclaimer_.closed(slot.generation);
    const OperationState& s = state(*op);
    if (closed && s.doom == Doom::none && hand_back_segment(*op, slot)) return;
    std::string detail = s.doom != Doom::none ? doom_detail(*op) : error_detail(cq, entry, !closed);
    const ErrorSort sort = sort_failure(op, entry, detail, poster_, log_, *this);
    if (s.segments->tracker.returned(slot, sort.ec, entry.prov_errno, std::move(detail))) finish_segmented(op);
  }
  // Every post op made is back: it completes, once.
  void finish_segmented(Operation* op) {
    if (!state(*op).segments->tracker.all_posted()) (void)poster_.withdraw(op);  // still at its queue's front
    Outcome outcome = Segmenter::outcome(*op);
    if (outcome.ok()) latency_.record(state(*op).accepted, drain_clock());
    ledger_.settle(op, std::move(outcome));
  }

  // ---- posting again ------------------------------------------------------------------------
  // A replaced endpoint closed for another transfer's sake handed op back unfinished: it goes to
  // the front of its peer's queue and out on the current endpoint. Writing or reading the same
  // bytes again is harmless; a write with immediate data is not (the first may have landed and
  // notified), so it fails. Returns whether op was queued again (false: it completed now).
  bool hand_back(Operation* op) {
    if (shutdown_.stopping()) {
      ledger_.finish(op, errc::shutdown, 0, "the service closed while it was posted");
      return false;
    }
    if (op->request.immediate_data) {
      ledger_.finish(op, errc::connection_lost, 0, std::string(immediate_data_handed_back));
      return false;
    }
    reposted_.add();
    requeue(op);
    state(*op).reposted = true;
    return true;
  }
  // The same for one post of a segmented transfer: it is posted again unless it carried immediate
  // data. Returns whether it will be.
  bool hand_back_segment(Operation& op, SegmentSlot& slot) {
    if (shutdown_.stopping()) return false;
    OperationState& s = state(op);
    const bool was_all_posted = s.segments->tracker.all_posted();
    if (!segmenter_.hand_back(op, slot)) {
      if (!op.request.immediate_data) return false;
      if (s.segments->tracker.returned(slot, errc::connection_lost, 0, std::string(immediate_data_handed_back))) {
        finish_segmented(&op);
      }
      return true;
    }
    reposted_.add();
    s.reposted = true;
    s.peer->flow.connected = false;
    if (was_all_posted) poster_.requeue(s.peer->flow, &op);  // out of its queue since its last post
    return true;
  }
  void requeue(Operation* op) {
    OperationState& s = state(*op);
    s.posted = false;
    s.peer->flow.connected = false;
    poster_.requeue(s.peer->flow, op);
  }
  // A transfer failed with its connection: on a shared connection, another transfer (a wrong key
  // or range, which the target answers by closing the connection) may have broken it. It is posted
  // again alone once; failing again alone, it is the one the peer rejects. Not a write with
  // immediate data (it may have notified already) or a segmented transfer, nor past its deadline.
  bool retry_alone(Operation* op) {
    OperationState& s = state(*op);
    if (s.suspect || op->request.immediate_data || s.segments != nullptr || shutdown_.stopping() ||
        Clock::now() >= s.deadline) {
      return false;
    }
    s.suspect = true;
    isolated_retries_.add();
    requeue(op);
    return true;
  }
  // Every peer a read posted on endpoint `generation` still goes to.
  void read_peers_on(std::uint32_t generation, std::vector<std::vector<std::uint8_t>>& peers) {
    auto add = [&](const Peer& peer) {
      if (std::find(peers.begin(), peers.end(), peer.address) == peers.end()) peers.push_back(peer.address);
    };
    for (Operation* op = ledger_.oldest(); op != nullptr; op = state(*op).newer) {
      const OperationState& s = state(*op);
      if (!s.posted || op->request.direction != Direction::FromPeer || s.peer == nullptr) continue;
      if (s.segments == nullptr) {
        if (s.generation == generation) add(*s.peer);
        continue;
      }
      bool on_it = false;
      s.segments->tracker.for_each_in_flight([&](SegmentSlot& slot) { on_it |= slot.generation == generation; });
      if (on_it) add(*s.peer);
    }
  }
  // A successful entry without an operation: a provider fault, counted and never followed.
  void context_less_success() {
    context_less_errors_.add();
    const std::uint64_t count = context_less_errors_.get();
    if (log_occurrence(count)) {
      log_(LogLevel::warning, [&] {
        return "successful completion without an operation: nothing to complete; " + std::to_string(count) +
               " entries without an operation so far";
      });
    }
  }

  static constexpr std::string_view immediate_data_handed_back =
      "its endpoint was closed to hand back another transfer (cancelled or past its deadline) while this write "
      "with immediate data was in flight: it may have landed and notified, so it is not posted again";

  // ---- cancellation, reclaiming -------------------------------------------------------------
  void cancel_outstanding(Operation* op, std::uint64_t sequence, CancelScope scope) {
    const Ledger::Cancelled cancelled = ledger_.cancel(op, sequence, scope, poster_, reclaimer_);
    if (cancelled == Ledger::Cancelled::finished) schedule_progress();
    if (cancelled == Ledger::Cancelled::doomed) reclaim();
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
    if (reclaimer_.replacements() != before) {
      addresses_.push(endpoint_.local_address());  // new address, new CQ, new wait fd
      watcher_.attach(endpoint_.fabric(), endpoint_.cq(), endpoint_.wait_fd());
    }
    if (ec) queue_errors_.add();  // no fresh endpoint: the doomed transfers wait for the next try
    return closed_one;
  }

  Configuration configuration_;
  Log log_;
  strand_type strand_;
  Endpoint endpoint_;
  std::optional<PeerTable> peers_;
  Registrar registrar_;
  Segmenter segmenter_;
  Ledger ledger_;
  Reclaimer reclaimer_;
  Poster poster_;
  Intake intake_;
  Watcher watcher_;
  Shutdown<Watcher, Timer> shutdown_;
  AddressHistory addresses_;

  std::string prepare_detail_;        ///< why prepare() refused its operation, when it says more than its code
  Clock::time_point accept_clock_{};  ///< the latest intake or drain reading
  LatencyRecorder latency_;
  std::chrono::nanoseconds stall_retry_ = std::chrono::milliseconds(1);
  DrainPlace place_ = DrainPlace::last;  ///< of the completion being delivered, inside a drain
  bool drain_stamped_ = false;           ///< accept_clock_ was read in the current drain
  bool reclaim_due_ = false;             ///< a replaced endpoint holds only doomed transfers now
  Counter joined_pass_, context_less_errors_, queue_errors_, segmented_, reposted_, isolated_retries_;
};

static_assert(PosterHost<EngineImpl<asio::io_context::executor_type>> && PosterHost<EngineImpl<asio::any_io_executor>>);
static_assert(ShutdownHost<EngineImpl<asio::io_context::executor_type>> &&
              ShutdownHost<EngineImpl<asio::any_io_executor>>);
static_assert(CqEventHost<EngineImpl<asio::io_context::executor_type>> &&
              CqEventHost<EngineImpl<asio::any_io_executor>>);
static_assert(CqDrainSink<EngineImpl<asio::io_context::executor_type>, fi_cq_entry> &&
              CqDrainSink<EngineImpl<asio::any_io_executor>, fi_cq_entry>);

}  // namespace

DrainPosition drain_position() noexcept {
  if (current_drain == nullptr) return DrainPosition::none;
  return *current_drain == DrainPlace::more ? DrainPosition::more : DrainPosition::last;
}

std::shared_ptr<Engine> open_engine(const asio::any_io_executor& executor, const Configuration& configuration,
                                    std::error_code& ec, std::string& what) {
  std::shared_ptr<Engine> engine;
  // An io_context's own executor gets an engine that calls it directly. Asio's
  // any_executor::target<T>() casts without checking the type (Asio 1.22), so the type is compared
  // first: a strand, a thread pool's executor or an io_context executor with other properties
  // takes the type-erased engine instead of being read as something it is not.
  if (executor.target_type() == typeid(asio::io_context::executor_type)) {
    auto direct = std::make_shared<EngineImpl<asio::io_context::executor_type>>(
        *executor.target<asio::io_context::executor_type>(), configuration);
    direct->open(ec, what);
    engine = std::move(direct);
  } else {
    auto erased = std::make_shared<EngineImpl<asio::any_io_executor>>(executor, configuration);
    erased->open(ec, what);
    engine = std::move(erased);
  }
  return ec ? nullptr : engine;
}

}  // namespace dma::detail
