// The engine behind every service: credits, per-peer queues, peers, the CQ watcher, deadlines. Everything
// it does to libfabric runs on one strand. The typed front ends (asynchronous::FabricService and the
// callback FabricService) talk to it through this interface; the implementation is in lib/.
#pragma once

#include <dma/configuration.hpp>
#include <dma/detail/cancel_scope.hpp>
#include <dma/detail/operation.hpp>
#include <dma/endpoint.hpp>
#include <dma/export.hpp>
#include <dma/metrics.hpp>

#include <asio/any_io_executor.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
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
DMA_EXPORT DrainPosition drain_position() noexcept;

/// What a service's front end talks to: one endpoint's engine (lib/engine/), or the coordinator
/// of several endpoints (lib/rails/), behind the same entry points.
class Engine {
 public:
  /// What insert_peer() and pin() call when they are done: the first error, or none.
  using Done = std::function<void(std::error_code)>;

  /// Opens Configuration::endpoints endpoints (1 to 16): one engine, or the coordinator of
  /// several. On failure returns null, sets ec and names the failing step in `what`.
  DMA_EXPORT static std::shared_ptr<Engine> create(const asio::any_io_executor& executor,
                                                   const Configuration& configuration, std::error_code& ec,
                                                   std::string& what);
  virtual ~Engine() = default;

  /// Accepts one transfer (any thread); it completes exactly once through its functions->complete.
  /// With several endpoints, the operand is resolved here, on the calling thread; a transfer of
  /// at least Configuration::stripe_threshold bytes is striped across them, any other goes to the
  /// least loaded one.
  virtual void submit(Operation* op) = 0;
  /// As submit(), for add_peer()'s connection warm-up (a write of no bytes): with several
  /// endpoints, one from each, joined into op's one completion.
  virtual void warm_up(Operation* op) = 0;
  /// Cancels op (any thread): a queued one completes at once; a posted one, when scope allows it,
  /// once the reclaimer made the provider hand it back (or when it completes first).
  virtual void cancel(Operation* op, std::uint64_t sequence, CancelScope scope) = 0;
  /// A sequence number for the next operation (any thread).
  virtual std::uint64_t next_sequence() noexcept = 0;
  /// Inserts a peer's address for client_id on every endpoint (any thread); done runs once, on
  /// an endpoint's strand, when all have.
  virtual void insert_peer(std::uint64_t client_id, std::vector<std::uint8_t> address, Done done) = 0;
  /// Registers [base, base + length) for local access on every endpoint's domain and tracks it
  /// in the registration cache as a pin, keeping keep_alive until the MRs are closed; nothing to
  /// do where the provider needs no local registration. Any thread; the first error ends it, and
  /// done runs once, on an endpoint's strand.
  virtual void pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive, Done done) = 0;
  /// Unbinds client_id from its peer (any thread); the address entry goes once no client and no
  /// accepted transfer uses it.
  virtual void remove_peer(std::uint64_t client_id) = 0;
  /// Fails what was never posted, waits (bounded by progress_deadline) for what was, then closes
  /// the endpoints, which hands back the rest (errc::shutdown).
  virtual void shutdown() = 0;

  /// Transfers accepted and not yet completed, over every endpoint.
  virtual std::size_t outstanding() const noexcept = 0;
  /// The first endpoint's fabric address.
  virtual const std::vector<std::uint8_t>& local_address() const noexcept = 0;
  /// Every endpoint's fabric address, in order.
  virtual std::vector<std::vector<std::uint8_t>> endpoint_addresses() const = 0;
  /// How many endpoints are open.
  virtual std::size_t endpoints() const noexcept = 0;
  /// The first endpoint's provider, attributes and limits.
  virtual EndpointInfo describe() const = 0;
  /// The counters summed over every endpoint.
  virtual Metrics metrics() const noexcept = 0;
  virtual const Configuration& configuration() const noexcept = 0;
};

}  // namespace detail
}  // namespace dma
