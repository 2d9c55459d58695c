// What a libfabric error completion says, apart from any transfer: the classes of errors that
// mean a broken connection or an unreachable peer, and the detail text an entry carries. Pure:
// the Target formats its error entries with it, the engine sorts its transfers' failures on it
// (completion_error.hpp).
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
