#include "completion_error.hpp"

#include <dma/error.hpp>

#include <asio/error.hpp>

#include <rdma/fi_errno.h>

#include <cerrno>

namespace dma::detail {

bool connection_error(int err) noexcept {
  return err == FI_ECANCELED || err == FI_ENOTCONN || err == FI_ECONNRESET || err == FI_ECONNABORTED || err == EPIPE ||
         err == FI_ESHUTDOWN;
}

bool unreachable_error(int err) noexcept { return err == FI_EHOSTUNREACH || err == FI_ENETUNREACH; }

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

std::string error_detail(fid_cq* cq, const fi_cq_err_entry& entry, bool describe_provider) {
  std::string detail = "completion error: " + std::string(fi_strerror(entry.err)) +
                       " (err=" + std::to_string(entry.err) + ", prov_errno=" + std::to_string(entry.prov_errno) + ")";
  if (!describe_provider) return detail;
  char text[256] = {};
  const char* provider_text = fi_cq_strerror(cq, entry.prov_errno, entry.err_data, text, sizeof text);
  if (provider_text != nullptr && *provider_text != '\0') detail += "; provider: " + std::string(provider_text);
  return detail;
}

}  // namespace dma::detail
