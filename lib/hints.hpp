// fi_getinfo with the hints of each Provider; shared by Endpoint::open and discover_domains.
#pragma once

#include "dma/configuration.hpp"
#include "dma/detail/fid.hpp"

#include <rdma/fabric.h>

#include <memory>
#include <string>
#include <system_error>

namespace dma::detail {

/// Sets the process-wide libfabric variables the library relies on (FI_AV_REMOVE_CLEANUP) and
/// those of ProcessSettings, once, before libfabric first initialises; never overrides a value
/// already set. After it, set_process_settings() refuses.
void prepare_environment() noexcept;

/// The first configured provider; tcp when none is.
Provider configured_provider(const Configuration& configuration) noexcept;

/// How progress waits on this provider: the configured wait mode, except busy_poll on shm, whose
/// completion queue has no wait object (fi_cq_open with FI_WAIT_FD is -FI_ENOSYS).
WaitMode progress_wait_mode(const Configuration& configuration) noexcept;

/// The provider's fi_info list for the configuration; on failure `what` names the step.
InfoList query_info(const Configuration& configuration, std::error_code& ec, std::string& what);

}  // namespace dma::detail
