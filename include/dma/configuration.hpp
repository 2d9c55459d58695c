// What a service or target opens: provider, device, bind address, credits, progress knobs.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dma {

/// The libfabric providers the library supports.
enum class Provider {
  tcp,         ///< software RMA over sockets (tcp;ofi_rxm before libfabric 1.18); no RDMA hardware
  efa_direct,  ///< AWS EFA, pinned to the device-RMA `efa-direct` fabric
};

/// "tcp" or "efa-direct": the name in configuration files and on command lines.
std::string_view to_string(Provider provider) noexcept;
/// The value for fi_fabric_attr::prov_name: "tcp" or "efa".
std::string_view provider_name(Provider provider) noexcept;
/// The value for fi_fabric_attr::name: "efa-direct" for efa_direct, none otherwise.
std::optional<std::string_view> fabric_name(Provider provider) noexcept;

/// How the service waits for completions while transfers are outstanding.
enum class WaitMode {
  fd,         ///< arm the completion queue's wait fd as soon as it is drained (lowest CPU)
  adaptive,   ///< poll for up to spin_budget first, then arm the wait fd (the default)
  busy_poll,  ///< never arm the fd: poll on the executor while work is outstanding (lowest latency)
};

std::string_view to_string(WaitMode mode) noexcept;

struct Configuration {
  /// Providers in preference order. Only the first is used, as in the Rust crate; empty means tcp.
  std::vector<Provider> providers{Provider::tcp};
  /// Domain names (see discover_domains()); the first pins the endpoint to that device.
  std::vector<std::string> interfaces;
  /// Source node for fi_getinfo with FI_SOURCE, e.g. "127.0.0.1" (tcp only).
  std::optional<std::string> bind;
  /// Transfers posted at once; none means 64. Clamped to the provider's tx size and the CQ size.
  std::optional<std::size_t> max_in_flight;
  /// Advice for sizing the Pool; the library does not read it.
  std::optional<std::size_t> crc_pool_threads;
  /// The longest one transfer may keep getting -FI_EAGAIN before it fails with progress_deadline.
  std::chrono::nanoseconds progress_deadline = std::chrono::seconds(1);

  // Beyond the Rust crate.
  /// Completion queue entries to ask for; 0 means twice the in-flight cap (at least 64).
  std::size_t cq_size = 0;
  WaitMode wait_mode = WaitMode::adaptive;
  /// adaptive: how long to keep polling the CQ after a drain before arming the wait fd.
  std::chrono::nanoseconds spin_budget = std::chrono::microseconds(50);
  /// While work is outstanding, re-check the CQ this often even without a wake-up (a backstop
  /// for wake-ups lost between fi_trywait and arming the fd; see docs/design.md).
  std::chrono::nanoseconds backstop_interval = std::chrono::milliseconds(10);
  /// Completion queue entries read per fi_cq_read call.
  std::size_t cq_batch = 16;

  /// Register every local operand (FI_MR_LOCAL) even where the provider does not need it, e.g. on
  /// tcp: runs the registration and cache path that efa-direct uses, on a laptop.
  bool force_local_registration = false;
  /// Bounds on the registration cache's CacheableSpan entries per domain (least recently used
  /// first out; MemoryRegion pins are never evicted). 0 means unbounded.
  std::size_t registration_cache_entries = 1024;
  std::size_t registration_cache_bytes = std::size_t{16} << 30;
};

/// The in-flight cap the seed computes: max(1, max_in_flight or 64), clamped to a non-zero tx size.
std::size_t requested_in_flight(const Configuration& configuration, std::size_t provider_tx_size) noexcept;

}  // namespace dma
