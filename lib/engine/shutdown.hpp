// Shutdown: the engine's way out. begin() fails what was never posted and gives the posted
// transfers progress_deadline to come back; flush() then dooms the rest and closes the endpoints,
// which makes the provider hand every posted transfer back (FI_ECANCELED) to a CQ drained here;
// close() completes whatever never came back and closes every libfabric object. abandon() is for
// an execution context going away with work still posted: it frees without invoking handlers.
//
// Rules: every accepted transfer still leaves through the ledger exactly once; a posted
// transfer's memory is released only after the provider handed it back or its endpoint closed;
// every MR of the domain closes before the domain does. All of it runs on the engine's strand
// (abandon() in the engine's destructor).
//
// Its host is the engine, through the public ShutdownHost protocol (hosts.hpp).
#pragma once

#include "completion_error.hpp"
#include "hosts.hpp"
#include "intake.hpp"
#include "ledger.hpp"
#include "log.hpp"
#include "peer_table.hpp"
#include "poster.hpp"
#include "reclaimer.hpp"
#include "registrar.hpp"

#include <dma/endpoint.hpp>
#include <dma/error.hpp>

#include <chrono>
#include <optional>
#include <vector>

namespace dma::detail {

template <typename Watcher, typename Timer>
class Shutdown {
 public:
  /// The parts it closes, owned by the engine.
  struct Parts {
    Endpoint& endpoint;
    std::optional<PeerTable>& peers;
    Registrar& registrar;
    Ledger& ledger;
    Reclaimer& reclaimer;
    Poster& poster;
    Intake& intake;
    Watcher& watcher;
    const Log& log;
  };

  Shutdown(const typename Timer::executor_type& executor, std::chrono::nanoseconds progress_deadline, Parts parts)
      : parts_(parts), progress_deadline_(progress_deadline), timer_(executor) {}

  /// begin() ran: new transfers are refused.
  bool stopping() const noexcept { return stopping_; }
  /// close() ran: the endpoint and its CQ are gone.
  bool closed() const noexcept { return closed_; }

  template <ShutdownHost Host>
  void begin(Host& host);
  template <ShutdownHost Host>
  void flush(Host& host);
  template <ShutdownHost Host>
  void close(Host& host);
  void abandon() noexcept;

 private:
  void close_everything() noexcept;

  Parts parts_;
  std::chrono::nanoseconds progress_deadline_;
  Timer timer_;
  bool stopping_ = false;
  bool closed_ = false;
};

// Fails what was never posted, gives posted transfers progress_deadline to finish, then hands back
// the rest by closing the endpoints.
template <typename Watcher, typename Timer>
template <ShutdownHost Host>
void Shutdown<Watcher, Timer>::begin(Host& host) {
  if (stopping_) return;
  stopping_ = true;
  OperationQueue batch = parts_.intake.take_waiting();
  while (Operation* op = batch.pop_front())
    parts_.ledger.refuse(op, errc::shutdown);
  while (Operation* op = parts_.intake.pop_joined())
    parts_.ledger.refuse(op, errc::shutdown);
  std::vector<PeerFlow*> queues;
  for (Operation* op = parts_.ledger.oldest(); op != nullptr; op = state(*op).newer) {
    // A segmented transfer stays queued until its last post: its remaining posts fail here too.
    const OperationState& s = state(*op);
    if ((s.posted && s.segments == nullptr) || s.peer->flow.marked) continue;
    s.peer->flow.marked = true;
    queues.push_back(&s.peer->flow);
  }
  const std::size_t queued = parts_.poster.queued();
  for (PeerFlow* flow : queues) {
    flow->marked = false;
    parts_.poster.fail_queue(*flow, errc::shutdown, "never posted", host);
  }
  parts_.log(LogLevel::info, [&] {
    return "shutdown: " + std::to_string(queued) + " queued transfers failed; waiting up to " +
           duration_text(progress_deadline_) + " for " + std::to_string(parts_.poster.in_flight()) + " posted ones";
  });
  if (parts_.poster.idle()) return close(host);
  timer_.expires_after(progress_deadline_);
  timer_.async_wait([self = host.shared_from_this(), this](std::error_code ec) {
    if (!ec && !closed_) flush(*self);
  });
  host.schedule_progress();
}

// Posted operations that outlived the grace period: closing the endpoints makes the provider hand
// every one of them back (FI_ECANCELED), and only then is their memory released.
template <typename Watcher, typename Timer>
template <ShutdownHost Host>
void Shutdown<Watcher, Timer>::flush(Host& host) {
  parts_.log(LogLevel::warning, [&] {
    return "shutdown grace over: " + std::to_string(parts_.poster.in_flight()) +
           " posted transfers not completed within " + duration_text(progress_deadline_) +
           "; closing the endpoint hands them back";
  });
  for (Operation* op = parts_.ledger.oldest(); op != nullptr; op = state(*op).newer)
    parts_.reclaimer.doom(*op, Doom::shutdown);
  parts_.reclaimer.close_all(parts_.endpoint.cq());
  parts_.endpoint.close_endpoint();
  for (int round = 0; round < 100 && parts_.poster.in_flight() > 0; ++round)
    (void)host.drain_cqs();
  close(host);
}

template <typename Watcher, typename Timer>
template <ShutdownHost Host>
void Shutdown<Watcher, Timer>::close(Host& host) {
  if (closed_) return;
  closed_ = true;
  parts_.watcher.close();
  timer_.cancel();
  parts_.reclaimer.close_all(parts_.endpoint.cq());
  parts_.endpoint.close_endpoint();
  // Whatever the provider never handed back cannot come back now; the CQs close below.
  if (parts_.ledger.oldest() != nullptr) {
    parts_.log(LogLevel::warning, [&] {
      std::size_t n = 0;
      for (const Operation* op = parts_.ledger.oldest(); op != nullptr; op = state(*op).newer)
        ++n;
      return "transfers never returned: " + std::to_string(n) +
             " the provider did not hand back after its endpoint closed; they fail now";
    });
  }
  while (Operation* op = parts_.ledger.oldest()) {
    if (state(*op).posted) host.abandoned(op);
    parts_.ledger.finish(op, doom_error(state(*op).doom == Doom::none ? Doom::shutdown : state(*op).doom), 0,
                         "the provider never returned it");
  }
  close_everything();
}

// The execution context is going away with work still posted: flush and free without invoking.
template <typename Watcher, typename Timer>
void Shutdown<Watcher, Timer>::abandon() noexcept {
  parts_.watcher.detach();
  if (parts_.endpoint.cq() == nullptr) return;
  OperationQueue batch = parts_.intake.take_waiting();
  while (Operation* op = batch.pop_front())
    destroy(op);
  while (Operation* op = parts_.intake.pop_joined())
    destroy(op);
  parts_.reclaimer.close_all(parts_.endpoint.cq());
  parts_.endpoint.close_endpoint();
  parts_.ledger.destroy_all();  // the endpoints are closed: the provider holds none of these any more
  close_everything();
}

// Replaced endpoints' queues, AV entries, MRs (every MR of this domain closes before the domain
// does), then the endpoint's objects.
template <typename Watcher, typename Timer>
void Shutdown<Watcher, Timer>::close_everything() noexcept {
  parts_.reclaimer.clear();
  if (parts_.peers) parts_.peers->clear();
  parts_.peers.reset();
  parts_.registrar.release();
  parts_.endpoint.close();
}

}  // namespace dma::detail
