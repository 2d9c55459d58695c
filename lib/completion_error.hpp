// What an error completion means: the classes of libfabric errors the engine treats alike, and
// the detail text a failed transfer carries.
#pragma once

#include <rdma/fi_eq.h>

#include <string>

namespace dma::detail {

/// The connection broke under the transfer: the tcp provider flushes a torn-down connection's
/// transfers with these (and a peer that rejected one transfer tears its connection down too).
bool connection_error(int err) noexcept;

/// The provider says the peer cannot be reached at all: back off as after a refused connection.
bool unreachable_error(int err) noexcept;

/// "completion error: <fi_strerror> (err=…, prov_errno=…)", plus fi_cq_strerror's text when
/// describe_provider is set. rxm reads the endpoint's state to format an entry, so it must not be
/// set for an entry a closed endpoint returned. err_data stays valid only until the next read of
/// cq: call this at once.
std::string error_detail(fid_cq* cq, const fi_cq_err_entry& entry, bool describe_provider);

}  // namespace dma::detail
