// The ledger: every accepted transfer from acceptance to completion. It is the one exit each
// transfer takes, exactly once (finish, succeed, or refuse for one never accepted), settles what
// the transfer held before its handler runs, counts outcomes, and sweeps deadlines.
#pragma once

#include "counter.hpp"
#include "hosts.hpp"
#include "log.hpp"
#include "peer_table.hpp"
#include "poster.hpp"
#include "reclaimer.hpp"
#include "segmenter.hpp"

#include <dma/advertisement.hpp>
#include <dma/detail/cancel_scope.hpp>
#include <dma/error.hpp>
#include <dma/metrics.hpp>

#include <asio/error.hpp>

#include <atomic>
#include <string>
#include <system_error>
#include <vector>

namespace dma::detail {

class Ledger {
 public:
  explicit Ledger(std::chrono::nanoseconds default_deadline) noexcept : default_deadline_(default_deadline) {}

  void bind(PeerTable* peers) noexcept { peers_ = peers; }
  /// Where a segmented transfer's block goes back at its completion; must outlive the ledger.
  void set_segmenter(Segmenter& segmenter) noexcept { segmenter_ = &segmenter; }
  /// Where the sweep reports timed-out transfers; must outlive the ledger.
  void set_log(const Log& log) noexcept { log_ = &log; }

  // Any thread.
  void submitted() noexcept { outstanding_.fetch_add(1, std::memory_order_relaxed); }
  std::size_t outstanding() const noexcept { return outstanding_.load(std::memory_order_relaxed); }
  std::uint64_t next_sequence() noexcept { return sequence_.fetch_add(1, std::memory_order_relaxed); }

  /// op is accepted at `now` (its peer acquired): its deadline starts.
  void accept(Operation* op, Clock::time_point now) noexcept {
    const auto& asked = op->request.deadline;
    OperationState& s = state(*op);
    s.accepted = now;
    s.deadline = deadline_after(now, asked ? std::max(*asked, std::chrono::nanoseconds(0)) : default_deadline_);
    if (s.deadline < next_deadline_) next_deadline_ = s.deadline;
    accepted_.push_back(op);
  }
  /// Accepts a submitted op at `now` into its peer's queue in the poster, or completes it at once:
  /// refused for an oversized address, an operand that does not resolve or a peer that cannot be
  /// inserted, failed (accepted first) while its peer backs off.
  void admit(Operation* op, Clock::time_point now, Poster& poster) {
    if (op->request.peer_address.oversized()) return refuse(op, errc::address_length);
    if (const errc refused = op->functions->resolve(*op); refused != errc{}) return refuse(op, refused);
    Peer* peer = peers_->acquire_cached(op->request.client_id, op->request.peer_address);
    if (peer == nullptr) {
      std::error_code ec;
      peer = peers_->acquire(op->request.client_id, op->request.peer_address, ec);
      if (peer == nullptr) return refuse(op, ec);
    }
    state(*op).peer = peer;
    accept(op, now);
    if (peer->flow.backing_off(now)) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(peer->flow.unreachable_until - now);
      return finish(op, errc::peer_unreachable, 0,
                    "the peer was marked unreachable; retried after " + duration_text(left));
    }
    poster.enqueue(peer->flow, op);
  }
  /// Whether op (compared by address before anything is read through it) is accepted with sequence.
  bool holds(const Operation* op, std::uint64_t sequence) const noexcept {
    return accepted_.contains(op) && op->sequence == sequence;
  }
  Operation* oldest() const noexcept { return accepted_.oldest(); }

  /// What cancel() did.
  enum class Cancelled : std::uint8_t { nothing, finished, doomed };
  /// Cancels op, compared by address before anything is read through it (op may be long gone, and
  /// its address reused): a queued one completes at once with operation_aborted, a posted one is
  /// doomed for the reclaimer to hand back. Nothing for one completed or doomed already.
  Cancelled cancel(Operation* op, std::uint64_t sequence, CancelScope scope, Poster& poster, Reclaimer& reclaimer) {
    if (!holds(op, sequence) || state(*op).doom != Doom::none) return Cancelled::nothing;
    if (state(*op).posted && scope == CancelScope::queued) return Cancelled::nothing;  // it would have side effects
    if (!state(*op).posted) {
      (void)poster.withdraw(op);
      finish(op, asio::error::operation_aborted);
      return Cancelled::finished;
    }
    reclaimer.doom(*op, Doom::cancelled);
    return Cancelled::doomed;
  }

  void finish(Operation* op, std::error_code ec, int provider_errno = 0, std::string detail = {}) {
    if (!ec) return succeed(op);
    release(op);
    failed_.add();
    if (ec == errc::timed_out) timed_out_.add();
    if (ec == asio::error::operation_aborted) cancelled_.add();
    complete(op, Outcome(ec, provider_errno, std::move(detail)));
  }
  void succeed(Operation* op) {
    release(op);
    completed_.add();
    complete(op, Outcome(TransferDone{op->length, std::nullopt}));
  }
  /// Completes op with an outcome made before its release (a segmented transfer's, whose CRC
  /// covers buffers its block lists).
  void settle(Operation* op, Outcome&& outcome) {
    release(op);
    if (outcome.ok()) {
      completed_.add();
    } else {
      failed_.add();
      if (outcome.error() == errc::timed_out) timed_out_.add();
      if (outcome.error() == asio::error::operation_aborted) cancelled_.add();
    }
    complete(op, std::move(outcome));
  }
  /// An operation refused before it was accepted: it holds nothing yet.
  void refuse(Operation* op, std::error_code ec) {
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
    failed_.add();
    complete(op, Outcome(ec));
  }
  /// The execution context is going away: frees every accepted operation without invoking it.
  void destroy_all() noexcept {
    while (Operation* op = accepted_.oldest()) {
      accepted_.unlink(op);
      state(*op).lease.reset();
      if (state(*op).segments != nullptr) segmenter_->release(*op);
      destroy(op);
    }
  }

  /// Nothing is outstanding: no deadline is pending.
  void forget_deadlines() noexcept { next_deadline_ = Clock::time_point::max(); }

  /// Fails the queued transfers past their deadline and dooms the posted ones; a peer whose
  /// posted transfer timed out is marked unreachable, after the sweep, so its other transfers
  /// that timed out too report the deadline. One comparison unless the earliest deadline passed.
  /// Returns whether it doomed or failed anything.
  template <QueueFailHost Host>
  bool sweep(Clock::time_point now, Reclaimer& reclaimer, Poster& poster, Host& host);

  std::uint64_t completed() const noexcept { return completed_.get(); }
  std::uint64_t failed() const noexcept { return failed_.get(); }
  std::uint64_t timed_out() const noexcept { return timed_out_.get(); }
  std::uint64_t cancelled() const noexcept { return cancelled_.get(); }
  /// Copies its counters into their Metrics fields.
  void report(Metrics& m) const noexcept {
    m.completed = completed();
    m.failed = failed();
    m.timed_out = timed_out();
    m.cancelled = cancelled();
  }

 private:
  // now + d without overflow; no_deadline (or anything past the clock's range) never fires.
  static Clock::time_point deadline_after(Clock::time_point now, std::chrono::nanoseconds d) noexcept {
    if (d >= Clock::time_point::max() - now) return Clock::time_point::max();
    return now + std::chrono::duration_cast<Clock::duration>(d);
  }

  // What an accepted operation holds, given back before its handler runs.
  void release(Operation* op) {
    accepted_.unlink(op);
    OperationState& s = state(*op);
    s.lease.reset();
    if (s.segments != nullptr) segmenter_->release(*op);
    peers_->settle(*s.peer);
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
  }

  std::chrono::nanoseconds default_deadline_;
  PeerTable* peers_ = nullptr;
  Segmenter* segmenter_ = nullptr;
  OutstandingList accepted_;  ///< every accepted operation until it completes, oldest first
  Clock::time_point next_deadline_ = Clock::time_point::max();  ///< no accepted deadline is earlier
  std::atomic<std::size_t> outstanding_{0};
  std::atomic<std::uint64_t> sequence_{1};
  Counter completed_, failed_, timed_out_, cancelled_;
  const Log* log_ = &default_log_;
  static inline const Log default_log_{};
};

template <QueueFailHost Host>
bool Ledger::sweep(Clock::time_point now, Reclaimer& reclaimer, Poster& poster, Host& host) {
  if (now < next_deadline_) return false;
  next_deadline_ = Clock::time_point::max();
  std::vector<PeerFlow*> late_peers;
  std::vector<PeerFlow*> queues;
  for (Operation* op = accepted_.oldest(); op != nullptr; op = state(*op).newer) {
    OperationState& s = state(*op);
    if (s.doom != Doom::none) continue;
    if (s.deadline > now) {
      next_deadline_ = std::min(next_deadline_, s.deadline);
      continue;
    }
    PeerFlow& flow = s.peer->flow;
    if (s.posted) {
      reclaimer.doom(*op, Doom::deadline);
      if (!flow.marked) late_peers.push_back(&flow);
    } else {
      s.doom = Doom::deadline;  // queued: failed below, in one pass over its queue
      if (!flow.marked) queues.push_back(&flow);
    }
    flow.marked = true;
  }
  for (PeerFlow* flow : queues) {
    const std::size_t before = flow->queue.size();
    poster.fail_doomed(*flow, errc::timed_out, "queued for its whole deadline: the peer took no posts in time", host);
    (*log_)(LogLevel::warning, [&] {
      return "transfers timed out: " + std::to_string(before - flow->queue.size()) + " queued to peer " +
             encode_hex(Poster::peer_of(*flow).address) + " for their whole deadline; the peer took no posts in time";
    });
  }
  for (PeerFlow* flow : late_peers) {
    (*log_)(LogLevel::warning, [&] {
      std::size_t n = 0;
      for (const Operation* op = accepted_.oldest(); op != nullptr; op = state(*op).newer)
        n += state(*op).posted && state(*op).doom == Doom::deadline && &state(*op).peer->flow == flow;
      return "transfers timed out: " + std::to_string(n) + " posted to peer " +
             encode_hex(Poster::peer_of(*flow).address) +
             " not completed within their deadline; handing them back by replacing the endpoint";
    });
    if (flow->backing_off(now)) continue;
    poster.mark_unreachable(*flow, now, errc::timed_out,
                            "the peer did not complete a transfer posted to it within its deadline; this one was "
                            "queued behind it",
                            host);
  }
  for (PeerFlow* flow : queues)
    flow->marked = false;
  for (PeerFlow* flow : late_peers)
    flow->marked = false;
  return true;
}

}  // namespace dma::detail
