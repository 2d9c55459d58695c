// The test's side of notification confirmation for hand-made DMA.GETs: one Target's write
// notifications, matched by value to the DMA.GETs that wait for them. Every connection of a
// process shares the one Target, so each DMA.GET carries a token that no other pending one holds.
#pragma once

#include <dma/config.hpp>
#include <dma/error.hpp>
#include <dma/kv/protocol.hpp>
#include <dma/target.hpp>

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace kv {

/// Routes a Target's notifications to the DMA.GETs waiting for them, by the token each carries.
/// A notification may arrive before its GET's reply: it is kept until wait() or forget(). One
/// that no pending token names (its GET failed and was forgotten) is dropped and counted.
/// The Target's executor and the waiting coroutines run on one thread (an io_context run by one
/// thread, as in dma-kv-client); issue() and forget() may be called from any thread.
class NotificationRouter {
 public:
  /// Why a wait() failed: no notification within the bound, or the Target dropped some.
  struct Missing : std::runtime_error {
    using std::runtime_error::runtime_error;
  };

  explicit NotificationRouter(dma::Target& target) : target_(target) {
    target_.set_notification_callback(
        [this](std::error_code ec, const dma::WriteNotification& notification) { arrived(ec, notification); });
  }
  ~NotificationRouter() { target_.set_notification_callback({}); }
  NotificationRouter(const NotificationRouter&) = delete;
  NotificationRouter& operator=(const NotificationRouter&) = delete;

  /// A token (below 2^32) that no other pending DMA.GET holds, now pending.
  std::uint32_t issue() {
    std::lock_guard lock(mutex_);
    while (next_ == 0 || pending_.contains(next_))
      ++next_;
    pending_.emplace(next_, Entry{});
    return next_++;
  }

  /// Stops waiting for `token` (its GET failed, or wrote nothing): a notification that still
  /// comes is dropped.
  void forget(std::uint32_t token) {
    std::lock_guard lock(mutex_);
    pending_.erase(token);
  }

  /// Completes once the notification carrying `token` has arrived (at once if it already has),
  /// and forgets the token. Throws Missing when none arrives within `bound`, or when the Target
  /// dropped notifications while this one was pending.
  asio::awaitable<void> wait(std::uint32_t token, std::chrono::steady_clock::duration bound) {
    asio::steady_timer timer(co_await asio::this_coro::executor, bound);
    bool waiting = false;
    {
      std::lock_guard lock(mutex_);
      auto& entry = pending_[token];
      waiting = entry.state == State::waiting;
      if (waiting) entry.timer = &timer;
    }
    // Nothing else runs on this thread before the wait starts: an arrival cancels the timer.
    if (waiting) co_await timer.async_wait(dma::compat::as_tuple(asio::use_awaitable));
    std::lock_guard lock(mutex_);
    const State state = pending_[token].state;
    pending_.erase(token);
    if (state == State::landed) co_return;
    throw Missing(state == State::lost
                      ? "the Target dropped notifications while token " + std::to_string(token) + " was pending"
                      : "no notification carried token " + std::to_string(token) + " within " +
                            std::to_string(std::chrono::ceil<std::chrono::milliseconds>(bound).count()) + " ms");
  }

  /// Notifications that named no pending token.
  std::uint64_t strays() const {
    std::lock_guard lock(mutex_);
    return strays_;
  }

 private:
  enum class State { waiting, landed, lost };
  struct Entry {
    State state = State::waiting;
    asio::steady_timer* timer = nullptr;  ///< the waiter's, once wait() started
  };

  // On the Target's executor, the waiters' thread.
  void arrived(std::error_code ec, const dma::WriteNotification& notification) {
    std::lock_guard lock(mutex_);
    if (ec == dma::errc::notifications_lost) {
      for (auto& [token, entry] : pending_)
        settle(entry, State::lost);
      return;
    }
    if (ec) return;  // the Target is going away: waiters time out or end with their io_context
    const auto it = notification.data <= dma::kv::max_token
                        ? pending_.find(static_cast<std::uint32_t>(notification.data))
                        : pending_.end();
    if (it == pending_.end()) {
      ++strays_;
      return;
    }
    settle(it->second, State::landed);
  }

  static void settle(Entry& entry, State state) {
    if (entry.state != State::waiting) return;
    entry.state = state;
    if (entry.timer != nullptr) entry.timer->cancel();
  }

  dma::Target& target_;
  mutable std::mutex mutex_;
  std::unordered_map<std::uint32_t, Entry> pending_;
  std::uint32_t next_ = 1;
  std::uint64_t strays_ = 0;
};

}  // namespace kv
