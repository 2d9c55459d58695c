// fi_getinfo with the hints of each Provider; shared by Endpoint::open and discover_domains.
#pragma once

#include "dma/configuration.hpp"
#include "dma/detail/fid.hpp"

#include <rdma/fabric.h>

#include <memory>
#include <string>
#include <system_error>

namespace dma::detail {

/// Sets the process-wide libfabric variables the library relies on (FI_AV_REMOVE_CLEANUP),
/// once, before libfabric first initialises; never overrides a value already set.
void prepare_environment() noexcept;

/// The provider's fi_info list for the configuration; on failure `what` names the step.
InfoList query_info(const Configuration& configuration, std::error_code& ec, std::string& what);

}  // namespace dma::detail
