// What a completion-queue watcher does after a pass, for each wait mode. Pure: no libfabric, no
// Asio, so every rule has a unit test (test/unit/wait_policy_test.cpp).
#pragma once

#include <dma/configuration.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace dma::detail {

class WaitPolicy {
 public:
  using Clock = std::chrono::steady_clock;

  /// After a pass: post another polling pass, arm the wait fd, or leave the next look to the
  /// backstop timer.
  enum class Next : std::uint8_t { poll, arm, backstop };
  /// What a watcher without a usable wait fd does. An initiator polls while work is outstanding
  /// (it stops when idle); a passive target, which is never idle, lets the backstop pace it
  /// rather than spin a core.
  enum class WithoutFd : std::uint8_t { poll, backstop };

  WaitPolicy(WaitMode mode, std::chrono::nanoseconds spin_budget, WithoutFd without_fd) noexcept
      : mode_(mode), spin_budget_(spin_budget), without_fd_(without_fd) {}

  /// Whether the CQ has a wait fd that the watcher may arm (never in busy_poll).
  void set_fd(bool usable) noexcept { fd_ = usable; }
  bool fd() const noexcept { return fd_; }
  WaitMode mode() const noexcept { return mode_; }

  /// Traffic was seen: a submission, a completion, an fd wake-up, or fi_trywait reporting pending
  /// work. adaptive keeps polling for spin_budget from now; the other modes ignore it.
  void note_activity() noexcept {
    if (mode_ == WaitMode::adaptive) spin_until_ = Clock::now() + spin_budget_;
  }

  /// poll_again: the pass asks for one more look before any wait (poll_once_more()).
  Next after_pass(bool poll_again) const noexcept {
    if (mode_ == WaitMode::busy_poll) return Next::poll;
    if (!fd_) return without_fd_ == WithoutFd::poll ? Next::poll : Next::backstop;
    if (poll_again) return Next::poll;
    // Each poll is a handler of its own, so other work on the executor runs in between.
    if (mode_ == WaitMode::adaptive && Clock::now() < spin_until_) return Next::poll;
    return Next::arm;
  }

  /// The "poll once more" rule, in every mode: a pass that reaped polls once more before the fd
  /// is armed if a transfer posted before this pass is still in flight. Under load its
  /// completion is in by the time this pass's burst is posted, and fi_trywait would report it
  /// only after resetting the provider's wait signal, which the next completion raises again (two
  /// system calls plus the trywait at every burst boundary). When this pass posted everything in
  /// flight (one transfer at a time, or a whole window completed at once), the next completion is
  /// a round trip away: a poll would find nothing, and the armed wait would then wake once more,
  /// empty, right after it was armed (two wake-ups per transfer).
  static bool poll_once_more(bool reaped, std::size_t in_flight, std::size_t posted_this_pass) noexcept {
    return reaped && in_flight > posted_this_pass;
  }

 private:
  WaitMode mode_;
  std::chrono::nanoseconds spin_budget_;
  WithoutFd without_fd_;
  bool fd_ = false;
  Clock::time_point spin_until_{};
};

}  // namespace dma::detail
