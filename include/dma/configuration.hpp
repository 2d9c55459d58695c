/// @file
/// What a service or target opens: provider, device, bind address, credits, progress knobs; and
/// how to load it from the `[dma-libfabric]` section of a TOML file.
#pragma once

#include <dma/export.hpp>
#include <dma/log.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace dma {

/// The libfabric providers the library supports.
enum class Provider {
  tcp,         ///< software RMA over sockets (tcp;ofi_rxm before libfabric 1.18); no RDMA hardware
  efa_direct,  ///< AWS EFA, pinned to the device-RMA `efa-direct` fabric
  shm,         ///< peers on the same host, through shared memory and cross-memory attach; its completion
               ///< queue has no wait fd, so services and targets on it always busy-poll
};

/// Which wire protocol a tcp endpoint speaks. libfabric before 1.18 has only rxm over tcp
/// (`tcp;ofi_rxm`); from 1.18 on tcp RDM is the native tcp provider, and rxm is still there. The
/// two cannot connect to each other: a peer on libfabric 1.17 refuses native tcp's connection
/// request. Both ends must speak the same one (docs/configuration.md, "libfabric versions").
enum class TcpProtocol {
  automatic,  ///< what libfabric offers first: native tcp from 1.18 on, rxm before (the default)
  native,     ///< the native tcp provider (libfabric 1.18 and later only)
  rxm,        ///< rxm over tcp, as libfabric 1.17 speaks it: to reach peers on 1.17 from 1.18 and later
};

/// How the service (and a Target) waits for completions while transfers are outstanding.
enum class WaitMode {
  fd,         ///< arm the completion queue's wait fd as soon as it is drained (lowest CPU)
  adaptive,   ///< poll for up to spin_budget first, then arm the wait fd (the default)
  busy_poll,  ///< never arm the fd: poll on the executor while work is outstanding (lowest latency)
};

/// The tcp protocol's name in configuration files: "auto", "native" or "rxm".
DMA_EXPORT std::string_view to_string(TcpProtocol protocol) noexcept;
/// The provider's name in configuration files and on command lines: "tcp", "efa-direct" or "shm".
DMA_EXPORT std::string_view to_string(Provider provider) noexcept;
/// The wait mode's name in configuration files and on command lines: "fd", "adaptive" or
/// "busy-poll".
DMA_EXPORT std::string_view to_string(WaitMode mode) noexcept;

/// A deadline that never fires: Configuration::transfer_deadline or TransferRequest::deadline set
/// to it means the transfer waits for the provider as long as the provider takes.
inline constexpr std::chrono::nanoseconds no_deadline = std::chrono::nanoseconds::max();

/// Parses the name to_string() prints, exactly (case-sensitive). Specialised for Provider and
/// WaitMode; the result is empty for any other text.
template <typename Enum>
std::optional<Enum> from_string(std::string_view text) noexcept = delete;
/// "tcp", "efa-direct" or "shm".
template <>
DMA_EXPORT std::optional<Provider> from_string<Provider>(std::string_view text) noexcept;
/// "fd", "adaptive" or "busy-poll".
template <>
DMA_EXPORT std::optional<WaitMode> from_string<WaitMode>(std::string_view text) noexcept;
/// "auto", "native" or "rxm".
template <>
DMA_EXPORT std::optional<TcpProtocol> from_string<TcpProtocol>(std::string_view text) noexcept;

/// The value for fi_fabric_attr::prov_name: "tcp", "efa" or "shm".
DMA_EXPORT std::string_view provider_name(Provider provider) noexcept;
/// The value for fi_fabric_attr::name: "efa-direct" for efa_direct, none otherwise.
DMA_EXPORT std::optional<std::string_view> fabric_name(Provider provider) noexcept;

/// Everything a FabricService or Target needs to open its endpoint and drive progress. A plain
/// aggregate: set fields in code, or load them from TOML with from_toml(). The defaults are the
/// Rust crate's where it has the field; docs/configuration.md lists every field with its key,
/// type, default and allowed range.
struct DMA_EXPORT Configuration {
  /// The TOML table from_toml() reads when no section is given.
  static constexpr std::string_view default_section = "dma-libfabric";

  /// Providers in preference order. Only the first is used, as in the Rust crate; empty means tcp.
  std::vector<Provider> providers{Provider::tcp};
  /// Domain names (see discover_domains()) that pin endpoints to devices: endpoint k of a service
  /// takes interfaces[k % interfaces.size()] (see endpoints). With one endpoint (the default, and
  /// always in a Target) that is the first; the others are not used. Empty: the first domain
  /// libfabric offers, for every endpoint. Serve several devices with one endpoint per interface,
  /// or with one service per domain.
  std::vector<std::string> interfaces;
  /// Source node for fi_getinfo with FI_SOURCE, e.g. "127.0.0.1": the address a tcp endpoint
  /// listens on. Leave it unset for efa-direct. shm ignores it: its addresses are names in
  /// /dev/shm, and a node would give every process's first endpoint the same one.
  std::optional<std::string> bind;
  /// tcp: the port to listen on at `bind` (a Target that peers must find again after a restart);
  /// none lets the system choose a free one. shm: a fixed name for the endpoint (one endpoint per
  /// port and host, like a tcp port); none names it after the process id and 64 random bits.
  std::optional<std::uint16_t> port;
  /// tcp: the wire protocol (see TcpProtocol). Set rxm on libfabric 1.18 and later to serve or
  /// reach peers whose libfabric is 1.17; native on 1.17 is refused when the endpoint opens.
  TcpProtocol tcp_protocol = TcpProtocol::automatic;
  /// Transfers posted at once to one peer; none means 64. Clamped to the provider's tx size and
  /// the CQ size. All peers together post at most min(tx size, CQ size) at once, so a peer that
  /// stops answering holds only its own credits.
  std::optional<std::size_t> max_in_flight;
  /// How many threads the application should give the Pool of a callback FabricService. The
  /// library never reads it (as in the Rust crate): it is carried so that one configuration file
  /// can size the Pool too, e.g. `std::make_shared<dma::Pool>(configuration.crc_pool_threads.value_or(1))`.
  std::optional<std::size_t> crc_pool_threads;
  /// The longest a peer's transfers may keep getting -FI_EAGAIN before the peer is marked
  /// unreachable and its queued transfers fail (errc::connection_refused when it never connected,
  /// errc::connection_rejected when its address accepts TCP connections but libfabric never
  /// connected, errc::progress_deadline when its connection stopped taking posts). Also the grace period a
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
  /// The longest back-off, however many markings in a row.
  std::chrono::nanoseconds unreachable_backoff_max = std::chrono::seconds(30);

  // Beyond the Rust crate.
  /// Completion queue entries to ask for; 0 means twice the per-peer cap, at least 1024.
  std::size_t cq_size = 0;
  /// How progress waits for completions; see WaitMode.
  WaitMode wait_mode = WaitMode::adaptive;
  /// adaptive: how long to keep polling the CQ after a drain before arming the wait fd. Longer
  /// lowers latency under steady load and costs that much CPU after each burst.
  std::chrono::nanoseconds spin_budget = std::chrono::microseconds(50);
  /// While work is outstanding, re-check the CQ this often even without a wake-up (a backstop
  /// for wake-ups lost between fi_trywait and arming the fd; see docs/design.md).
  std::chrono::nanoseconds backstop_interval = std::chrono::milliseconds(10);
  /// Completion queue entries read per fi_cq_read call.
  std::size_t cq_batch = 16;
  /// A Target's queue of write notifications (writes with immediate data) that no waiter has
  /// taken yet, 1 to 2^20: allocated once when the Target opens. Past it notifications are
  /// dropped and counted, and the next waiter gets errc::notifications_lost in their place.
  std::size_t notification_queue = 4096;

  /// The most bytes one post carries; 0 (the default) means the provider's max_msg_size (about
  /// 1 GiB on EFA, 2^64 - 1 on tcp). A transfer longer than that, or with more buffers than the
  /// provider takes in one post, is split into several posts and still completes once. Lower it
  /// to bound what one post holds, or to run the segmented path on tcp.
  std::size_t max_segment_bytes = 0;
  /// The most posts of one segmented transfer in flight at once, 1 to 16.
  std::size_t segment_window = 8;

  /// Endpoints one service opens, 1 to 16 (multi-rail). Each has its own completion queue,
  /// credits and connections; endpoint k opens on interfaces[k % interfaces.size()] (one per NIC
  /// when there are as many interfaces as endpoints; all on the same one when there is one, or on
  /// the first domain offered when there is none). A transfer of at least stripe_threshold bytes
  /// is striped across all of them and completes once; a smaller one goes to the endpoint with
  /// the fewest transfers outstanding. Only the first endpoint binds Configuration::port.
  std::size_t endpoints = 1;
  /// The smallest transfer striped across the endpoints (with endpoints > 1).
  std::size_t stripe_threshold = std::size_t{1} << 20;

  /// efa-direct: how often the device resends a write that found the peer not ready to receive,
  /// 0 to 7, where 7 means for ever (libfabric's default). Only a write with immediate data
  /// can meet that, where the peer's Target must post a receive for each (libfabric 2.4 and
  /// later); a lower value turns a stalled Target into a failed write instead of a stuck one.
  /// Set with FI_OPT_EFA_RNR_RETRY before the endpoint is enabled; on a device that cannot change
  /// it the endpoint does not open. Ignored by tcp and shm.
  std::optional<std::size_t> efa_rnr_retry;

  /// Register every local operand (FI_MR_LOCAL) even where the provider does not need it, e.g. on
  /// tcp: runs the registration and cache path that efa-direct uses, on a laptop.
  bool force_local_registration = false;
  /// Most CacheableSpan entries the registration cache keeps per domain (least recently used
  /// first out; MemoryRegion pins are never evicted). 0 means unbounded.
  std::size_t registration_cache_entries = 1024;
  /// Most bytes of CacheableSpan registrations the cache keeps per domain. 0 means unbounded.
  std::size_t registration_cache_bytes = std::size_t{16} << 30;

  /// Receives this service's (or target's) log messages in place of the process-wide handler of
  /// set_log_handler(), which then hears nothing from it; empty (the default) means the
  /// process-wide one. It is called on the thread that opens the service (the endpoint's
  /// opening), then on the threads that run the service's executor, one message at a time per
  /// service (a handler shared by several services may be called concurrently), until the
  /// service's last transfer has completed, which may be after the service object is gone. Not
  /// read from TOML files, nor written by to_toml(): set it in code.
  LogHandler log_handler;

  /// Loads the configuration from `section` of the TOML file at `path`. A key that is absent
  /// keeps its default; an unknown key, a value of the wrong type or out of range, or a file that
  /// is not TOML is refused. `section` names a top-level table, or nested tables joined by dots
  /// ("app.dma"); empty means the document's root table. Throws ConfigurationError, whose message
  /// names the file, line, column and key.
  static Configuration from_toml(const std::filesystem::path& path, std::string_view section = default_section);
  /// As above; on failure sets `ec` (the open error, or std::errc::invalid_argument), puts the
  /// same message the exception would carry in `message`, and returns the defaults.
  static Configuration from_toml(const std::filesystem::path& path, std::string_view section, std::error_code& ec,
                                 std::string& message);
  /// Loads the configuration from TOML text; `origin` names it in error messages (a file name,
  /// "--config-text", …). Throws ConfigurationError.
  static Configuration from_toml_string(std::string_view text, std::string_view section = default_section,
                                        std::string_view origin = "<string>");
  /// As above, reporting a failure through `ec` and `message` instead of throwing.
  static Configuration from_toml_string(std::string_view text, std::string_view section, std::string_view origin,
                                        std::error_code& ec, std::string& message);

  /// The configuration as a TOML table named `section` (empty: bare keys), every key written,
  /// absent optionals as comments. from_toml_string() of the result gives back an equal
  /// configuration, log_handler aside (no file holds one).
  std::string to_toml(std::string_view section = default_section) const;

  /// Every key from_toml() accepts, in the order to_toml() writes them.
  static std::span<const std::string_view> toml_keys() noexcept;

  /// Field by field equality; log handlers are equal when one is a copy of the other.
  friend bool operator==(const Configuration&, const Configuration&) = default;
};

/// A configuration the library refused. what() is "<origin>:<line>:<column>: <key>: <problem>",
/// e.g. `tcp.toml:4:17: dma-libfabric.max_in_flight: expected an integer from 1 to 1048576, got 0`;
/// the parts are available on their own. code() is std::errc::invalid_argument, or the error
/// that kept the file from being read.
class DMA_EXPORT ConfigurationError : public std::system_error {
 public:
  /// An error at `line`:`column` (1-based; 0 when there is no position) of `origin`, about `key`
  /// (empty when the problem is not one key's, e.g. a TOML syntax error).
  ConfigurationError(std::error_code code, std::string origin, std::uint32_t line, std::uint32_t column,
                     std::string key, const std::string& problem);

  /// The file name or origin text the configuration came from.
  const std::string& origin() const noexcept { return origin_; }
  /// The 1-based line of the offending key or value; 0 when the problem has no position.
  std::uint32_t line() const noexcept { return line_; }
  /// The 1-based column of the offending key or value; 0 when the problem has no position.
  std::uint32_t column() const noexcept { return column_; }
  /// The full dotted key, e.g. "dma-libfabric.wait_mode"; empty for a problem that is no key's.
  const std::string& key() const noexcept { return key_; }
  /// The whole message: origin, position, key and problem.
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string origin_;
  std::uint32_t line_;
  std::uint32_t column_;
  std::string key_;
  std::string what_;
};

/// What libfabric reads once per process, from the environment, when the process opens its first
/// endpoint: it applies to every endpoint of the process, the library's and any other. Set it with
/// set_process_settings() before the first FabricService or Target opens. A variable the user has
/// already set in the environment is never overridden.
struct ProcessSettings {
  /// Size the tcp provider's pools for one-sided RMA, with settings that change nothing on the
  /// wire (a peer at libfabric's defaults still connects): on libfabric 1.17 rxm's bounce buffers
  /// of 1 KiB under its default eager limit (FI_OFI_RXM_BUFFER_SIZE=1024,
  /// FI_OFI_RXM_EAGER_LIMIT=16384) and 128 preposted receives (FI_OFI_RXM_MSG_RX_SIZE) instead of
  /// 4096 buffers of 16 KiB per endpoint (touched when it opens, never used by RMA);
  /// FI_UNIVERSE_SIZE=64, which sizes the completion ring under rxm (12 MiB per endpoint for
  /// libfabric's default of 1024); on 1.18 and later native tcp's message buffers of 1 KiB
  /// (FI_TCP_MAX_RX_SIZE=1024, 16 MiB at the first connection otherwise). What a Target and a
  /// service take with and without it: docs/performance.md, "Memory". Turn it off only when other
  /// code in the process uses libfabric messaging and wants these defaults (docs/configuration.md).
  bool slim_buffers = true;

  /// Field by field equality.
  friend bool operator==(const ProcessSettings&, const ProcessSettings&) = default;
};

/// Replaces the process settings. Returns false, and changes nothing, once the library has opened
/// an endpoint (or listed domains): libfabric has read its environment by then.
[[nodiscard]] DMA_EXPORT bool set_process_settings(const ProcessSettings& settings) noexcept;
/// The settings in force, or to be applied when the first endpoint opens.
DMA_EXPORT ProcessSettings process_settings() noexcept;

/// The in-flight cap the seed computes: max(1, max_in_flight or 64), clamped to a non-zero tx size.
DMA_EXPORT std::size_t requested_in_flight(const Configuration& configuration, std::size_t provider_tx_size) noexcept;

}  // namespace dma
