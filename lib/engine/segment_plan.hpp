// The segment planner: turns one logical transfer (several local buffers, one or several remote
// segments) into the posts a provider accepts: each post at most `iov_limit` local entries, at
// most `rma_iov_limit` remote entries and at most `max_bytes` bytes. The plan is a value over the
// caller's lists; a cursor walks it one post at a time into a fixed-size SegmentPost, so planning
// never allocates and a post refused with -FI_EAGAIN is simply filled again from the same cursor.
#pragma once

#include <rdma/fi_rma.h>
#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace dma::detail {

/// One local buffer of a transfer: the write's source or the read's landing buffer.
struct LocalSegment {
  std::byte* base = nullptr;
  std::size_t length = 0;
  void* descriptor = nullptr;  ///< fi_mr_desc of its registration, where the provider needs one
};

/// One remote segment: an advertised buffer (or part of one) on the peer.
struct RemoteSegment {
  std::uint64_t address = 0;  ///< VA on FI_MR_VIRT_ADDR providers, offset otherwise
  std::size_t length = 0;
  std::uint64_t key = 0;
};

/// What one post may carry. Limits above SegmentPost::capacity are clamped to it.
struct SegmentLimits {
  std::size_t max_bytes = SIZE_MAX;  ///< min(the provider's max_msg_size, the configured segment size)
  std::size_t iov_limit = 1;         ///< the provider's tx_attr->iov_limit
  std::size_t rma_iov_limit = 1;     ///< the provider's tx_attr->rma_iov_limit
};

/// Why a shape cannot be planned.
enum class ShapeError : std::uint8_t {
  none,
  no_remote_segment,       ///< the remote list is empty
  lengths_differ,          ///< the local buffers and the remote segments do not total the same
  local_range_overflows,   ///< a local buffer's base + length wraps around
  remote_range_overflows,  ///< a remote segment's address + length wraps around
  total_overflows,         ///< the lengths add up to more than SIZE_MAX
  zero_limit,              ///< max_bytes, iov_limit or rma_iov_limit is 0
};

/// One post, filled by SegmentPlan::fill: the arrays fi_msg_rma points at.
struct SegmentPost {
  /// The most entries per side a post carries (tcp offers 4, efa-direct 1).
  static constexpr std::size_t capacity = 8;

  std::array<iovec, capacity> iov{};
  std::array<void*, capacity> desc{};
  std::array<fi_rma_iov, capacity> rma{};
  std::size_t iov_count = 0;
  std::size_t rma_count = 0;
  std::size_t offset = 0;  ///< where in the logical transfer this post starts
  std::size_t bytes = 0;   ///< what it moves: the sum of either side's entries
};

/// Where a plan stands: the next post starts here. A value; copy it to keep a position.
struct SegmentCursor {
  std::size_t local = 0;  ///< index of the local buffer the next post starts in
  std::size_t local_offset = 0;
  std::size_t remote = 0;  ///< index of the remote segment the next post starts in
  std::size_t remote_offset = 0;
  std::size_t done = 0;   ///< bytes planned before this position
  std::size_t posts = 0;  ///< posts planned before this position

  friend bool operator==(const SegmentCursor&, const SegmentCursor&) = default;
};

/// The posts of one logical transfer. Holds views of the caller's lists, which must outlive it.
class SegmentPlan {
 public:
  SegmentPlan() = default;

  /// Whether local and remote can be planned under limits; ShapeError::none when they can.
  static ShapeError check(std::span<const LocalSegment> local, std::span<const RemoteSegment> remote,
                          SegmentLimits limits) noexcept;
  /// The plan, or an empty plan (total() 0, finished at once) with `error` set.
  static SegmentPlan make(std::span<const LocalSegment> local, std::span<const RemoteSegment> remote,
                          SegmentLimits limits, ShapeError& error) noexcept;

  /// The logical transfer's length.
  std::size_t total() const noexcept { return total_; }
  /// The limits in effect (clamped to SegmentPost::capacity).
  const SegmentLimits& limits() const noexcept { return limits_; }
  /// Whether every post has been planned from `at` (at once for a refused plan). A zero-length
  /// transfer takes exactly one post.
  bool finished(const SegmentCursor& at) const noexcept { return !valid_ || (at.posts != 0 && at.done == total_); }
  /// Fills `post` with the post that starts at `at` and returns the position after it. `at` must
  /// not be finished. Entries of length 0 are skipped, so every entry of a post moves bytes; only
  /// a zero-length transfer's single post carries one empty entry per side (the remote key still
  /// reaches the provider).
  SegmentCursor fill(const SegmentCursor& at, SegmentPost& post) const noexcept;
  /// How many posts the whole plan takes (walks it).
  std::size_t count_posts() const noexcept;

 private:
  SegmentPlan(std::span<const LocalSegment> local, std::span<const RemoteSegment> remote, SegmentLimits limits,
              std::size_t total) noexcept
      : local_(local), remote_(remote), limits_(limits), total_(total), valid_(true) {}

  std::span<const LocalSegment> local_;
  std::span<const RemoteSegment> remote_;
  SegmentLimits limits_;
  std::size_t total_ = 0;
  bool valid_ = false;
};

/// What went wrong, with the values: "local buffers total 4096 bytes, remote segments 8192".
std::string describe(ShapeError error, std::span<const LocalSegment> local, std::span<const RemoteSegment> remote,
                     SegmentLimits limits);

/// CRC-32C over the local buffers in order, as if they were one buffer (dma::checksum of their
/// concatenation).
std::uint32_t checksum(std::span<const LocalSegment> local) noexcept;

}  // namespace dma::detail
