// The engine's class, EngineImpl: its parts, how they are wired, and the hot path (submit, the
// intake, a pass, the drain, a completion, the poster's host calls), defined here so that the pass
// compiles into one unit, engine.cpp. What lies off that path (opening, metrics, error
// completions, segmented transfers, handing back, reclaiming) is defined in engine_slow_path.cpp,
// which instantiates it for both executors. Private to lib/engine.
#pragma once

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

namespace dma::detail {

// The drain running on this thread, if any: what drain_position() reports, and how submit() tells
// a resubmission from a handler of this engine's own drain. A drain may run inside another one's
// handler (a strand dispatched inline), so each restores the one it found.
inline thread_local const DrainPlace* current_drain = nullptr;

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

  void open(std::error_code& ec, std::string& what);

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
  Metrics metrics() const noexcept override;

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
  std::error_code insert_peer_now(std::uint64_t client_id, std::span<const std::uint8_t> address);
  std::error_code pin_now(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive);

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
  int failed(fid_cq* cq, const fi_cq_err_entry& entry);

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
  void fail_prepared(Operation* op, std::error_code ec);
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
  void fail_queued(Operation* op, std::error_code ec, std::string detail);
  SegmentStep segment_step(Operation& op) noexcept { return Segmenter::step(op); }
  bool segment_continues(const Operation& op) const noexcept { return Segmenter::continues(op); }
  bool segment_all_posted(const Operation& op) const noexcept { return Segmenter::all_posted(op); }
  void stop_segmented(Operation* op);

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
  void abandoned(Operation* op);

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
  static SegmentLimits segment_limits(const fi_info& info, const Configuration& c) noexcept;
  static void* describe_buffer(void* host, const Operation& op, std::byte* base, std::size_t length,
                               std::shared_ptr<void>& lease, std::error_code& ec);
  void segment_returned(Operation& op, const SegmentSlot& slot) noexcept;
  void segment_completed(SegmentSlot& slot);
  void segment_failed(fid_cq* cq, const fi_cq_err_entry& entry, SegmentSlot& slot);
  void finish_segmented(Operation* op);

  // ---- posting again ------------------------------------------------------------------------
  bool hand_back(Operation* op);
  bool hand_back_segment(Operation& op, SegmentSlot& slot);
  void requeue(Operation* op);
  bool retry_alone(Operation* op);
  void read_peers_on(std::uint32_t generation, std::vector<std::vector<std::uint8_t>>& peers);
  void context_less_success();

  // ---- cancellation, reclaiming -------------------------------------------------------------
  void cancel_outstanding(Operation* op, std::uint64_t sequence, CancelScope scope);

  void reclaim();
  bool reclaim_step();

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

// The engine is a host of each kind its parts and the CQ watcher ask for (hosts.hpp, cq_watcher.hpp).
static_assert(PosterHost<EngineImpl<asio::io_context::executor_type>> && PosterHost<EngineImpl<asio::any_io_executor>>);
static_assert(ShutdownHost<EngineImpl<asio::io_context::executor_type>> &&
              ShutdownHost<EngineImpl<asio::any_io_executor>>);
static_assert(CqEventHost<EngineImpl<asio::io_context::executor_type>> &&
              CqEventHost<EngineImpl<asio::any_io_executor>>);
static_assert(CqDrainSink<EngineImpl<asio::io_context::executor_type>, fi_cq_entry> &&
              CqDrainSink<EngineImpl<asio::any_io_executor>, fi_cq_entry>);

}  // namespace dma::detail
