// fi_getinfo with the hints of each Provider; shared by Endpoint::open and discover_domains.
#pragma once

#include "dma/configuration.hpp"
#include "dma/detail/fid.hpp"

#include <rdma/fabric.h>

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

namespace dma::detail {

/// Sets the process-wide libfabric variables the library relies on (FI_AV_REMOVE_CLEANUP) and
/// those of ProcessSettings, once, before libfabric first initialises; never overrides a value
/// already set. After it, set_process_settings() refuses.
void prepare_environment() noexcept;

// What differs between the libfabric versions the library runs on (1.17, 2.1, 2.6), each named
// after what it is; docs/notes/libfabric-versions.md has the measurements behind them.

/// Before 1.18 tcp has no RDM endpoint of its own: tcp RDM is rxm over tcp (`tcp;ofi_rxm`).
/// From 1.18 on it is the native tcp provider (FI_PROTO_XNET), whose wire rxm cannot read.
bool tcp_rdm_is_rxm_only(std::uint32_t version) noexcept;

/// rxm's connection request carries its eager limit, and rxm refuses a peer whose limit differs.
/// On 1.17 the limit is a setting of its own (FI_OFI_RXM_EAGER_LIMIT, default 16384) that may
/// stay above the bounce-buffer size over tcp; in 2.x it is the buffer size itself.
bool rxm_eager_limit_is_its_own_setting(std::uint32_t version) noexcept;

/// The first configured provider; tcp when none is.
Provider configured_provider(const Configuration& configuration) noexcept;

/// How progress waits on this provider: the configured wait mode, except busy_poll on shm, whose
/// completion queue has no wait object (fi_cq_open with FI_WAIT_FD is -FI_ENOSYS).
WaitMode progress_wait_mode(const Configuration& configuration) noexcept;

/// The provider's fi_info list for the configuration; on failure `what` names the step.
InfoList query_info(const Configuration& configuration, std::error_code& ec, std::string& what);

}  // namespace dma::detail
