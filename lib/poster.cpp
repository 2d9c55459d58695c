#include "poster.hpp"

namespace dma::detail {

std::string duration_text(std::chrono::nanoseconds d) {
  using namespace std::chrono;
  if (d % seconds(1) == nanoseconds(0)) return std::to_string(duration_cast<seconds>(d).count()) + "s";
  if (d % milliseconds(1) == nanoseconds(0)) return std::to_string(duration_cast<milliseconds>(d).count()) + "ms";
  if (d % microseconds(1) == nanoseconds(0)) return std::to_string(duration_cast<microseconds>(d).count()) + "µs";
  return std::to_string(d.count()) + "ns";
}

}  // namespace dma::detail
