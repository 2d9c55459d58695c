// Per-peer flow: each peer address's accepted transfers in order, its health, and the round-robin
// of peers that have something to post. A peer that stalls (-FI_EAGAIN), reconnects or backs off
// leaves the round-robin; the others keep posting.
#pragma once

#include "operation_state.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace dma::detail {

using Clock = std::chrono::steady_clock;

/// One peer's queue and health. Lives inside its Peer (peer_table.hpp) and is scheduled by a
/// FlowScheduler; nothing here calls libfabric.
struct PeerFlow {
  /// Where the flow is in its scheduler.
  enum class Place : std::uint8_t {
    idle,    ///< in no list: nothing to post, or waiting for its in-flight transfers (reconnect)
    ready,   ///< in the round-robin
    parked,  ///< refused a post with -FI_EAGAIN; back in the round-robin after the next drain
  };

  OperationQueue queue;                 ///< accepted, not yet posted, oldest first
  std::size_t in_flight = 0;            ///< posted (on any endpoint), not yet handed back
  Clock::time_point stalled_since{};    ///< first -FI_EAGAIN of the current stall, or epoch
  Clock::time_point unreachable_until;  ///< transfers fail at once until then
  unsigned markings = 0;                ///< times marked unreachable in a row (the back-off exponent)
  bool connected = false;               ///< a transfer completed since the last (re)connect
  bool refresh = false;                 ///< its address-vector entry is replaced before the next post
  bool marked = false;                  ///< scratch for the engine's sweeps
  bool isolating = false;               ///< a suspect (Operation::suspect) is posted alone: nothing else goes
  Place place = Place::idle;
  PeerFlow* prev = nullptr;
  PeerFlow* next = nullptr;

  bool backing_off(Clock::time_point now) const noexcept { return markings != 0 && now < unreachable_until; }

  /// The peer answered: a transfer completed on its connection.
  void succeeded() noexcept {
    markings = 0;
    connected = true;
  }

  /// The application says the peer is back (add_peer with a fresh advertisement): the back-off
  /// ends, and the next transfer reconnects on a fresh address-vector entry.
  void forgive() noexcept {
    if (markings == 0) return;
    markings = 0;
    unreachable_until = {};
    refresh = true;
  }

  /// Marks the peer unreachable for backoff × 2^(markings in a row), at most backoff_max; the next
  /// transfer after that reconnects on a fresh address-vector entry.
  void mark_unreachable(Clock::time_point now, std::chrono::nanoseconds backoff,
                        std::chrono::nanoseconds backoff_max) noexcept;
};

/// The round-robin of flows with transfers to post, and the flows parked on -FI_EAGAIN.
class FlowScheduler {
 public:
  /// Adds flow to the back of the round-robin unless it is there already (or parked).
  void ready(PeerFlow& flow) noexcept;
  /// The flow whose turn it is, or null.
  PeerFlow* front() const noexcept { return ready_.head; }
  /// After flow posted one transfer: it goes to the back if others wait, leaves when its queue is empty.
  void posted(PeerFlow& flow) noexcept {
    if (flow.queue.empty()) return remove(flow);
    if (flow.next == nullptr) return;  // alone, or already last
    ready_.unlink(flow);
    ready_.push_back(flow);
  }
  /// flow's post got -FI_EAGAIN: out of the round-robin until unpark_all().
  void park(PeerFlow& flow) noexcept;
  /// Parked flows rejoin the round-robin, in the order they were parked (after a CQ drain).
  void unpark_all() noexcept;
  /// Takes flow out of whichever list holds it.
  void remove(PeerFlow& flow) noexcept;
  bool any_ready() const noexcept { return ready_.head != nullptr; }
  bool any_parked() const noexcept { return parked_.head != nullptr; }
  /// Whether another flow than `flow` is ready (the next post may carry FI_MORE).
  bool others_ready(const PeerFlow& flow) const noexcept { return ready_.head != &flow || flow.next != nullptr; }

 private:
  struct List {
    PeerFlow* head = nullptr;
    PeerFlow* tail = nullptr;
    void push_back(PeerFlow& flow) noexcept;
    void unlink(PeerFlow& flow) noexcept;
  };
  List ready_;
  List parked_;
};

}  // namespace dma::detail
