// The segmenter: the posts of a transfer that one post cannot carry. A transfer longer than a
// post may be (the provider's max_msg_size, or Configuration::max_segment_bytes), a gather or
// scatter over several local buffers (Operands::sources(), landing()) and a transfer to several
// remote segments (Operands::remote_segments()) each get a SegmentedTransfer from a pool the
// segmenter keeps: the lists, each buffer's local descriptor, the plan (lib/engine/segment_plan.*) and
// the posts in flight (lib/engine/segment_tracker.*). Each post carries its own SegmentSlot as its
// context, so a CQ entry names the post; the operation completes once, when every post the
// provider holds has come back. Blocks are reused: after the first, a segmented transfer
// allocates nothing.
//
// Everything here runs on the engine's strand.
#pragma once

#include "operation_state.hpp"
#include "poster.hpp"
#include "segment_plan.hpp"
#include "segment_tracker.hpp"

#include <dma/transfer.hpp>

#include <rdma/fi_rma.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace dma::detail {

/// One segmented transfer's state, from its first post to its completion.
struct SegmentedTransfer {
  SegmentTracker tracker;
  SegmentPlan plan;
  SegmentCursor cursor;  ///< where the next post starts
  SegmentCursor after;   ///< where the one after `post` starts, while `filled`
  SegmentPost post;      ///< the next post, filled once and kept across -FI_EAGAIN
  bool filled = false;
  bool redoing = false;  ///< the filled post is redo[redo_count - 1], not the one at cursor
  std::array<SegmentCursor, SegmentTracker::max_window> starts{};  ///< where each slot's post in flight began
  std::array<SegmentCursor, SegmentTracker::max_window> redo{};    ///< posts handed back, to go again first
  std::size_t redo_count = 0;
  std::vector<LocalSegment> local;
  std::vector<std::span<std::byte>> buffers;  // scratch for OperationFunctions::local_buffers
  std::vector<RemoteSegment> remote;
  std::vector<std::shared_ptr<void>> leases;  ///< the local registrations in use
  SegmentedTransfer* next_free = nullptr;
};

class Segmenter {
 public:
  /// Resolves a local buffer's descriptor: null without a registration where the provider needs
  /// none; `lease` keeps the registration.
  using Describe = void* (*)(void* host, const Operation& op, std::byte* base, std::size_t length,
                             std::shared_ptr<void>& lease, std::error_code& ec);

  Segmenter() = default;
  Segmenter(const Segmenter&) = delete;
  Segmenter& operator=(const Segmenter&) = delete;

  /// What one post may carry, and how many posts of one transfer may be in flight at once.
  void set_limits(SegmentLimits limits, std::size_t window) noexcept {
    limits_ = limits;
    window_ = window;
  }
  const SegmentLimits& limits() const noexcept { return limits_; }

  /// Whether op takes the segmented path: operand lists, or more bytes than one post carries.
  bool needed(const Operation& op) const noexcept { return op.lists != 0 || op.length > limits_.max_bytes; }

  /// Builds op's segmented state: its lists, each local buffer's descriptor, the plan. On an
  /// error op gets none and `detail` says what was wrong.
  std::error_code plan(Operation& op, Describe describe_buffer, void* host, std::string& detail);

  /// What the poster may do with op now (filling its next post for SegmentStep::post).
  static SegmentStep step(Operation& op) noexcept;
  /// Whether another post of op could follow the filled one at once (for FI_MORE).
  static bool continues(const Operation& op) noexcept;
  /// Posts op's filled post to peer on endpoint; 0, -FI_EAGAIN or an error, as fi_writemsg.
  static ssize_t post(fid_ep* endpoint, Operation& op, fi_addr_t peer, bool more, std::uint64_t transmit_flag) noexcept;
  /// The provider took the filled post, on endpoint `generation`.
  static void posted(Operation& op, std::uint32_t generation) noexcept;
  /// The provider handed back op's post in `slot` unfinished (its endpoint closed for another
  /// transfer's sake): it goes again before any new post. False, and nothing changes, when it may
  /// not: the transfer failed already, or the post carries immediate data (it may have notified).
  bool hand_back(Operation& op, SegmentSlot& slot) noexcept;
  /// Every byte of op is in a post the provider took.
  static bool all_posted(const Operation& op) noexcept { return state(op).segments->tracker.all_posted(); }

  /// The outcome of a finished segmented op: its first error, or success with the whole length
  /// (and the CRC-32C over its local buffers when it asked for one).
  static Outcome outcome(const Operation& op);

  /// Gives op's block back (at its completion).
  void release(Operation& op) noexcept;

  /// Blocks made so far (each is reused).
  std::size_t blocks() const noexcept { return blocks_.size(); }

 private:
  SegmentedTransfer* take();

  SegmentLimits limits_;
  std::size_t window_ = 8;
  std::vector<std::unique_ptr<SegmentedTransfer>> blocks_;
  SegmentedTransfer* free_ = nullptr;
};

/// The owner of a post's slot.
inline Operation* owner_of(SegmentSlot& slot) noexcept { return static_cast<Operation*>(slot.owner); }

}  // namespace dma::detail
