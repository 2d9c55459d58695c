#include "reclaimer.hpp"

#include <algorithm>

namespace dma::detail {

void Reclaimer::doom(Operation& op, Doom why) noexcept {
  if (!op.posted || op.doom != Doom::none) return;
  op.doom = why;
  Generation& g = op.generation == current_.generation ? current_ : retiring_of(op.generation);
  ++g.doomed;
}

bool Reclaimer::closed(const Operation& op) const noexcept {
  const Generation* g = find(op.generation);
  return g == nullptr || g->closed;
}

bool Reclaimer::step(std::error_code& ec) {
  ec.clear();
  if (current_.doomed != 0 && !current_.closed && retiring_.size() < max_retiring) {
    Endpoint::Retired old = replace_(ec);
    if (!ec) {
      Generation retired = std::move(current_);
      retired.endpoint = std::move(old.endpoint);
      retired.cq = std::move(old.cq);
      retiring_.push_back(std::move(retired));
      current_ = Generation{};
      current_.generation = retiring_.back().generation + 1;
      ++replacements_;
    }
  }
  bool closed_one = false;
  for (Generation& g : retiring_) {
    if (g.closed || g.in_flight != g.doomed) continue;
    g.endpoint.reset();  // the provider returns what it still holds to its CQ, as FI_ECANCELED
    g.closed = true;
    closed_one = true;
  }
  collect();
  return closed_one;
}

void Reclaimer::collect() noexcept {
  std::erase_if(retiring_, [](const Generation& g) { return g.closed && g.in_flight == 0; });
}

void Reclaimer::close_all() noexcept {
  for (Generation& g : retiring_) {
    g.endpoint.reset();
    g.closed = true;
  }
  current_.closed = true;
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
