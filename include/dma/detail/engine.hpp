// The engine behind every service: credits, per-peer queues, peers, the CQ watcher, deadlines. Everything
// it does to libfabric runs on one strand. The typed front ends (asynchronous::FabricService and the
// callback FabricService) talk to it through this interface; the implementation is in lib/.
#pragma once

#include <dma/configuration.hpp>
#include <dma/detail/operation.hpp>
#include <dma/endpoint.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/strand.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace dma {

/// Counters a service keeps; read them with FabricService::metrics().
struct Metrics {
  std::uint64_t posted = 0;         ///< transfers handed to the provider
  std::uint64_t completed = 0;      ///< transfers completed successfully
  std::uint64_t failed = 0;         ///< transfers completed with an error
  std::uint64_t eagain = 0;         ///< posts the provider refused with -FI_EAGAIN
  std::uint64_t cq_reads = 0;       ///< fi_cq_read calls that returned entries
  std::uint64_t fd_wakeups = 0;     ///< wake-ups through the CQ's wait fd
  std::uint64_t spin_hits = 0;      ///< completions found while spinning before arming
  std::uint64_t armed_late = 0;     ///< completions found right after arming the fd
  std::uint64_t backstop_hits = 0;  ///< completions the backstop found after the fd stayed silent an interval (~0)
  std::uint64_t joined_pass = 0;    ///< transfers submitted from inside a reaper pass, posted by that pass
  std::uint64_t timed_out = 0;      ///< transfers that failed at their deadline (errc::timed_out)
  std::uint64_t cancelled = 0;      ///< transfers cancelled through their handler's slot
  std::uint64_t peers_marked_unreachable = 0;  ///< times a peer was marked unreachable (back-off began)
  std::uint64_t reconnects = 0;                ///< fresh address-vector entries for a peer whose connection broke
  std::uint64_t endpoint_replacements = 0;     ///< endpoints replaced to hand back posted transfers
  std::uint64_t context_less_errors = 0;       ///< error entries without an operation (endpoint faults)
  std::uint64_t queue_errors = 0;              ///< fi_cq_read failures that name no operation
  std::uint64_t registrations = 0;             ///< fi_mr_reg calls for local operands and pinned regions
  std::uint64_t cache_hits = 0;                ///< operands served by a cached registration
  std::uint64_t cache_misses = 0;              ///< operands that found none
  std::uint64_t cache_evictions = 0;           ///< CacheableSpan entries pushed out by the cache limits
  std::size_t cache_entries = 0;               ///< cached registrations in this domain now
  std::size_t cache_bytes = 0;                 ///< bytes under cached registrations now (pins included)
};

/// Where a completion stands in the completion-queue drain that delivers it; see
/// asynchronous::drain_position().
enum class DrainPosition : std::uint8_t {
  none,  ///< not delivered by a drain running on this thread (a cancellation, a refused post, shutdown)
  more,  ///< another completion of the same drain is delivered right after this one
  last,  ///< the drain's last completion (an error completion also ends a batch)
};

namespace detail {

/// The position of the completion a drain on the calling thread is delivering (none outside one).
DrainPosition drain_position() noexcept;

class Engine {
 public:
  /// Opens the endpoint; on failure returns null, sets ec and names the failing step in `what`.
  static std::shared_ptr<Engine> create(const asio::any_io_executor& executor, const Configuration& configuration,
                                        std::error_code& ec, std::string& what);
  virtual ~Engine() = default;

  /// Accepts one transfer (any thread); it completes exactly once through its functions->complete.
  virtual void submit(Operation* op) = 0;
  /// Cancels op (any thread): a queued one completes at once, a posted one once the reclaimer made
  /// the provider hand it back (or when it completes first).
  virtual void cancel(Operation* op, std::uint64_t sequence) = 0;
  /// A sequence number for the next operation (any thread).
  virtual std::uint64_t next_sequence() noexcept = 0;
  /// Inserts a peer's address for client_id; call on strand() only.
  virtual std::error_code insert_peer(std::uint64_t client_id, std::span<const std::uint8_t> address) = 0;
  /// Registers [base, base + length) for local access and tracks it in the registration cache as
  /// a pin, keeping keep_alive until the MR is closed; nothing to do where the provider needs no
  /// local registration. Call on strand() only.
  virtual std::error_code pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive) = 0;
  /// Unbinds client_id from its peer (any thread); the address entry goes once no client and no
  /// accepted transfer uses it.
  virtual void remove_peer(std::uint64_t client_id) = 0;
  /// Fails what was never posted, waits (bounded by progress_deadline) for what was, then closes
  /// the endpoints, which hands back the rest (errc::shutdown).
  virtual void shutdown() = 0;

  virtual std::size_t outstanding() const noexcept = 0;
  virtual const std::vector<std::uint8_t>& local_address() const noexcept = 0;
  virtual EndpointInfo describe() const = 0;
  virtual Metrics metrics() const noexcept = 0;
  virtual const Configuration& configuration() const noexcept = 0;
  /// The strand every libfabric call of this engine runs on (for setup posts, not the hot path).
  virtual asio::any_io_executor strand() const noexcept = 0;
};

}  // namespace detail
}  // namespace dma
