#include "completion_error.hpp"

#include <dma/error.hpp>

#include <asio/error.hpp>

namespace dma::detail {

std::error_code doom_error(Doom doom) noexcept {
  switch (doom) {
    case Doom::deadline:
      return errc::timed_out;
    case Doom::cancelled:
      return asio::error::operation_aborted;
    default:
      return errc::shutdown;
  }
}

std::string doom_detail(const Operation& op) {
  const std::string handed_back = "; closing its endpoint handed it back";
  const OperationState& s = state(op);
  switch (s.doom) {
    case Doom::deadline:
      return "posted, and not completed within its deadline of " +
             duration_text(std::chrono::duration_cast<std::chrono::nanoseconds>(s.deadline - s.accepted)) + handed_back;
    case Doom::cancelled:
      return "cancelled while posted" + handed_back;
    default:
      return "the service closed while it was posted" + handed_back;
  }
}

ErrorSort sort_error(int err, Doom doom) noexcept {
  if (doom != Doom::none) return {doom_error(doom), ErrorSort::PeerFate::untouched};
  // A broken connection says nothing of the peer's health (a rejected transfer tears the
  // connection down too): no back-off, the next transfer reconnects at once.
  if (connection_error(err)) return {errc::connection_lost, ErrorSort::PeerFate::reconnect};
  if (unreachable_error(err)) return {fabric_error(err), ErrorSort::PeerFate::unreachable};
  return {fabric_error(err), ErrorSort::PeerFate::untouched};
}

}  // namespace dma::detail
