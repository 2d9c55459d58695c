#include "peer_flow.hpp"

#include <algorithm>

namespace dma::detail {

void PeerFlow::mark_unreachable(Clock::time_point now, std::chrono::nanoseconds backoff,
                                std::chrono::nanoseconds backoff_max) noexcept {
  const unsigned doublings = std::min(markings, 30u);
  markings = std::min(markings + 1, 31u);
  std::chrono::nanoseconds wait = backoff;
  for (unsigned i = 0; i < doublings && wait < backoff_max; ++i)
    wait = wait > backoff_max / 2 ? backoff_max : wait * 2;
  wait = std::min(wait, backoff_max);
  unreachable_until = wait >= Clock::time_point::max() - now ? Clock::time_point::max() : now + wait;
  connected = false;
  refresh = true;
  stalled_since = {};
}

void FlowScheduler::List::push_back(PeerFlow& flow) noexcept {
  flow.prev = tail;
  flow.next = nullptr;
  (tail != nullptr ? tail->next : head) = &flow;
  tail = &flow;
}

void FlowScheduler::List::unlink(PeerFlow& flow) noexcept {
  (flow.prev != nullptr ? flow.prev->next : head) = flow.next;
  (flow.next != nullptr ? flow.next->prev : tail) = flow.prev;
  flow.prev = flow.next = nullptr;
}

void FlowScheduler::ready(PeerFlow& flow) noexcept {
  if (flow.place != PeerFlow::Place::idle) return;
  ready_.push_back(flow);
  flow.place = PeerFlow::Place::ready;
}

void FlowScheduler::park(PeerFlow& flow) noexcept {
  remove(flow);
  parked_.push_back(flow);
  flow.place = PeerFlow::Place::parked;
}

void FlowScheduler::unpark_all() noexcept {
  while (PeerFlow* flow = parked_.head) {
    parked_.unlink(*flow);
    flow->place = PeerFlow::Place::idle;
    if (!flow->queue.empty()) ready(*flow);
  }
}

void FlowScheduler::remove(PeerFlow& flow) noexcept {
  if (flow.place == PeerFlow::Place::ready) ready_.unlink(flow);
  if (flow.place == PeerFlow::Place::parked) parked_.unlink(flow);
  flow.place = PeerFlow::Place::idle;
}

}  // namespace dma::detail
