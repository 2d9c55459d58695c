// The engine behind every service: credits, per-peer queues, peers, the CQ watcher, deadlines. Everything
// it does to libfabric runs on one strand. The typed front ends (asynchronous::FabricService and the
// callback FabricService) talk to it through this interface; the implementation is in lib/.
#pragma once

#include <dma/configuration.hpp>
#include <dma/detail/cancel_scope.hpp>
#include <dma/detail/operation.hpp>
#include <dma/endpoint.hpp>
#include <dma/metrics.hpp>

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
  /// Cancels op (any thread): a queued one completes at once; a posted one, when scope allows it,
  /// once the reclaimer made the provider hand it back (or when it completes first).
  virtual void cancel(Operation* op, std::uint64_t sequence, CancelScope scope) = 0;
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
