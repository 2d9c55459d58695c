// The module's arguments (`--loadmodule dma-module.so key value ...`), parsed apart from any server
// so the parser can be tested alone.
#pragma once

#include <dma/kv/protocol.hpp>

#include <dma/configuration.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace dma_module {

/// The total DMA.GET copy limit of a server without maxmemory.
inline constexpr std::uint64_t default_get_copy_limit = std::uint64_t{1} << 30;

struct Options {
  std::string config;  ///< a TOML file whose [dma-libfabric] table configures the service
  std::string bind = "127.0.0.1";
  bool bind_given = false;
  bool efa = false;
  std::size_t max_value = std::size_t{16} << 20;
  bool allow_any_fabric_host = false;
  std::size_t pool_threads = 2;                       ///< 0: no pool, CRCs on the fabric thread
  std::uint64_t transfer_deadline_ms = 0;             ///< 0: the configuration's
  bool hold_values = true;                            ///< DMA.GET writes from the string DMA.SET stored
  std::optional<dma::kv::Confirmation> confirm_gets;  ///< none: auto, from the endpoint
  /// Bytes all DMA.GET copies may hold at once; none: maxmemory/8, or default_get_copy_limit
  /// without maxmemory.
  std::optional<std::uint64_t> get_copy_limit;
  /// Bytes the DMA.GET copies of one client (one DMA.HELLO fabric address) may hold; none: a
  /// quarter of the total limit.
  std::optional<std::uint64_t> get_copy_client_limit;
  /// DMA.HELLO bindings at once (a HELLO beyond it drops the least recently used one no
  /// connection holds, or is refused).
  std::size_t max_hello_bindings = 65536;
  /// Seconds a binding stays after the connection that sent its HELLO closed and its last use.
  std::uint64_t hello_idle_seconds = 300;

  /// The service's configuration: the TOML file's table, then these overrides. Throws
  /// dma::ConfigurationError for a bad file.
  dma::Configuration configuration() const;
};

/// Parses `key value` pairs; returns "" or what was wrong, naming the key and the value.
std::string parse_options(std::span<const std::string_view> arguments, Options& options);

}  // namespace dma_module
