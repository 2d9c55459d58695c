// EngineImpl's members off the hot path: opening, metrics, error completions, segmented
// transfers, handing a transfer back, reclaiming. Instantiated here for both executors; the hot
// path is in engine_impl.hpp and compiles in engine.cpp.
#include "engine_impl.hpp"

#include <algorithm>
#include <string>
#include <string_view>

namespace dma::detail {

namespace {

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

constexpr std::string_view immediate_data_handed_back =
    "its endpoint was closed to hand back another transfer (cancelled or past its deadline) while this write "
    "with immediate data was in flight: it may have landed and notified, so it is not posted again";

}  // namespace

template <typename Inner>
void EngineImpl<Inner>::open(std::error_code& ec, std::string& what) {
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

template <typename Inner>
Metrics EngineImpl<Inner>::metrics() const noexcept {
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

template <typename Inner>
std::error_code EngineImpl<Inner>::insert_peer_now(std::uint64_t client_id, std::span<const std::uint8_t> address) {
  if (!peers_ || shutdown_.stopping()) return errc::not_open;
  std::error_code ec;
  (void)peers_->insert(client_id, address, ec);
  if (!ec) {
    if (Peer* peer = peers_->bound(client_id)) peer->flow.forgive();
  }
  return ec;
}

template <typename Inner>
std::error_code EngineImpl<Inner>::pin_now(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive) {
  if (shutdown_.closed() || !peers_) return errc::not_open;
  return registrar_.pin(base, length, std::move(keep_alive));
}

// Returns 1 when it completed an operation, 0 for an entry without one.
template <typename Inner>
int EngineImpl<Inner>::failed(fid_cq* cq, const fi_cq_err_entry& entry) {
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

template <typename Inner>
void EngineImpl<Inner>::fail_prepared(Operation* op, std::error_code ec) {
  ledger_.finish(op, ec, 0,
                 prepare_detail_.empty() ? std::string("preparing the post") : std::exchange(prepare_detail_, {}));
}

// A transfer that took some of its posts already completes once they are back.
template <typename Inner>
void EngineImpl<Inner>::fail_queued(Operation* op, std::error_code ec, std::string detail) {
  if (const OperationState& s = state(*op); s.segments != nullptr && s.posted) {
    if (s.segments->tracker.fail(ec, 0, std::move(detail))) finish_segmented(op);
    return;
  }
  ledger_.finish(op, ec, 0, std::move(detail));
}

template <typename Inner>
void EngineImpl<Inner>::stop_segmented(Operation* op) {
  SegmentTracker& tracker = state(*op).segments->tracker;
  if (!tracker.failed()) {
    (void)tracker.fail(doom_error(state(*op).doom), 0,
                       "stopped before its last post: " + std::to_string(tracker.posts()) + " of its posts were made");
  }
  finish_segmented(op);
}

// The endpoints are closed and op's posts never came back (shutdown): settles them all.
template <typename Inner>
void EngineImpl<Inner>::abandoned(Operation* op) {
  if (state(*op).segments == nullptr) return returned(op);
  SegmentTracker& tracker = state(*op).segments->tracker;
  tracker.for_each_in_flight([&](SegmentSlot& slot) {
    segment_returned(*op, slot);
    (void)tracker.returned(slot, errc::shutdown);
  });
  (void)poster_.withdraw(op);
}

template <typename Inner>
SegmentLimits EngineImpl<Inner>::segment_limits(const fi_info& info, const Configuration& c) noexcept {
  SegmentLimits limits;
  limits.max_bytes = info.ep_attr->max_msg_size != 0 ? info.ep_attr->max_msg_size : SIZE_MAX;
  if (c.max_segment_bytes != 0) limits.max_bytes = std::min(limits.max_bytes, c.max_segment_bytes);
  limits.iov_limit = std::max<std::size_t>(info.tx_attr->iov_limit, 1);
  limits.rma_iov_limit = std::max<std::size_t>(info.tx_attr->rma_iov_limit, 1);
  return limits;
}

template <typename Inner>
void* EngineImpl<Inner>::describe_buffer(void* host, const Operation& op, std::byte* base, std::size_t length,
                                         std::shared_ptr<void>& lease, std::error_code& ec) {
  return static_cast<EngineImpl*>(host)->registrar_.describe_buffer(op, base, length, lease, ec);
}

// One post of op came back: the bookkeeping of a posted transfer, per post.
template <typename Inner>
void EngineImpl<Inner>::segment_returned(Operation& op, const SegmentSlot& slot) noexcept {
  if (reclaimer_.returned_segment(slot.generation, state(op).doom != Doom::none)) reclaim_due_ = true;
  poster_.returned(state(op).peer->flow);
}

template <typename Inner>
void EngineImpl<Inner>::segment_completed(SegmentSlot& slot) {
  Operation* op = owner_of(slot);
  segment_returned(*op, slot);
  const OperationState& s = state(*op);
  s.peer->flow.succeeded();
  if (s.segments->tracker.returned(slot)) finish_segmented(op);
}

// The peer's fate is settled before the post is taken back, so a queue failed on the way
// (an unreachable peer) finds this transfer still waiting for it.
template <typename Inner>
void EngineImpl<Inner>::segment_failed(fid_cq* cq, const fi_cq_err_entry& entry, SegmentSlot& slot) {
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
template <typename Inner>
void EngineImpl<Inner>::finish_segmented(Operation* op) {
  if (!state(*op).segments->tracker.all_posted()) (void)poster_.withdraw(op);  // still at its queue's front
  Outcome outcome = Segmenter::outcome(*op);
  if (outcome.ok()) latency_.record(state(*op).accepted, drain_clock());
  ledger_.settle(op, std::move(outcome));
}

// A replaced endpoint closed for another transfer's sake handed op back unfinished: it goes to
// the front of its peer's queue and out on the current endpoint. Writing or reading the same
// bytes again is harmless; a write with immediate data is not (the first may have landed and
// notified), so it fails. Returns whether op was queued again (false: it completed now).
template <typename Inner>
bool EngineImpl<Inner>::hand_back(Operation* op) {
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
template <typename Inner>
bool EngineImpl<Inner>::hand_back_segment(Operation& op, SegmentSlot& slot) {
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

template <typename Inner>
void EngineImpl<Inner>::requeue(Operation* op) {
  OperationState& s = state(*op);
  s.posted = false;
  s.peer->flow.connected = false;
  poster_.requeue(s.peer->flow, op);
}

// A transfer failed with its connection: on a shared connection, another transfer (a wrong key
// or range, which the target answers by closing the connection) may have broken it. It is posted
// again alone once; failing again alone, it is the one the peer rejects. Not a write with
// immediate data (it may have notified already) or a segmented transfer, nor past its deadline.
template <typename Inner>
bool EngineImpl<Inner>::retry_alone(Operation* op) {
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
template <typename Inner>
void EngineImpl<Inner>::read_peers_on(std::uint32_t generation, std::vector<std::vector<std::uint8_t>>& peers) {
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
template <typename Inner>
void EngineImpl<Inner>::context_less_success() {
  context_less_errors_.add();
  const std::uint64_t count = context_less_errors_.get();
  if (log_occurrence(count)) {
    log_(LogLevel::warning, [&] {
      return "successful completion without an operation: nothing to complete; " + std::to_string(count) +
             " entries without an operation so far";
    });
  }
}

template <typename Inner>
void EngineImpl<Inner>::cancel_outstanding(Operation* op, std::uint64_t sequence, CancelScope scope) {
  const Ledger::Cancelled cancelled = ledger_.cancel(op, sequence, scope, poster_, reclaimer_);
  if (cancelled == Ledger::Cancelled::finished) schedule_progress();
  if (cancelled == Ledger::Cancelled::doomed) reclaim();
}

// Lets the reclaimer replace or close endpoints, through a reaper pass: a closed endpoint has
// handed its transfers to its CQ by the time fi_close returns, and they complete in that pass.
template <typename Inner>
void EngineImpl<Inner>::reclaim() {
  reclaim_due_ = true;
  (void)reap();
  post_pending();
  schedule_progress();
}

// Returns whether it closed a replaced endpoint.
template <typename Inner>
bool EngineImpl<Inner>::reclaim_step() {
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

template class EngineImpl<asio::io_context::executor_type>;
template class EngineImpl<asio::any_io_executor>;

}  // namespace dma::detail
