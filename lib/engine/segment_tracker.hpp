// One logical transfer made of several posts (a segmented or gathered transfer): which posts the
// provider holds, the first error, and when the whole is done. The first error stops further
// posts, but the transfer completes only once every post the provider holds has come back, so the
// caller's memory is never touched after its completion runs. Each post gets a slot of its own,
// whose first member is the provider's context: providers that need FI_CONTEXT2 (efa-direct) keep
// per-post state there, so two posts in flight may not share one.
#pragma once

#include <dma/detail/operation.hpp>
#include <dma/transfer.hpp>

#include <rdma/fabric.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>

namespace dma::detail {

/// One post of a logical transfer, from fi_writemsg / fi_readmsg to its CQ entry.
struct SegmentSlot {
  /// Must stay the first member: the pointer a CQ entry carries is the slot itself.
  PostContext head{{}, true};
  void* owner = nullptr;         ///< the operation the slot belongs to
  std::size_t bytes = 0;         ///< what the post moves
  std::uint32_t generation = 0;  ///< the endpoint it was posted on
  std::uint8_t index = 0;
  bool in_flight = false;

  static SegmentSlot* from_context(void* context) noexcept { return static_cast<SegmentSlot*>(context); }
  void* as_context() noexcept { return this; }
};

static_assert(std::is_standard_layout_v<SegmentSlot>, "PostContext must be at offset 0 of SegmentSlot");

class SegmentTracker {
 public:
  /// The most posts of one transfer in flight at once.
  static constexpr std::size_t max_window = 16;

  SegmentTracker() noexcept;
  SegmentTracker(const SegmentTracker&) = delete;  // the provider holds pointers to the slots
  SegmentTracker& operator=(const SegmentTracker&) = delete;

  /// Starts tracking a transfer of `total` bytes for `owner`, with at most `window` posts in flight
  /// (clamped to 1 .. max_window). Forgets any earlier transfer, which must have finished.
  void start(void* owner, std::size_t total, std::size_t window) noexcept;

  /// The slot for the next post, or null when the window is full, the transfer failed or every
  /// byte is posted. Taking it commits nothing: a post refused with -FI_EAGAIN just asks again.
  SegmentSlot* next_slot() noexcept;
  /// The provider accepted the post of `bytes` in `slot` (from next_slot()) on endpoint `generation`.
  void posted(SegmentSlot& slot, std::size_t bytes, std::uint32_t generation) noexcept;
  /// The provider handed `slot` back with success. True when that finished the transfer.
  bool returned(SegmentSlot& slot) noexcept;
  /// The provider handed `slot` back with `error` (success when empty); the first error is kept,
  /// with its errno and detail. True when that finished the transfer.
  bool returned(SegmentSlot& slot, std::error_code error, int provider_errno = 0, std::string detail = {});
  /// The provider handed `slot` back unfinished, to be posted again: its bytes count as not
  /// posted. False (nothing changes) when the transfer failed already or slot was not in flight.
  bool hand_back(SegmentSlot& slot) noexcept;
  /// Fails the transfer without a post coming back (a post refused, its deadline, a cancellation):
  /// nothing more is posted and the first error is kept. True when nothing is in flight, so the
  /// transfer is finished now.
  bool fail(std::error_code error, int provider_errno = 0, std::string detail = {});

  /// Every post came back and either every byte was posted or the transfer failed.
  bool finished() const noexcept { return in_flight_ == 0 && (failed() || all_posted()); }
  /// Every byte is in a post that was accepted (a zero-length transfer: its one post).
  bool all_posted() const noexcept { return posts_ != 0 && bytes_posted_ == total_; }
  bool failed() const noexcept { return static_cast<bool>(error_); }
  /// The first error, or empty.
  const std::error_code& error() const noexcept { return error_; }

  /// The transfer's result once finished(): TransferDone with the whole length counted once, or
  /// the first error with its errno and detail.
  Outcome outcome(std::optional<std::uint32_t> checksum = std::nullopt) const;

  void* owner() const noexcept { return owner_; }
  std::size_t total() const noexcept { return total_; }
  std::size_t window() const noexcept { return window_; }
  std::size_t in_flight() const noexcept { return in_flight_; }
  std::size_t posts() const noexcept { return posts_; }      ///< accepted by the provider
  std::size_t returns() const noexcept { return returns_; }  ///< handed back, either way
  std::size_t bytes_posted() const noexcept { return bytes_posted_; }
  std::size_t bytes_done() const noexcept { return bytes_done_; }  ///< in posts that came back successfully
  /// Returns of a slot that was not in flight (ignored): a provider or engine fault, never expected.
  std::uint64_t stray_returns() const noexcept { return stray_returns_; }

  /// Runs f(slot) for every post the provider holds (to doom them, or see their generations).
  template <typename F>
  void for_each_in_flight(F&& f) {
    for (std::size_t i = 0; i < window_; ++i)
      if (slots_[i].in_flight) f(slots_[i]);
  }

 private:
  bool take_back(SegmentSlot& slot) noexcept;
  void keep_first(std::error_code error, int provider_errno, std::string&& detail);

  std::array<SegmentSlot, max_window> slots_{};
  void* owner_ = nullptr;
  std::size_t total_ = 0;
  std::size_t window_ = 1;
  std::size_t in_flight_ = 0;
  std::size_t posts_ = 0;
  std::size_t returns_ = 0;
  std::size_t bytes_posted_ = 0;
  std::size_t bytes_done_ = 0;
  std::uint64_t stray_returns_ = 0;
  std::error_code error_;
  int provider_errno_ = 0;
  std::string detail_;  // only a failure carries one
};

}  // namespace dma::detail
