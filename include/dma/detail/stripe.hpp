// Striping: one transfer split across a service's endpoints (Configuration::endpoints), each part
// a transfer of its own on its own endpoint, joined into the caller's one completion. The parts
// are ordinary transfers: each has the endpoint's credits, the request's deadline and its own
// errors. The join keeps the first error; the caller's handler runs once, after every part came
// back. A striped write with immediate data sends its notification on one more part, the write's
// last page, posted only once every other part has completed with delivery completion: parts on
// different endpoints travel on different connections, so nothing else orders them before the
// Target's completion entry. Joins come from the library's block pool, so a steady stream of
// striped transfers allocates nothing.
#pragma once

#include <dma/checksum.hpp>
#include <dma/detail/block_pool.hpp>
#include <dma/detail/engine.hpp>
#include <dma/detail/handler.hpp>
#include <dma/transfer.hpp>

#include <asio/associated_allocator.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/prefer.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <utility>

namespace dma::detail {

/// The most endpoints one service opens (Configuration::endpoints).
inline constexpr std::size_t max_endpoints = 16;

/// One part of a striped transfer: a contiguous piece of the caller's operand.
struct StripePart {
  std::span<std::byte> bytes;
  std::optional<CacheableSpan> cacheable;  ///< the caller's, so parts share its registration
  std::span<const std::byte> source() const noexcept { return bytes; }
  std::span<std::byte> allocate(std::size_t) const noexcept { return bytes; }
  std::optional<CacheableSpan> cacheable_span() const noexcept { return cacheable; }
};

/// The caller's transfer while its parts are out: its context and handler, and the first error.
template <typename Context, typename Handler, typename IoExecutor>
struct StripeJoin {
  using HandlerExecutor = asio::associated_executor_t<Handler, IoExecutor>;
  using WorkExecutor = std::decay_t<decltype(asio::prefer(std::declval<const HandlerExecutor&>(),
                                                          asio::execution::outstanding_work.tracked))>;
  using Allocator = typename std::allocator_traits<
      asio::associated_allocator_t<Handler, PoolAllocator<void>>>::template rebind_alloc<StripeJoin>;

  /// A part's completion handler: runs on the part's engine, inline (the service's executor).
  struct PartDone {
    StripeJoin* join;
    void operator()(std::error_code, Completion<StripePart> done) { join->part_done(std::move(done.outcome)); }
  };

  /// Installed in the caller's cancellation slot: for terminal or partial, cancels every part,
  /// queued or posted. A stripe's parts are posted independently, so "no side effect" (`total`)
  /// cannot be promised for the whole: a `total`-only cancellation is not honoured.
  struct Canceller {
    explicit Canceller(StripeJoin* j) noexcept : join(j) {}
    StripeJoin* join;
    void operator()(asio::cancellation_type type) const {
      const auto scope = cancel_scope(type);
      if (scope != CancelScope::queued_or_posted) return;
      // A part not yet submitted (the held notifier) is not found by its engine: cancelling the
      // others fails the join, and the notifier is then never posted.
      for (std::size_t i = 0; i < join->count; ++i)
        join->parts[i].engine->cancel(join->parts[i].op, join->parts[i].sequence, *scope);
    }
  };

  struct Part {
    std::shared_ptr<Engine> engine;
    Operation* op = nullptr;
    std::uint64_t sequence = 0;
  };

  StripeJoin(Handler&& handler_in, Context&& context_in, const IoExecutor& io_executor)
      : context(std::move(context_in)), handler(std::move(handler_in)) {
    auto executor = asio::get_associated_executor(handler, io_executor);
    if constexpr (std::is_same_v<HandlerExecutor, IoExecutor>) direct = executor == io_executor;
    if (!direct) work.emplace(asio::prefer(executor, asio::execution::outstanding_work.tracked));
  }

  static StripeJoin* create(Handler&& handler, Context&& context, const IoExecutor& io_executor) {
    Allocator allocator(asio::get_associated_allocator(handler, PoolAllocator<void>()));
    StripeJoin* join = std::allocator_traits<Allocator>::allocate(allocator, 1);
    try {
      std::allocator_traits<Allocator>::construct(allocator, join, std::move(handler), std::move(context), io_executor);
    } catch (...) {
      std::allocator_traits<Allocator>::deallocate(allocator, join, 1);
      throw;
    }
    return join;
  }

  static void free(StripeJoin* join) noexcept {
    Allocator allocator(asio::get_associated_allocator(join->handler, PoolAllocator<void>()));
    std::allocator_traits<Allocator>::destroy(allocator, join);
    std::allocator_traits<Allocator>::deallocate(allocator, join, 1);
  }

  void part_done(Outcome&& outcome) {
    if (!outcome.ok()) {
      std::lock_guard lock(mutex);
      if (!failed) {
        failed = true;
        first_error = std::move(outcome);
      }
    }
    const std::size_t left = remaining.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if (left == 0) return finish();
    if (left == 1 && notifier != nullptr) release_notifier();
  }

  // Every other part is back (the acq_rel count makes their errors visible here): the notifier
  // goes out if they all succeeded; otherwise the write failed, no notification may claim its
  // bytes landed, and the notifier is freed unposted.
  void release_notifier() {
    Operation* op = std::exchange(notifier, nullptr);
    const Part& part = parts[count - 1];
    if (!failed) return part.engine->submit(op);
    op->functions->destroy(op);
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
  }

  // The last part is back: the caller's completion, once. The join is freed before the handler
  // runs, so the handler may submit again at once.
  void finish() {
    Outcome outcome =
        failed ? std::move(first_error)
               : Outcome(TransferDone{bytes, want_checksum ? std::optional<std::uint32_t>(checksum(
                                                                 std::span<const std::byte>(operand.data(), bytes)))
                                                           : std::nullopt});
    auto slot = asio::get_associated_cancellation_slot(handler);
    if (slot.is_connected()) slot.clear();
    Handler h(std::move(handler));
    const std::error_code ec = outcome.error();
    Completion<Context> completion{std::move(context), std::move(outcome)};
    if (direct) {
      free(this);
      return std::move(h)(ec, std::move(completion));
    }
    WorkExecutor executor(std::move(*work));
    free(this);
    dispatch_with_allocator(std::move(executor), std::move(h), ec, std::move(completion));
  }

  Context context;
  Handler handler;
  std::optional<WorkExecutor> work;
  bool direct = false;
  std::atomic<std::size_t> remaining{0};
  std::mutex mutex;
  bool failed = false;
  Outcome first_error;
  std::size_t bytes = 0;
  bool want_checksum = false;
  std::span<const std::byte> operand;
  std::array<Part, max_endpoints + 1> parts{};  ///< one per endpoint, and the notifier last
  std::size_t count = 0;
  Operation* notifier = nullptr;  ///< the part with the immediate data, until it is submitted
};

}  // namespace dma::detail
