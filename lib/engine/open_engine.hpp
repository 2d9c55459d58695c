// One endpoint's engine, for Engine::create (lib/rails/), which opens one of these per endpoint.
#pragma once

#include <dma/configuration.hpp>
#include <dma/detail/engine.hpp>

#include <asio/any_io_executor.hpp>

#include <memory>
#include <string>
#include <system_error>

namespace dma::detail {

/// Opens one endpoint's engine; on failure returns null, sets ec and names the failing step in
/// `what`.
std::shared_ptr<Engine> open_engine(const asio::any_io_executor& executor, const Configuration& configuration,
                                    std::error_code& ec, std::string& what);

}  // namespace dma::detail
