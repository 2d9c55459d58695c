#include "poster.hpp"

#include <algorithm>

namespace dma::detail {

std::string duration_text(std::chrono::nanoseconds d) {
  using namespace std::chrono;
  if (d % seconds(1) == nanoseconds(0)) return std::to_string(duration_cast<seconds>(d).count()) + "s";
  if (d % milliseconds(1) == nanoseconds(0)) return std::to_string(duration_cast<milliseconds>(d).count()) + "ms";
  if (d % microseconds(1) == nanoseconds(0)) return std::to_string(duration_cast<microseconds>(d).count()) + "µs";
  return std::to_string(d.count()) + "ns";
}

Poster::Limits Poster::limits_for(const Endpoint& endpoint, const Configuration& c) noexcept {
  const std::size_t credits = endpoint.credits();
  return {credits, std::max(credits, endpoint.in_flight_limit()), c.progress_deadline, c.unreachable_backoff,
          c.unreachable_backoff_max};
}

}  // namespace dma::detail
