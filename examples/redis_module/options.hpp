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

/// The bytes of DMA.GET copy buffers kept for reuse, by default.
inline constexpr std::uint64_t default_get_copy_cache = std::uint64_t{256} << 20;

/// The protocol's settings (dma::kv::ServerSettings: max-value, allow-any-fabric-host,
/// transfer-deadline-ms, confirm-gets, max-hello-bindings, hello-idle-seconds), and the module's own.
struct Options : dma::kv::ServerSettings {
  std::string config;  ///< a TOML file whose [dma-libfabric] table configures the service
  std::string bind = "127.0.0.1";
  bool bind_given = false;
  bool efa = false;
  std::size_t pool_threads = 2;  ///< 0: no pool, CRCs on the fabric thread
  bool hold_values = true;       ///< DMA.GET writes from the string DMA.SET stored
  /// Bytes all DMA.GET copies may hold at once; none: maxmemory/8, or default_get_copy_limit
  /// without maxmemory.
  std::optional<std::uint64_t> get_copy_limit;
  /// Bytes the DMA.GET copies of one client (one DMA.HELLO fabric address) may hold; none: a
  /// quarter of the total limit.
  std::optional<std::uint64_t> get_copy_client_limit;
  /// Bytes of DMA.GET copy buffers kept for reuse once their writes end (0: none kept).
  std::uint64_t get_copy_cache = default_get_copy_cache;

  /// The service's configuration: the TOML file's table, then these overrides. Throws
  /// dma::ConfigurationError for a bad file.
  dma::Configuration configuration() const;
};

/// Parses `key value` pairs; returns "" or what was wrong, naming the key and the value.
std::string parse_options(std::span<const std::string_view> arguments, Options& options);

}  // namespace dma_module
