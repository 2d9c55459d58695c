// One submitted transfer as the engine sees it (an Operation), with the caller's context and
// completion handler: what asynchronous::FabricService hands its engine.
#pragma once

#include <dma/checksum.hpp>
#include <dma/detail/block_pool.hpp>
#include <dma/detail/cancel_scope.hpp>
#include <dma/detail/engine.hpp>
#include <dma/detail/handler.hpp>
#include <dma/detail/operand.hpp>
#include <dma/detail/operation.hpp>
#include <dma/transfer.hpp>

#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/prefer.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <system_error>
#include <type_traits>
#include <utility>

namespace dma::detail {

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
    if (op.resolved_early) return op.early_error;  // by submit() of a service with several endpoints
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

}  // namespace dma::detail
