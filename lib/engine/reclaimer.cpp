#include "reclaimer.hpp"

#include "connection_cut.hpp"
#include "peer_table.hpp"

#include <rdma/fi_eq.h>

#include <algorithm>

namespace dma::detail {

void Reclaimer::doom(Operation& op, Doom why) noexcept {
  OperationState& s = state(op);
  if (!s.posted || s.doom != Doom::none) return;
  s.doom = why;
  if (s.segments == nullptr) return doom_post(op, s.generation);
  s.segments->tracker.for_each_in_flight([&](SegmentSlot& slot) { doom_post(op, slot.generation); });
}

void Reclaimer::doom_post(const Operation& op, std::uint32_t generation) noexcept {
  Generation& g = generation == current_.generation ? current_ : retiring_of(generation);
  ++g.doomed;
  if (!cut_reads_ || op.request.direction != Direction::FromPeer || state(op).peer == nullptr) return;
  const std::vector<std::uint8_t>& address = state(op).peer->address;
  if (std::find(g.read_peers.begin(), g.read_peers.end(), address) != g.read_peers.end()) return;
  try {
    g.read_peers.push_back(address);
  } catch (...) {  // out of memory: the close goes ahead uncut, as without cut_reads
  }
}

bool Reclaimer::closed(std::uint32_t generation) const noexcept {
  const Generation* g = find(generation);
  return g == nullptr || g->closed;
}

bool Reclaimer::step(std::error_code& ec, Clock::time_point now) {
  ec.clear();
  if (current_.doomed != 0 && !current_.closed && retiring_.size() < max_retiring) {
    Endpoint::Retired old = replace_(ec);
    if (!ec) {
      Generation retired = std::move(current_);
      retired.endpoint = std::move(old.endpoint);
      retired.cq = std::move(old.cq);
      retired.replaced_at = now;
      if (cut_reads_) retired.sockets = socket_inodes();
      retiring_.push_back(std::move(retired));
      current_ = Generation{};
      current_.generation = retiring_.back().generation + 1;
      ++replacements_;
    }
  }
  bool closed_one = false;
  for (Generation& g : retiring_) {
    if (g.closed || (g.in_flight != g.doomed && now - g.replaced_at < close_grace)) continue;
    close(g);
    closed_one = true;
  }
  collect();
  return closed_one;
}

void Reclaimer::collect() noexcept {
  std::erase_if(retiring_, [](const Generation& g) { return g.closed && g.in_flight == 0; });
}

// The current endpoint holds every connection the process opened since it was replaced, or since
// it opened: its connections are among the sockets open now.
void Reclaimer::close_all(fid_cq* current_cq) noexcept {
  for (Generation& g : retiring_)
    if (!g.closed) close(g);
  if (cut_reads_ && !current_.closed && current_.in_flight != 0) {
    try {
      current_.sockets = socket_inodes();
    } catch (...) {  // out of memory: the close goes ahead uncut
    }
    cut_reads(current_, current_cq);
  }
  current_.closed = true;
}

// The provider returns what the endpoint still holds to its CQ, as FI_ECANCELED.
void Reclaimer::close(Generation& g) noexcept {
  if (cut_reads_) cut_reads(g, g.cq.get());
  g.endpoint.reset();
  g.closed = true;
}

// A cut connection reads end of stream at the next progress: a half-received read fails there,
// once, and the connection's queues are flushed before fi_close flushes them again.
void Reclaimer::cut_reads(Generation& g, fid_cq* cq) noexcept {
  if (g.in_flight != g.doomed && read_peers_) {
    try {
      read_peers_(g.generation, g.read_peers);
    } catch (...) {  // out of memory: the close goes ahead cut only for the doomed reads
    }
  }
  if (!g.read_peers.empty() && shut_down_connections(g.sockets, g.read_peers) != 0 && cq != nullptr) {
    for (int pass = 0; pass < progress_passes_after_cut; ++pass)
      (void)fi_cq_read(cq, nullptr, 0);  // progress only: reads no entry
  }
}

Reclaimer::Generation& Reclaimer::retiring_of(std::uint32_t generation) noexcept {
  for (Generation& g : retiring_)
    if (g.generation == generation) return g;
  return current_;  // unreachable while the counts are right; never index out of range
}

const Reclaimer::Generation* Reclaimer::find(std::uint32_t generation) const noexcept {
  if (generation == current_.generation) return &current_;
  for (const Generation& g : retiring_)
    if (g.generation == generation) return &g;
  return nullptr;
}

}  // namespace dma::detail
