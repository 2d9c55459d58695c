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
#include <dma/detail/stripe.hpp>
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
namespace detail {

/// An rvalue as itself, an lvalue as a copy: what an initiation taking `auto&&` hands on to code
/// that moves from its argument.
template <typename T>
decltype(auto) owned(T&& value) {
  if constexpr (std::is_lvalue_reference_v<T>) {
    return std::decay_t<T>(value);
  } else {
    return std::move(value);
  }
}

/// One submitted transfer with its caller's context and completion handler.
template <typename Context, typename Handler, typename IoExecutor>
struct TransferOp final : Operation {
  using HandlerExecutor = asio::associated_executor_t<Handler, IoExecutor>;
  using WorkExecutor = std::decay_t<decltype(asio::prefer(std::declval<const HandlerExecutor&>(),
                                                          asio::execution::outstanding_work.tracked))>;
  using Allocator = typename std::allocator_traits<
      asio::associated_allocator_t<Handler, PoolAllocator<void>>>::template rebind_alloc<TransferOp>;

  // A handler on the service's own executor needs no work guard of its own: while a transfer is
  // outstanding the engine always has a handler pending on a strand of that executor (the intake,
  // a poll, an armed wait or the backstop), which keeps its run() from returning, and an idle
  // engine holds nothing. Other executors get the guard asio's rules ask for.
  TransferOp(Handler&& handler_in, TransferRequest<Context>&& request, const IoExecutor& io_executor)
      : Operation(&table, request), caller_context(std::move(request.caller_context)), handler(std::move(handler_in)) {
    if constexpr (has_own_executor<Handler>) {
      auto executor = asio::get_associated_executor(handler, io_executor);
      direct = same_executor(executor, io_executor);
      if (!direct) work.emplace(asio::prefer(executor, asio::execution::outstanding_work.tracked));
    } else {
      // It runs on the service's executor: nothing to copy or compare (a type-erased executor's
      // copy, comparison and destruction are each a call through its function table).
      direct = true;
    }
  }

  static bool same_executor(const HandlerExecutor& a, const IoExecutor& b) noexcept {
    if constexpr (std::is_same_v<HandlerExecutor, IoExecutor>) {
      return a == b;
    } else {
      return false;
    }
  }

  static TransferOp* create(Handler&& handler, TransferRequest<Context>&& request, const IoExecutor& io_executor) {
    Allocator allocator(asio::get_associated_allocator(handler, PoolAllocator<void>()));
    TransferOp* op = std::allocator_traits<Allocator>::allocate(allocator, 1);
    try {
      std::allocator_traits<Allocator>::construct(allocator, op, std::move(handler), std::move(request), io_executor);
    } catch (...) {
      std::allocator_traits<Allocator>::deallocate(allocator, op, 1);
      throw;
    }
    return op;
  }

  static void free(TransferOp* op) noexcept {
    Allocator allocator(asio::get_associated_allocator(op->handler, PoolAllocator<void>()));
    std::allocator_traits<Allocator>::destroy(allocator, op);
    std::allocator_traits<Allocator>::deallocate(allocator, op, 1);
  }

  static errc resolve(Operation& base) {
    auto& op = static_cast<TransferOp&>(base);
    if (op.resolved_early) return op.early_error;
    const ResolvedOperand resolved = resolve_operand(op.caller_context, op.request.direction, op.request.length);
    take(op, resolved);
    return resolved.error;
  }

  /// Stores what resolve_operand() found; `resolved.error` set means the operand is unusable.
  static void take(TransferOp& op, const ResolvedOperand& resolved) noexcept {
    op.buffer = resolved.buffer;
    op.length = resolved.length;
    op.lists = resolved.lists;
    // The callback layer hashes on its Pool from the operand it saw; a list's CRC is the engine's.
    if constexpr (requires { op.caller_context.checksum_lists; }) {
      if (resolved.error == errc{} && op.caller_context.checksum_lists && (op.lists & local_list) != 0)
        op.request.want_checksum = true;
    }
  }

  /// The operand was resolved on the submitting thread (a service with several endpoints): the
  /// engine's resolve() returns this instead of asking the context again.
  void resolved_before(const ResolvedOperand& resolved) noexcept {
    take(*this, resolved);
    resolved_early = true;
    early_error = resolved.error;
  }

  static std::optional<CacheableSpan> cacheable_span(const Operation& base) {
    return detail::cacheable_span(static_cast<const TransferOp&>(base).caller_context);
  }

  static std::size_t local_buffers(Operation& base, std::span<std::span<std::byte>> out) {
    auto& op = static_cast<TransferOp&>(base);
    return detail::local_buffers(op.caller_context, op.request.direction, op.length, out);
  }

  static std::span<const RemoteSegment> remote_segments(const Operation& base) {
    return detail::remote_segments(static_cast<const TransferOp&>(base).caller_context);
  }

  // The operation is freed before the handler runs, so a handler may submit again at once.
  static void complete(Operation* base, Outcome&& outcome) {
    auto* op = static_cast<TransferOp*>(base);
    if (outcome.ok() && op->request.want_checksum && !outcome->checksum) {  // a list's is in already
      outcome = Outcome(TransferDone{op->length, checksum(std::span<const std::byte>(op->buffer, op->length))});
    }
    auto slot = asio::get_associated_cancellation_slot(op->handler);
    if (slot.is_connected()) slot.clear();
    Handler handler(std::move(op->handler));
    const std::error_code ec = outcome.error();
    Completion<Context> completion{std::move(op->caller_context), std::move(outcome)};
    if (op->direct) {
      // The engine completes on a thread running the service's executor: a handler bound to that
      // same executor runs here, as asio::dispatch would run it, minus the type-erased wrapper.
      free(op);
      return std::move(handler)(ec, std::move(completion));
    }
    WorkExecutor work(std::move(*op->work));
    free(op);
    dispatch_with_allocator(std::move(work), std::move(handler), ec, std::move(completion));
  }

  static void destroy(Operation* base) { free(static_cast<TransferOp*>(base)); }

  static constexpr OperationFunctions table{&resolve,        &complete,      &destroy,
                                            &cacheable_span, &local_buffers, &remote_segments};

  Context caller_context{};
  Handler handler;
  std::optional<WorkExecutor> work;  ///< only when the handler runs on another executor
  bool direct = false;               ///< the handler's executor is the service's own
  bool resolved_early = false;       ///< see resolved_before()
  errc early_error{};
};

/// The context of add_peer()'s connection warm-up: a write of no bytes.
struct WarmUp {
  std::span<const std::byte> source() const noexcept { return {}; }
};

/// Installed in a handler's cancellation slot: cancels the operation while it is queued for any
/// cancellation type, and once posted only for terminal or partial (cancel_scope()).
struct Canceller {
  Canceller(std::shared_ptr<Engine> e, Operation* o, std::uint64_t s) noexcept
      : engine(std::move(e)), op(o), sequence(s) {}
  std::shared_ptr<Engine> engine;
  Operation* op;
  std::uint64_t sequence;
  void operator()(asio::cancellation_type type) const {
    if (auto scope = cancel_scope(type)) engine->cancel(op, sequence, *scope);
  }
};

}  // namespace detail

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
      : executor_(other.executor_),
        engine_(std::move(other.engine_)),
        rails_(std::move(other.rails_)),
        stripe_threshold_(other.stripe_threshold_) {}

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
      rails_ = std::move(other.rails_);
      stripe_threshold_ = other.stripe_threshold_;
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
    engine_.reset();
    for (auto& engine : std::exchange(rails_, {}))
      engine->shutdown();
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
    for (const auto& engine : rails_)
      engine->remove_peer(client_id);
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
  std::size_t outstanding() const noexcept {
    std::size_t n = 0;
    for (const auto& engine : rails_)
      n += engine->outstanding();
    return n;
  }
  /// The first endpoint's fabric address, to send to peers (efa-direct peers must insert it first;
  /// with several endpoints, each one's: see endpoint_addresses()).
  std::span<const std::uint8_t> local_address() const noexcept {
    return engine_ ? std::span<const std::uint8_t>(engine_->local_address()) : std::span<const std::uint8_t>();
  }
  /// Every endpoint's fabric address, in order (one per Configuration::endpoints).
  std::vector<std::vector<std::uint8_t>> endpoint_addresses() const {
    std::vector<std::vector<std::uint8_t>> addresses;
    for (const auto& engine : rails_)
      addresses.push_back(engine->local_address());
    return addresses;
  }
  /// How many endpoints the service opened (Configuration::endpoints); 0 while closed.
  std::size_t endpoints() const noexcept { return rails_.size(); }
  /// The first endpoint's provider, attributes and limits; empty while closed.
  EndpointInfo describe() const { return engine_ ? engine_->describe() : EndpointInfo{}; }
  /// The service's counters and latency histogram since it opened (see dma::Metrics), summed over
  /// its endpoints; all zero while closed. Any thread, without blocking. A striped transfer
  /// counts once per endpoint it used.
  Metrics metrics() const noexcept {
    Metrics m;
    for (const auto& engine : rails_)
      m += engine->metrics();
    return m;
  }

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
      if (self->rails_.empty())
        return detail::post_with_allocator(work, std::move(handler), make_error_code(errc::not_open));
      // Every endpoint inserts it; the first error is the answer, once all have.
      struct Shared {
        std::mutex mutex;
        std::size_t left = 0;
        std::error_code ec;
        std::vector<std::uint8_t> bytes;
        std::optional<decltype(handler)> done;
        std::optional<decltype(work)> executor;
      };
      auto shared = std::make_shared<Shared>();
      shared->left = self->rails_.size();
      shared->bytes = std::move(bytes);
      shared->done.emplace(std::move(handler));
      shared->executor.emplace(std::move(work));
      for (const auto& engine : self->rails_) {
        asio::post(engine->strand(), [engine, client, shared] {
          const std::error_code ec = engine->insert_peer(client, shared->bytes);
          std::lock_guard lock(shared->mutex);
          if (ec && !shared->ec) shared->ec = ec;
          if (--shared->left != 0) return;
          detail::dispatch_with_allocator(std::move(*shared->executor), std::move(*shared->done), shared->ec);
        });
      }
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
      if (self->rails_.size() > 1) return self->initiate_on_every_endpoint(std::move(bound), std::move(request));
      self->initiate(std::move(bound), std::move(request));
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
      // Pinned on every endpoint's domain in turn; the first error ends it.
      self->pin_each(0, self->rails_, std::move(boxed), base, bytes.size(), std::move(work), std::move(handler));
    }
  };

  void open(const Configuration& configuration, std::error_code& ec, std::string& what) {
    close();
    if (configuration.endpoints == 0 || configuration.endpoints > detail::max_endpoints) {
      ec = errc::invalid_configuration;
      what = "endpoints must be 1 to " + std::to_string(detail::max_endpoints) + ", not " +
             std::to_string(configuration.endpoints);
      return;
    }
    std::vector<std::shared_ptr<detail::Engine>> rails;
    for (std::size_t k = 0; k < configuration.endpoints; ++k) {
      auto engine = detail::Engine::create(executor_, rail_configuration(configuration, k), ec, what);
      if (!engine) {
        if (configuration.endpoints > 1) what = "endpoint " + std::to_string(k) + ": " + what;
        for (auto& opened : rails)
          opened->shutdown();
        return;
      }
      rails.push_back(std::move(engine));
    }
    rails_ = std::move(rails);
    engine_ = rails_.front();
    stripe_threshold_ = std::max<std::size_t>(configuration.stripe_threshold, 1);
  }

  // Endpoint k of a service with several: the k-th of several interfaces (one per NIC), and only
  // the first binds a fixed port.
  static Configuration rail_configuration(const Configuration& configuration, std::size_t k) {
    Configuration c = configuration;
    if (k == 0) return c;
    if (c.interfaces.size() > 1)
      std::rotate(c.interfaces.begin(), c.interfaces.begin() + static_cast<std::ptrdiff_t>(k % c.interfaces.size()),
                  c.interfaces.end());
    c.port.reset();
    return c;
  }

  // The least loaded endpoint, for a transfer that goes to one.
  const std::shared_ptr<detail::Engine>& least_loaded() const noexcept {
    const std::shared_ptr<detail::Engine>* best = &rails_.front();
    std::size_t load = (*best)->outstanding();
    for (std::size_t k = 1; k < rails_.size() && load != 0; ++k) {
      const std::size_t n = rails_[k]->outstanding();
      if (n < load) {
        best = &rails_[k];
        load = n;
      }
    }
    return *best;
  }

  template <typename Handler, typename S>
  void pin_each(std::size_t k, std::vector<std::shared_ptr<detail::Engine>> rails, std::shared_ptr<S> boxed,
                std::uintptr_t base, std::size_t length, auto work, Handler handler) {
    auto engine = rails[k];
    asio::post(engine->strand(), [this, k, rails = std::move(rails), engine, boxed = std::move(boxed), base, length,
                                  work, handler = std::move(handler)]() mutable {
      const std::error_code pinned = engine->pin(base, length, boxed);
      if (!pinned && k + 1 < rails.size()) {
        return pin_each(k + 1, std::move(rails), std::move(boxed), base, length, std::move(work), std::move(handler));
      }
      auto region = pinned ? MemoryRegion<S>() : MemoryRegion<S>::adopt(std::move(boxed), base, base + length);
      detail::dispatch_with_allocator(std::move(work), std::move(handler), pinned, std::move(region));
    });
  }

  /// Submits request, a caller's transfer (C = Context) or the library's own (add_peer()'s warm-up).
  template <typename Handler, typename C>
  void initiate(Handler&& handler, TransferRequest<C>&& request) {
    using Op = detail::TransferOp<C, std::decay_t<Handler>, executor_type>;
    if (!engine_) {
      Op* op = Op::create(std::forward<Handler>(handler), std::move(request), executor_);
      return asio::post(executor_, [op] { Op::complete(op, Outcome(make_error_code(errc::not_open))); });
    }
    if (rails_.size() == 1)
      return submit_to(engine_, Op::create(std::forward<Handler>(handler), std::move(request), executor_));
    // Several endpoints: the operand is resolved here, once, to tell whether the transfer is
    // striped; one that is not takes what was resolved to its endpoint.
    const detail::ResolvedOperand resolved =
        detail::resolve_operand(request.caller_context, request.direction, request.length);
    if (resolved.error == errc{} && resolved.lists == 0 && resolved.length >= stripe_threshold_) {
      return initiate_striped(std::forward<Handler>(handler), std::move(request),
                              std::span<std::byte>(resolved.buffer, resolved.length), rails_.size());
    }
    Op* op = Op::create(std::forward<Handler>(handler), std::move(request), executor_);
    op->resolved_before(resolved);
    submit_to(least_loaded(), op);
  }

  template <typename Op>
  void submit_to(const std::shared_ptr<detail::Engine>& engine, Op* op) {
    op->sequence = engine->next_sequence();
    auto slot = asio::get_associated_cancellation_slot(op->handler);
    if (slot.is_connected()) slot.template emplace<detail::Canceller>(engine, op, op->sequence);
    engine->submit(op);
  }

  // add_peer()'s warm-up with several endpoints: a 0-byte write from each.
  template <typename Handler, typename C>
  void initiate_on_every_endpoint(Handler&& handler, TransferRequest<C>&& request) {
    initiate_striped(std::forward<Handler>(handler), std::move(request), std::span<std::byte>(), rails_.size());
  }

  // `parts` transfers, one per endpoint, over consecutive pieces of operand (parts of 0 bytes
  // when it is empty), joined into handler's one completion. A write with immediate data adds a
  // notifier: the operand's last page, posted by the join once every other part has completed.
  template <typename Handler, typename C>
  void initiate_striped(Handler&& handler, TransferRequest<C>&& request, std::span<std::byte> operand,
                        std::size_t parts) {
    using Join = detail::StripeJoin<C, std::decay_t<Handler>, executor_type>;
    using Part = detail::TransferOp<detail::StripePart, typename Join::PartDone, executor_type>;
    std::optional<CacheableSpan> cacheable;
    if (!operand.empty()) cacheable = detail::cacheable_span(request.caller_context);
    const TransferFields fields = request;
    constexpr std::size_t page = 4096;
    // A read with immediate data is refused at acceptance, on the one part that carries it.
    const bool notify = fields.immediate_data.has_value() && fields.direction == Direction::ToPeer && !operand.empty();
    const std::size_t carrier = notify ? parts : parts - 1;  // the one part with the value
    const std::size_t tail = notify ? std::min(page, operand.size()) : 0;
    const std::size_t ops = parts + (notify ? 1 : 0);
    Join* join = Join::create(std::forward<Handler>(handler), std::move(request.caller_context), executor_);
    join->bytes = operand.size();
    join->want_checksum = fields.want_checksum;
    join->operand = operand;
    join->count = ops;
    join->remaining.store(ops, std::memory_order_relaxed);
    auto make_part = [&](std::size_t k, std::size_t rail, std::size_t offset, std::size_t length) {
      TransferRequest<detail::StripePart> part;
      static_cast<TransferFields&>(part) = fields;
      part.want_checksum = false;  // the join computes one over the whole
      part.remote_address = fields.remote_address + offset;
      part.length = length;
      if (k != carrier) part.immediate_data.reset();                            // the peer hears one
      if (notify && k != carrier) part.completion = CompletionLevel::delivery;  // landed before it goes
      part.caller_context = {operand.subspan(offset, length), cacheable};
      Part* op = Part::create(typename Join::PartDone{join}, std::move(part), executor_);
      op->sequence = rails_[rail]->next_sequence();
      join->parts[k] = {rails_[rail], op, op->sequence};
      return op;
    };
    // Pieces of whole 4 KiB pages where there are enough, the last one shorter.
    const std::size_t body = operand.size() - tail;
    std::size_t piece = (body + parts - 1) / parts;
    if (piece > page) piece = (piece + page - 1) / page * page;
    std::array<Part*, detail::max_endpoints> posted{};
    for (std::size_t k = 0; k < parts; ++k) {
      const std::size_t offset = std::min(k * piece, body);
      posted[k] = make_part(k, k, offset, std::min(piece, body - offset));
    }
    if (notify) join->notifier = make_part(parts, parts - 1, body, tail);
    auto slot = asio::get_associated_cancellation_slot(join->handler);
    if (slot.is_connected()) slot.template emplace<typename Join::Canceller>(join);
    for (std::size_t k = 0; k < parts; ++k)
      rails_[k]->submit(posted[k]);  // the last may complete the join: nothing touches it after
  }

  executor_type executor_;
  std::shared_ptr<detail::Engine> engine_;              ///< the first endpoint's
  std::vector<std::shared_ptr<detail::Engine>> rails_;  ///< every endpoint's, engine_ first
  std::size_t stripe_threshold_ = std::size_t{1} << 20;
};

}  // namespace asynchronous
}  // namespace dma
