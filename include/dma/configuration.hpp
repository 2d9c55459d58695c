// What a service or target opens: provider, device, bind address, credits, progress knobs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
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

/// A deadline that never fires: Configuration::transfer_deadline or TransferRequest::deadline set
/// to it means the transfer waits for the provider as long as the provider takes.
inline constexpr std::chrono::nanoseconds no_deadline = std::chrono::nanoseconds::max();

struct Configuration {
  /// Providers in preference order. Only the first is used, as in the Rust crate; empty means tcp.
  std::vector<Provider> providers{Provider::tcp};
  /// Domain names (see discover_domains()); the first pins the endpoint to that device.
  std::vector<std::string> interfaces;
  /// Source node for fi_getinfo with FI_SOURCE, e.g. "127.0.0.1" (tcp only).
  std::optional<std::string> bind;
  /// tcp: the port to listen on at `bind` (a Target that peers must find again after a restart);
  /// none lets the system choose a free one.
  std::optional<std::uint16_t> port;
  /// Transfers posted at once to one peer; none means 64. Clamped to the provider's tx size and
  /// the CQ size. All peers together post at most min(tx size, CQ size) at once, so a peer that
  /// stops answering holds only its own credits.
  std::optional<std::size_t> max_in_flight;
  /// Advice for sizing the Pool; the library does not read it.
  std::optional<std::size_t> crc_pool_threads;
  /// The longest a peer's transfers may keep getting -FI_EAGAIN before the peer is marked
  /// unreachable and its queued transfers fail (errc::connection_refused when it never connected,
  /// errc::progress_deadline when its connection stopped taking posts). Also the grace period a
  /// shutdown gives posted transfers before it closes the endpoint.
  std::chrono::nanoseconds progress_deadline = std::chrono::seconds(1);
  /// How long a transfer may take from acceptance to completion, queued and posted, before it
  /// fails with errc::timed_out (== std::errc::timed_out). TransferRequest::deadline overrides it
  /// per transfer; no_deadline turns it off. A posted transfer is handed back by replacing the
  /// endpoint (docs/design.md), so its memory is never touched after its completion has run.
  std::chrono::nanoseconds transfer_deadline = std::chrono::seconds(30);
  /// After a peer is marked unreachable (refused connection, stuck posts, a transfer posted to it
  /// past its deadline), its transfers fail at once with errc::peer_unreachable for this long.
  /// Each marking in a row doubles it, up to unreachable_backoff_max; a completed transfer resets
  /// it. The first transfer after the back-off reconnects on a fresh address-vector entry.
  std::chrono::nanoseconds unreachable_backoff = std::chrono::seconds(1);
  std::chrono::nanoseconds unreachable_backoff_max = std::chrono::seconds(30);

  // Beyond the Rust crate.
  /// Completion queue entries to ask for; 0 means twice the per-peer cap, at least 1024.
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
