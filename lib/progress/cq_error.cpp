#include "cq_error.hpp"

#include <rdma/fi_errno.h>

#include <cerrno>

namespace dma::detail {

bool connection_error(int err) noexcept {
  return err == FI_ECANCELED || err == FI_ENOTCONN || err == FI_ECONNRESET || err == FI_ECONNABORTED || err == EPIPE ||
         err == FI_ESHUTDOWN;
}

bool unreachable_error(int err) noexcept { return err == FI_EHOSTUNREACH || err == FI_ENETUNREACH; }

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
