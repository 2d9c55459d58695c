// The coordinator of a service's several endpoints (Configuration::endpoints > 1): it owns one
// engine per endpoint and stands in front of them behind the entry points of one engine
// (dma::detail::Engine). It builds each endpoint's configuration, sends a transfer to the least
// loaded endpoint or stripes it across all of them (stripe.hpp), and fans peers, registrations,
// cancellations and shutdown out to every endpoint. It calls the engines only through Engine.
#pragma once

#include "stripe.hpp"

#include <dma/configuration.hpp>
#include <dma/detail/engine.hpp>

#include <asio/any_io_executor.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace dma::detail {

class Rails final : public Engine, public std::enable_shared_from_this<Rails> {
 public:
  /// Opens configuration.endpoints engines (2 to max_endpoints); on failure shuts down the ones
  /// it opened, returns null, sets ec and names the endpoint and step that failed in `what`.
  static std::shared_ptr<Rails> open(const asio::any_io_executor& executor, const Configuration& configuration,
                                     std::error_code& ec, std::string& what);

  /// Endpoint k's configuration: the k-th of several interfaces (one per NIC) first, and no
  /// fixed port but on the first.
  static Configuration rail_configuration(const Configuration& configuration, std::size_t k);

  Rails(std::vector<std::shared_ptr<Engine>> rails, const Configuration& configuration);

  void submit(Operation* op) override;
  void warm_up(Operation* op) override;
  void cancel(Operation* op, std::uint64_t sequence, CancelScope scope) override;
  std::uint64_t next_sequence() noexcept override { return sequence_.fetch_add(1, std::memory_order_relaxed) + 1; }
  void insert_peer(std::uint64_t client_id, std::vector<std::uint8_t> address, Done done) override;
  void pin(std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive, Done done) override;
  void remove_peer(std::uint64_t client_id) override;
  void shutdown() override;

  std::size_t outstanding() const noexcept override;
  const std::vector<std::uint8_t>& local_address() const noexcept override { return rails_.front()->local_address(); }
  std::vector<std::vector<std::uint8_t>> endpoint_addresses() const override;
  std::size_t endpoints() const noexcept override { return rails_.size(); }
  EndpointInfo describe() const override { return rails_.front()->describe(); }
  Metrics metrics() const noexcept override;
  const Configuration& configuration() const noexcept override { return configuration_; }

  // ---- for the stripes (stripe.hpp) ----------------------------------------------------------
  Engine& rail(std::size_t k) noexcept { return *rails_[k]; }
  /// Tracks a stripe for cancel() until it is left again.
  void enter(StripeJoin& join) noexcept;
  void leave(StripeJoin& join) noexcept;

 private:
  static errc resolve_here(Operation& op);
  // The least loaded endpoint, for a transfer that goes to one.
  Engine& least_loaded() const noexcept;
  void pin_from(std::size_t k, std::uintptr_t base, std::size_t length, std::shared_ptr<void> keep_alive, Done done);

  std::vector<std::shared_ptr<Engine>> rails_;
  Configuration configuration_;
  std::size_t stripe_threshold_;
  std::atomic<std::uint64_t> sequence_{0};
  std::mutex stripes_mutex_;
  StripeJoin* stripes_ = nullptr;  ///< the stripes out, newest first, for cancel()
};

}  // namespace dma::detail
