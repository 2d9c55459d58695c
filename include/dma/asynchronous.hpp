// dma::asynchronous::FabricService: the core, an Asio I/O object whose submit() takes any
// completion token. `co_await service.submit(request)` resumes when the transfer's CQ entry arrives.
#pragma once

#include <dma/advertisement.hpp>
#include <dma/checksum.hpp>
#include <dma/config.hpp>
#include <dma/configuration.hpp>
#include <dma/detail/block_pool.hpp>
#include <dma/detail/engine.hpp>
#include <dma/detail/handler.hpp>
#include <dma/detail/operand.hpp>
#include <dma/detail/transfer_op.hpp>
#include <dma/endpoint.hpp>
#include <dma/error.hpp>
#include <dma/memory_region.hpp>
#include <dma/transfer.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_allocator.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace dma {

namespace asynchronous {

/// Batching inline handlers. A completion handler bound to the service's own executor runs inline
/// in the completion-queue drain that found its transfer, and:
/// - a transfer it submits joins the running pass: it is accepted without a lock or a strand post
///   and posted with the drain's other resubmissions, in one burst (Metrics::joined_pass);
/// - drain_position() tells it whether another completion of the same drain follows
///   (DrainPosition::more) or this is the drain's last (DrainPosition::last). A handler that
///   gathers completions and acts on each batch at `last` therefore sees one batch per drain,
///   and what it submits then still joins the pass. Completions that no drain delivers (a
///   cancelled or refused transfer, shutdown) report DrainPosition::none: gather those with a
///   handler posted to the executor instead.
/// Call it from inside a completion handler only; anywhere else it returns DrainPosition::none.
inline DrainPosition drain_position() noexcept { return detail::drain_position(); }

/// The asynchronous fabric service: one endpoint (or several, Configuration::endpoints) whose
/// completions are watched by the caller's executor (the CQ's wait fd on the io_context's
/// reactor). Every asynchronous operation follows Asio's conventions: its completion signature
/// starts with std::error_code, it takes any completion token for that signature, and with no
/// token it uses the executor's default (asio::default_completion_token_t, e.g. set with
/// `as_default_on_t`), else asio::use_awaitable_t<Executor>.
///
/// Context is the caller's per-transfer context: it supplies the operand (dma::TransferContext,
/// see dma::Operands) and comes back by value in the Completion.
///
/// @par Thread Safety
/// @e Distinct @e objects: Safe.@n
/// @e Shared @e objects: submit(), add_peer(), remove_peer(), register_region() and the
/// observers (outstanding(), metrics(), describe(), local_address(), endpoint_addresses(),
/// endpoints(), is_open(), get_executor()) may be called concurrently from any threads. open(),
/// close(), the move operations and the destructor must not run concurrently with any other
/// member function on the same object.
template <TransferContext Context, typename Executor = asio::any_io_executor>
class FabricService {
 public:
  /// The executor the service's completions are watched on (Asio's name).
  using executor_type = Executor;
  /// The caller's per-transfer context type.
  using context_type = Context;
  /// What submit()'s completion handler is called with.
  using completion_signature = void(std::error_code, Completion<Context>);
  /// The token an operation uses when the caller names none: executor_type's default
  /// completion token, else asio::use_awaitable_t<executor_type>.
  using default_token_type = detail::default_token_t<executor_type>;

  /// The same service type on another executor type (Asio's rebind convention, used by
  /// `as_default_on_t`).
  template <typename OtherExecutor>
  struct rebind_executor {
    /// The rebound service type.
    using other = FabricService<Context, OtherExecutor>;
  };

  /// A closed service; open() it before submitting.
  explicit FabricService(const executor_type& executor) : executor_(executor) {}

  /// Opens the endpoint at once; throws std::system_error naming the step that failed.
  FabricService(const executor_type& executor, const Configuration& configuration) : executor_(executor) {
    open(configuration);
  }

  /// As FabricService(context.get_executor(), configuration), e.g. with an asio::io_context.
  template <typename ExecutionContext>
  requires std::is_convertible_v<ExecutionContext&, asio::execution_context&> FabricService(
      ExecutionContext& context, const Configuration& configuration)
      : FabricService(context.get_executor(), configuration) {}

  /// Takes over a service on another executor type whose executor converts to this one's (e.g.
  /// what `asio::use_awaitable_t<>::as_default_on(std::move(service))` does); other is left
  /// closed.
  template <typename OtherExecutor>
  requires std::is_constructible_v<Executor, const OtherExecutor&> FabricService(
      FabricService<Context, OtherExecutor>&& other)
  noexcept(std::is_nothrow_constructible_v<Executor, const OtherExecutor&>)
      : executor_(other.executor_), engine_(std::move(other.engine_)) {}

  /// Transfers never posted fail with errc::shutdown; posted ones finish (bounded by
  /// progress_deadline, after which the endpoint is closed so the provider returns them, and they
  /// fail with errc::shutdown). Every accepted transfer is delivered exactly once, on its
  /// handler's executor, as long as that executor runs.
  ~FabricService() { close(); }

  /// Takes over other's endpoint and transfers; other is left closed.
  FabricService(FabricService&& other) noexcept = default;
  /// Closes this service (as close() does), then takes over other's endpoint and transfers;
  /// other is left closed.
  FabricService& operator=(FabricService&& other) noexcept {
    if (this != &other) {
      close();
      executor_ = std::move(other.executor_);
      engine_ = std::move(other.engine_);
    }
    return *this;
  }
  FabricService(const FabricService&) = delete;
  FabricService& operator=(const FabricService&) = delete;

  /// Opens the endpoint (a closed service only). Throws std::system_error naming the step that
  /// failed, e.g. errc::invalid_configuration or fi_getinfo's error.
  void open(const Configuration& configuration) {
    std::error_code ec;
    std::string what;
    open(configuration, ec, what);
    if (ec) throw std::system_error(ec, "opening the fabric service: " + what);
  }
  /// Opens the endpoint; on failure sets ec and leaves the service closed.
  void open(const Configuration& configuration, std::error_code& ec) {
    std::string what;
    open(configuration, ec, what);
  }
  /// Whether the service is open (opened and not closed since).
  bool is_open() const noexcept { return engine_ != nullptr; }
  /// Starts the shutdown described at the destructor; the service is closed at once.
  void close() {
    if (auto engine = std::exchange(engine_, nullptr)) engine->shutdown();
  }

  /// The executor the service was built with (Asio's name).
  executor_type get_executor() const noexcept { return executor_; }

  /// Starts one transfer. The request is moved in: to send a copy, copy it explicitly
  /// (`submit(dma::TransferRequest<Context>(request))`), since the context holds the operand.
  ///
  /// @par Completion Signature
  /// @code void(std::error_code, dma::Completion<Context>) @endcode
  /// The error_code is the outcome's: empty on success. The Completion hands back the caller's
  /// context on every path, success or not, with the Outcome: TransferDone on success, or the
  /// error with the provider's errno and detail (Outcome::message()). Errors: errc::timed_out
  /// past the transfer's deadline (Configuration::transfer_deadline or TransferRequest::deadline),
  /// errc::connection_lost when the connection broke under it (tcp also reports a rejected key or
  /// range this way), errc::connection_refused or errc::connection_rejected (no connection within
  /// progress_deadline), errc::peer_unreachable while the peer backs off, errc::shutdown, an
  /// operand or advertisement error, asio::error::operation_aborted when cancelled, or a
  /// libfabric code. The handler never runs inside submit(). With a token that turns errors into
  /// exceptions (asio::use_awaitable, asio::use_future) the context is lost on failure: use
  /// `asio::experimental::as_tuple` or `asio::redirect_error` to keep it.
  ///
  /// @par Per-Operation Cancellation
  /// While the transfer is queued (waiting for credits, a connection or its peer's back-off):
  /// terminal, partial and total; it completes at once with asio::error::operation_aborted and
  /// nothing was sent. Once posted: terminal and partial only. The provider cannot cancel an RMA
  /// (tcp and efa-direct have none), so the service replaces the endpoint and closes the old one
  /// once only such transfers remain on it, which makes the provider hand them back; the transfer
  /// then completes with operation_aborted, typically within milliseconds, or with its real
  /// outcome if the provider returned it first. A cancelled write may have landed, which is why
  /// a posted transfer does not honour total. A transfer striped over several endpoints honours
  /// terminal and partial only.
  template <asio::completion_token_for<completion_signature> CompletionToken = default_token_type>
  auto submit(TransferRequest<Context>&& request, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, completion_signature>(initiate_submit{this}, token,
                                                                       std::move(request));
  }
  /// An lvalue request would be copied, context and payload: move it in, or copy it explicitly.
  template <asio::completion_token_for<completion_signature> CompletionToken = default_token_type>
  void submit(const TransferRequest<Context>& request, CompletionToken&& token = default_token_type()) = delete;

  /// Inserts a peer's address for client_id ahead of its first transfer, so an unusable address
  /// fails here rather than in a transfer.
  ///
  /// @par Completion Signature
  /// @code void(std::error_code) @endcode
  ///
  /// @par Per-Operation Cancellation
  /// Not supported: the insertion is a local call that runs to its end.
  template <asio::completion_token_for<void(std::error_code)> CompletionToken = default_token_type>
  auto add_peer(std::uint64_t client_id, std::vector<std::uint8_t> address,
                CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code)>(initiate_insert_peer{this}, token, client_id,
                                                                        std::move(address));
  }

  /// Inserts the advertised peer's address for client_id and brings its connection up, so that
  /// the first transfer to it does not wait for the connection to be set up. rxm connects on the
  /// first transfer, not on insertion: this posts a write of 0 bytes to the advertised region,
  /// delivery-complete, and completes when it has (docs/getting-started.md, "Peers"). The
  /// warm-up is a transfer like any other: it counts in the metrics, waits for the peer's
  /// credits and has the configuration's transfer_deadline. The target checks the key even for
  /// 0 bytes, so an advertisement it does not know fails here (errc::connection_lost on tcp)
  /// instead of in the first real transfer.
  ///
  /// @par Completion Signature
  /// @code void(std::error_code) @endcode
  /// The warm-up's error, as a transfer would report it: an address error, errc::timed_out,
  /// errc::connection_refused, errc::connection_rejected, errc::peer_unreachable, errc::shutdown, ...
  ///
  /// @par Per-Operation Cancellation
  /// As submit(): terminal, partial and total while the warm-up is queued; terminal and partial
  /// once it is posted. It completes with asio::error::operation_aborted; the address stays inserted.
  template <asio::completion_token_for<void(std::error_code)> CompletionToken = default_token_type>
  auto add_peer(std::uint64_t client_id, const Advertisement& peer, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code)>(initiate_warm_up{this}, token, client_id, peer);
  }

  /// Releases client_id's peer once every transfer it submitted before this call has finished.
  void remove_peer(std::uint64_t client_id) {
    if (engine_) engine_->remove_peer(client_id);
  }

  /// Takes ownership of storage (a contiguous range such as std::vector<std::byte>) and registers
  /// its bytes for local access where the provider needs it, so operands inside it skip
  /// per-transfer registration. Registering on one service gives no registration in another
  /// service's domain. Errors: errc::not_open, errc::zero_length_region,
  /// errc::region_range_overflows, fi_mr_reg's.
  ///
  /// @par Completion Signature
  /// @code void(std::error_code, dma::MemoryRegion<S>) @endcode
  ///
  /// @par Per-Operation Cancellation
  /// Not supported: the registration is a local call that runs to its end.
  template <typename S,
            asio::completion_token_for<void(std::error_code, MemoryRegion<S>)> CompletionToken = default_token_type>
  auto register_region(S storage, CompletionToken&& token = default_token_type()) {
    return asio::async_initiate<CompletionToken, void(std::error_code, MemoryRegion<S>)>(
        initiate_register<S>{this}, token, std::make_shared<S>(std::move(storage)));
  }

  /// Transfers accepted and not yet completed (queued or posted): a load-balancing signal.
  std::size_t outstanding() const noexcept { return engine_ ? engine_->outstanding() : 0; }
  /// The first endpoint's fabric address, to send to peers (efa-direct peers must insert it first;
  /// with several endpoints, each one's: see endpoint_addresses()).
  std::span<const std::uint8_t> local_address() const noexcept {
    return engine_ ? std::span<const std::uint8_t>(engine_->local_address()) : std::span<const std::uint8_t>();
  }
  /// Every endpoint's fabric address, in order (one per Configuration::endpoints).
  std::vector<std::vector<std::uint8_t>> endpoint_addresses() const {
    return engine_ ? engine_->endpoint_addresses() : std::vector<std::vector<std::uint8_t>>();
  }
  /// How many endpoints the service opened (Configuration::endpoints); 0 while closed.
  std::size_t endpoints() const noexcept { return engine_ ? engine_->endpoints() : 0; }
  /// The first endpoint's provider, attributes and limits; empty while closed.
  EndpointInfo describe() const { return engine_ ? engine_->describe() : EndpointInfo{}; }
  /// The service's counters and latency histogram since it opened (see dma::Metrics), summed over
  /// its endpoints; all zero while closed. Any thread, without blocking. A striped transfer
  /// counts once per endpoint it used.
  Metrics metrics() const noexcept { return engine_ ? engine_->metrics() : Metrics(); }

 private:
  template <TransferContext, typename>
  friend class FabricService;  // the converting constructor takes over another executor type's

  // Initiations are function objects that carry the service's executor (Asio's convention: an
  // adapter such as asio::deferred or a composed operation can ask an initiation for it).
  struct initiation_base {
    FabricService* self;
    using executor_type = Executor;
    executor_type get_executor() const noexcept { return self->get_executor(); }
  };

  struct initiate_submit : initiation_base {
    template <typename Handler, typename Request>
    void operator()(Handler&& handler, Request&& request) const {
      this->self->initiate(detail::owned(std::forward<Handler>(handler)),
                           detail::owned(std::forward<Request>(request)));
    }
  };

  struct initiate_insert_peer : initiation_base {
    template <typename Handler>
    void operator()(Handler&& handler_in, std::uint64_t client, std::vector<std::uint8_t> bytes) const {
      FabricService* self = this->self;
      auto handler = detail::owned(std::forward<Handler>(handler_in));
      auto work = asio::prefer(asio::get_associated_executor(handler, self->executor_),
                               asio::execution::outstanding_work.tracked);
      if (!self->engine_) return detail::post_with_allocator(work, std::move(handler), make_error_code(errc::not_open));
      self->engine_->insert_peer(client, std::move(bytes),
                                 detail::setup_done(std::move(work), std::move(handler),
                                                    [](auto&& work_in, auto&& handler_in, std::error_code ec) {
                                                      detail::dispatch_with_allocator(std::move(work_in),
                                                                                      std::move(handler_in), ec);
                                                    }));
    }
  };

  struct initiate_warm_up : initiation_base {
    template <typename Handler>
    void operator()(Handler&& handler_in, std::uint64_t client, const Advertisement& advertised) const {
      FabricService* self = this->self;
      auto handler = detail::owned(std::forward<Handler>(handler_in));
      TransferRequest<detail::WarmUp> request;
      request.client_id = client;
      request.set_peer(advertised);
      request.direction = Direction::ToPeer;
      auto executor = asio::get_associated_executor(handler, self->executor_);
      auto allocator = asio::get_associated_allocator(handler, detail::PoolAllocator<void>());
      auto slot = asio::get_associated_cancellation_slot(handler);
      auto done = [handler = std::move(handler)](std::error_code ec, Completion<detail::WarmUp>) mutable {
        std::move(handler)(ec);
      };
      auto bound = asio::bind_cancellation_slot(
          slot, asio::bind_executor(executor, asio::bind_allocator(allocator, std::move(done))));
      self->initiate(std::move(bound), std::move(request), true);
    }
  };

  template <typename S>
  struct initiate_register : initiation_base {
    template <typename Handler>
    void operator()(Handler&& handler_in, std::shared_ptr<S> boxed) const {
      FabricService* self = this->self;
      auto handler = detail::owned(std::forward<Handler>(handler_in));
      auto work = asio::prefer(asio::get_associated_executor(handler, self->executor_),
                               asio::execution::outstanding_work.tracked);
      const auto bytes = detail::storage_bytes(*boxed);
      const auto base = reinterpret_cast<std::uintptr_t>(bytes.data());
      std::error_code ec;
      if (!self->engine_)
        ec = errc::not_open;
      else if (bytes.empty())
        ec = errc::zero_length_region;
      else if (bytes.size() > UINTPTR_MAX - base)
        ec = errc::region_range_overflows;
      if (ec) return detail::post_with_allocator(work, std::move(handler), ec, MemoryRegion<S>());
      const std::size_t length = bytes.size();
      self->engine_->pin(
          base, length, boxed,
          detail::setup_done(
              std::move(work), std::move(handler),
              [boxed, base, length](auto&& work_in, auto&& handler_in, std::error_code ec) {
                auto region = ec ? MemoryRegion<S>() : MemoryRegion<S>::adopt(boxed, base, base + length);
                detail::dispatch_with_allocator(std::move(work_in), std::move(handler_in), ec, std::move(region));
              }));
    }
  };

  void open(const Configuration& configuration, std::error_code& ec, std::string& what) {
    close();
    engine_ = detail::Engine::create(executor_, configuration, ec, what);
  }

  /// Submits request, a caller's transfer (C = Context) or the library's own (add_peer()'s
  /// warm-up, which goes out on every endpoint).
  template <typename Handler, typename C>
  void initiate(Handler&& handler, TransferRequest<C>&& request, bool warm_up = false) {
    using Op = detail::TransferOp<C, std::decay_t<Handler>, executor_type>;
    Op* op = Op::create(std::forward<Handler>(handler), std::move(request), executor_);
    if (!engine_) return asio::post(executor_, [op] { Op::complete(op, Outcome(make_error_code(errc::not_open))); });
    op->sequence = engine_->next_sequence();
    auto slot = asio::get_associated_cancellation_slot(op->handler);
    if (slot.is_connected()) slot.template emplace<detail::Canceller>(engine_, op, op->sequence);
    if (warm_up) return engine_->warm_up(op);
    engine_->submit(op);
  }

  executor_type executor_;
  std::shared_ptr<detail::Engine> engine_;  ///< one endpoint's engine, or the coordinator of several
};

}  // namespace asynchronous
}  // namespace dma
