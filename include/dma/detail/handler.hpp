// What every asynchronous operation of the library does with its completion handler, the way
// Asio's own operations do: the default token an I/O object's executor asks for, whether a handler
// names an executor of its own, and running a handler elsewhere with its allocator bound.
#pragma once

#include <asio/associated_allocator.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/bind_allocator.hpp>
#include <asio/dispatch.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <functional>
#include <memory>
#include <system_error>
#include <type_traits>
#include <utility>

namespace dma::detail {

/// The completion token an operation of an I/O object on Executor uses when the caller names
/// none: the executor's own default (asio::default_completion_token_t, as set by
/// `as_default_on_t`), else asio::use_awaitable_t<Executor>, so a coroutine on that executor
/// can `co_await` the operation.
template <typename Executor>
using default_token_t = std::conditional_t<std::is_void_v<asio::default_completion_token_t<Executor>>,
                                           asio::use_awaitable_t<Executor>, asio::default_completion_token_t<Executor>>;

/// A type no handler names as its executor: a handler whose associated executor, asked with this
/// as the candidate, comes back as this has none of its own and runs on whatever it is given.
struct NoExecutorProbe {};

template <typename Handler>
inline constexpr bool has_own_executor =
    !std::is_same_v<asio::associated_executor_t<Handler, NoExecutorProbe>, NoExecutorProbe>;

/// Runs handler(args...) through executor (asio::dispatch) with the handler's associated
/// allocator bound, so whatever the executor allocates to run it comes from the handler's
/// allocator, as in Asio's composed operations.
template <typename Executor, typename Handler, typename... Args>
void dispatch_with_allocator(Executor&& executor, Handler&& handler, Args&&... args) {
  auto allocator = asio::get_associated_allocator(handler);
  asio::dispatch(std::forward<Executor>(executor),
                 asio::bind_allocator(allocator, [handler = std::forward<Handler>(handler),
                                                  ... args = std::forward<Args>(args)]() mutable {
                   std::move(handler)(std::move(args)...);
                 }));
}

/// As dispatch_with_allocator(), through asio::post: the handler never runs inside the caller.
template <typename Executor, typename Handler, typename... Args>
void post_with_allocator(Executor&& executor, Handler&& handler, Args&&... args) {
  auto allocator = asio::get_associated_allocator(handler);
  asio::post(std::forward<Executor>(executor),
             asio::bind_allocator(
                 allocator, [handler = std::forward<Handler>(handler), ... args = std::forward<Args>(args)]() mutable {
                   std::move(handler)(std::move(args)...);
                 }));
}

/// A copyable callback for the engine's setup steps (add_peer()'s insertion, register_region()'s
/// pin), which run elsewhere and call back once: it keeps the move-only handler and its work
/// guard, and calls finish(work, handler, ec) with them.
template <typename Work, typename Handler, typename Finish>
std::function<void(std::error_code)> setup_done(Work&& work, Handler&& handler, Finish finish) {
  struct Held {
    std::decay_t<Work> work;
    std::decay_t<Handler> handler;
    Finish finish;
  };
  auto held = std::make_shared<Held>(Held{std::forward<Work>(work), std::forward<Handler>(handler), std::move(finish)});
  return [held](std::error_code ec) { held->finish(std::move(held->work), std::move(held->handler), ec); };
}

}  // namespace dma::detail
