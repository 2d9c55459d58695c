// The poster: turns the peers' queues into posts. Credits (per peer and for all peers), one
// transfer per ready peer in turn, FI_MORE on every post with another right behind it, and what a
// refused post (-FI_EAGAIN) means for its peer: parked until the next drain, and marked
// unreachable after progress_deadline of refusals. It also replaces a broken connection's AV
// entry before the peer's next post.
//
// The poster owns the scheduling state (the round-robin, the queued and in-flight counts); its
// host (PosterHost, hosts.hpp) does the rest. A transfer that takes several posts
// (Operation::segments, lib/engine/segmenter.hpp) stays at the front of its peer's queue until its
// last post is taken; each post takes a credit of its own.
#pragma once

#include "counter.hpp"
#include "hosts.hpp"
#include "log.hpp"
#include "peer_flow.hpp"
#include "peer_table.hpp"

#include <dma/advertisement.hpp>
#include <dma/configuration.hpp>
#include <dma/endpoint.hpp>
#include <dma/error.hpp>
#include <dma/metrics.hpp>

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <system_error>

namespace dma::detail {

/// The flags a write of op is posted with besides FI_COMPLETION and FI_MORE: its completion level
/// (FI_DELIVERY_COMPLETE, since without it tcp reports a write with a bad key as successful, or
/// `transmit_flag` for CompletionLevel::transmit), and FI_REMOTE_CQ_DATA with immediate data.
inline std::uint64_t write_flags(const TransferFields& request, std::uint64_t transmit_flag) noexcept {
  std::uint64_t flags = request.completion == CompletionLevel::transmit ? transmit_flag : FI_DELIVERY_COMPLETE;
  if (request.immediate_data) flags |= FI_REMOTE_CQ_DATA;
  return flags;
}

/// Whether request can be posted at all on a provider with this cq_data_size: immediate data only
/// on a write, and only as wide as the provider carries. Checked when a transfer is accepted.
inline std::error_code check_immediate_data(const TransferFields& request, std::size_t cq_data_size) noexcept {
  if (!request.immediate_data) return {};
  if (request.direction != Direction::ToPeer) return errc::immediate_data_on_read;
  if (cq_data_size == 0) return errc::immediate_data_too_wide;
  if (cq_data_size < sizeof(std::uint64_t) && (*request.immediate_data >> (8 * cq_data_size)) != 0) {
    return errc::immediate_data_too_wide;
  }
  return {};
}

/// fi_writemsg with write_flags(), or fi_readmsg (fi_read takes no flags, so no FI_MORE) of op to
/// peer. `transmit_flag` is the endpoint's flag for CompletionLevel::transmit.
inline ssize_t post_rma(fid_ep* endpoint, Operation& op, fi_addr_t peer, bool more,
                        std::uint64_t transmit_flag) noexcept {
  iovec iov{op.buffer, op.length};
  fi_rma_iov rma{op.request.remote_address, op.length, op.request.remote_key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &state(op).descriptor;
  msg.iov_count = 1;
  msg.addr = peer;
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = op.as_context();
  const std::uint64_t flags = FI_COMPLETION | (more ? FI_MORE : 0);
  if (op.request.direction == Direction::ToPeer) {
    msg.data = op.request.immediate_data.value_or(0);
    return fi_writemsg(endpoint, &msg, flags | write_flags(op.request, transmit_flag));
  }
  return fi_readmsg(endpoint, &msg, flags);
}

/// "1s", "250ms", "10µs" or "7ns": the largest unit that divides d.
std::string duration_text(std::chrono::nanoseconds d);

class Poster {
 public:
  struct Limits {
    std::size_t credits = 1;  ///< per peer
    std::size_t limit = 1;    ///< all peers together
    std::chrono::nanoseconds progress_deadline{std::chrono::seconds(1)};
    std::chrono::nanoseconds backoff{std::chrono::seconds(1)};
    std::chrono::nanoseconds backoff_max{std::chrono::seconds(30)};
  };

  /// An open endpoint's credits and in-flight limit, with the configuration's deadlines.
  static Limits limits_for(const Endpoint& endpoint, const Configuration& configuration) noexcept;

  void set_limits(const Limits& limits) noexcept { limits_ = limits; }
  /// Where it reports peers marked unreachable and reconnects; must outlive the poster.
  void set_log(const Log& log) noexcept { log_ = &log; }

  /// An accepted transfer joins its peer's queue.
  void enqueue(PeerFlow& flow, Operation* op) noexcept {
    flow.queue.push_back(op);
    ++queued_;
    if (flow.place == PeerFlow::Place::idle) flows_.ready(flow);
  }

  /// A transfer handed back before it finished goes to the front of its peer's queue, to be
  /// posted again (Operation::reposted, Operation::suspect).
  void requeue(PeerFlow& flow, Operation* op) noexcept {
    flow.queue.push_front(op);
    ++queued_;
    if (flow.place == PeerFlow::Place::idle) flows_.ready(flow);
  }

  /// Posts while credits last. A peer that refuses a post (-FI_EAGAIN) is parked until the next
  /// call (which follows the next drain, or the next intake); the others go on.
  template <PosterHost Host>
  void post_pending(Host& host);

  /// The provider handed back one of flow's posted transfers.
  void returned(PeerFlow& flow) noexcept {
    --in_flight_;
    returned_.add();
    --flow.in_flight;
    // Out of the round-robin with work left: its credits were used up, or it waited for this to
    // replace its address-vector entry. Either way it may post again.
    if (flow.place == PeerFlow::Place::idle && !flow.queue.empty() && (!flow.refresh || flow.in_flight == 0)) {
      flows_.ready(flow);
    }
  }

  /// Takes a queued op out of its peer's queue (cancellation); false when it is not queued.
  bool withdraw(Operation* op) noexcept {
    PeerFlow& flow = state(*op).peer->flow;
    if (!flow.queue.remove(op)) return false;
    --queued_;
    if (flow.queue.empty()) flows_.remove(flow);
    return true;
  }

  /// Fails every transfer in flow's queue with ec.
  template <QueueFailHost Host>
  void fail_queue(PeerFlow& flow, std::error_code ec, const std::string& detail, Host& host) {
    flows_.remove(flow);
    while (!flow.queue.empty()) {
      Operation* op = flow.queue.front();
      dequeue(flow);
      host.fail_queued(op, ec, detail);
    }
  }

  /// Fails the queued transfers of flow that are doomed (past their deadline), in one pass.
  template <QueueFailHost Host>
  void fail_doomed(PeerFlow& flow, std::error_code ec, const std::string& detail, Host& host) {
    flow.queue.remove_if([](const Operation& op) { return state(op).doom != Doom::none; },
                         [&](Operation* op) {
                           --queued_;
                           host.fail_queued(op, ec, detail);
                         });
    if (flow.queue.empty()) flows_.remove(flow);
  }

  /// Fails flow's queue with ec and makes its next transfers fail at once for the back-off.
  template <QueueFailHost Host>
  void mark_unreachable(PeerFlow& flow, Clock::time_point now, std::error_code ec, const std::string& detail,
                        Host& host) {
    flow.mark_unreachable(now, limits_.backoff, limits_.backoff_max);
    marked_unreachable_.add();
    (*log_)(LogLevel::warning, [&] {
      return "peer unreachable: " + encode_hex(peer_of(flow).address) + ": " + ec.message() + ": " + detail + "; " +
             std::to_string(flow.queue.size()) + " queued transfers failed, new ones fail at once for " +
             duration_text(std::chrono::duration_cast<std::chrono::nanoseconds>(flow.unreachable_until - now));
    });
    fail_queue(flow, ec, detail, host);
  }

  /// The flow whose turn it is, or null.
  const PeerFlow* front() const noexcept { return flows_.front(); }
  std::size_t in_flight() const noexcept { return in_flight_; }
  std::size_t queued() const noexcept { return queued_; }
  bool idle() const noexcept { return in_flight_ == 0 && queued_ == 0; }

  std::uint64_t posted() const noexcept { return posted_.get(); }
  std::uint64_t eagain() const noexcept { return eagain_.get(); }
  std::uint64_t reconnects() const noexcept { return reconnects_.get(); }
  std::uint64_t marked_unreachable() const noexcept { return marked_unreachable_.get(); }
  /// Copies its counters into their Metrics fields.
  void report(Metrics& m) const noexcept {
    m.posted = posted();
    const std::uint64_t back = returned_.get();
    m.posts_in_flight = m.posted > back ? static_cast<std::size_t>(m.posted - back) : 0;
    m.eagain = eagain();
    m.peers_marked_unreachable = marked_unreachable();
    m.reconnects = reconnects();
  }

  static Peer& peer_of(PeerFlow& flow) noexcept {
    return *reinterpret_cast<Peer*>(reinterpret_cast<char*>(&flow) - offsetof(Peer, flow));
  }

 private:
  // Pops the flow's front operation; a flow with nothing left leaves the round-robin.
  void dequeue(PeerFlow& flow) noexcept {
    (void)flow.queue.pop_front();
    --queued_;
    if (flow.queue.empty()) flows_.remove(flow);
  }

  // The peer's connection broke: its AV entry is replaced before its next post, once none of its
  // transfers is posted any more (the provider must not see the old entry go while it still holds
  // transfers on it). Returns whether the flow may post now.
  template <PosterHost Host>
  bool reconnect(Peer& peer, Host& host) {
    PeerFlow& flow = peer.flow;
    if (flow.in_flight != 0) {
      flows_.remove(flow);  // rejoins when its last posted transfer comes back
      return false;
    }
    flow.refresh = false;
    reconnects_.add();
    if (std::error_code ec = host.refresh(peer)) {
      (*log_)(LogLevel::warning, [&] {
        return "reconnect failed: peer " + encode_hex(peer.address) +
               ": a fresh address-vector entry: " + ec.message() + "; " + std::to_string(flow.queue.size()) +
               " queued transfers failed";
      });
      fail_queue(flow, ec, "a fresh address-vector entry for the peer", host);
      return false;
    }
    (*log_)(LogLevel::info,
            [&] { return "reconnect: peer " + encode_hex(peer.address) + " on a fresh address-vector entry"; });
    return true;
  }

  // A post was refused. Past progress_deadline of refusals in a row the peer is marked
  // unreachable: rxm and tcp report a refused, rejected or unanswered connection only this way.
  // Halfway there, a plain TCP connect to the peer's address starts beside libfabric's, so that
  // the failure can say which it was (connect_probe.hpp).
  template <QueueFailHost Host>
  void stalled(PeerFlow& flow, Host& host) {
    const auto now = Clock::now();
    if (flow.stalled_since == Clock::time_point{}) flow.stalled_since = now;
    Peer& peer = peer_of(flow);
    const Operation* front = flow.queue.front();
    if (front != nullptr && (state(*front).reposted || state(*front).suspect)) {
      // Posted again: the peer answered a moment ago. A refused TCP connection says at once that
      // it is gone; anything else is a connection forming, or a frozen peer, which holds its
      // transfers until their deadlines as it did on the endpoint they came back from.
      peer.probe.start(peer.address);
      if (peer.probe.peek() == ConnectProbe::Verdict::refused) {
        peer.probe.reset();
        return mark_unreachable(flow, now, errc::connection_refused,
                                "its connection broke and a plain TCP connection to the peer's address is refused: "
                                "nothing listens there any more",
                                host);
      }
      if (state(*front).reposted) return flows_.park(flow);
    }
    if (now - flow.stalled_since < limits_.progress_deadline) {
      if (!flow.connected && now - flow.stalled_since >= limits_.progress_deadline / 2) peer.probe.start(peer.address);
      return flows_.park(flow);
    }
    if (flow.connected) {
      peer.probe.reset();
      mark_unreachable(flow, now, errc::progress_deadline,
                       "no progress posting for " + duration_text(limits_.progress_deadline) +
                           ": peer unreachable or transmit queue stuck",
                       host);
      return;
    }
    const std::string late = "no connection within " + duration_text(limits_.progress_deadline);
    switch (peer.probe.finish()) {
      case ConnectProbe::Verdict::listening:
        return mark_unreachable(flow, now, errc::connection_rejected,
                                late +
                                    "; a plain TCP connection to the peer's address succeeds, so its "
                                    "libfabric is listening and rejected ours",
                                host);
      case ConnectProbe::Verdict::refused:
        return mark_unreachable(flow, now, errc::connection_refused,
                                late + "; a plain TCP connection to the peer's address is refused too", host);
      case ConnectProbe::Verdict::none:
      case ConnectProbe::Verdict::silent:
        break;
    }
    mark_unreachable(flow, now, errc::connection_refused, late, host);
  }

  static std::string rc_detail(ssize_t rc, const Operation& op) {
    return std::string(op.request.direction == Direction::ToPeer ? "fi_writemsg" : "fi_readmsg") + " returned " +
           std::to_string(rc);
  }

  static inline const Log default_log_{};

  Limits limits_;
  const Log* log_ = &default_log_;
  FlowScheduler flows_;
  std::size_t queued_ = 0;  ///< accepted, not yet posted (in the peers' queues)
  std::size_t in_flight_ = 0;
  Counter posted_, returned_, eagain_, reconnects_, marked_unreachable_;
};

template <PosterHost Host>
void Poster::post_pending(Host& host) {
  if (flows_.any_parked()) flows_.unpark_all();
  while (in_flight_ < limits_.limit) {
    PeerFlow* flow = flows_.front();
    if (flow == nullptr) return;
    if (flow->in_flight >= limits_.credits) {
      flows_.remove(*flow);  // its credits are used up; it rejoins when one comes back
      continue;
    }
    Peer& peer = peer_of(*flow);
    if (flow->refresh && !reconnect(peer, host)) continue;
    Operation* op = flow->queue.front();
    OperationState& s = state(*op);
    // A suspect goes alone: nothing else of its peer is in flight while it is (PeerFlow::isolating).
    if (flow->isolating || (s.suspect && flow->in_flight != 0)) {
      flows_.remove(*flow);  // rejoins when its transfers in flight come back
      continue;
    }
    if (std::error_code ec = host.prepare(*op)) {
      dequeue(*flow);
      host.fail_prepared(op, ec);
      continue;
    }
    if (s.segments != nullptr) {
      const SegmentStep step = host.segment_step(*op);
      if (step == SegmentStep::wait) {
        flows_.remove(*flow);  // its posts in flight bring it back
        continue;
      }
      if (step == SegmentStep::stop) {
        dequeue(*flow);
        host.stop_segmented(op);
        continue;
      }
    }
    // FI_MORE: the same peer has another post behind this one (another transfer, or the next
    // post of this one) and a credit for it, or another peer is ready, and the all-peers limit
    // has room for one more.
    const bool next = s.next != nullptr || (s.segments != nullptr && host.segment_continues(*op));
    const bool more = ((next && flow->in_flight + 1 < limits_.credits) || flows_.others_ready(*flow)) &&
                      in_flight_ + 1 < limits_.limit;
    const ssize_t rc = host.post(*op, peer.handle, more);
    if (rc == 0) {
      host.posted(*op);
      if (s.segments == nullptr || host.segment_all_posted(*op)) dequeue(*flow);
      s.posted = true;
      if (s.suspect) flow->isolating = true;
      ++in_flight_;
      ++flow->in_flight;
      posted_.add();
      if (flow->stalled_since != Clock::time_point{}) {
        flow->stalled_since = {};
        peer.probe.reset();
      }
      if (flow->place == PeerFlow::Place::ready) flows_.posted(*flow);
      continue;
    }
    if (rc == -FI_EAGAIN) {
      eagain_.add();
      stalled(*flow, host);
      continue;
    }
    dequeue(*flow);
    host.fail_queued(op, fabric_error(rc), rc_detail(rc, *op));
  }
}

}  // namespace dma::detail
