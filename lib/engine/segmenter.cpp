#include "segmenter.hpp"

#include <dma/error.hpp>

#include <rdma/fi_errno.h>

namespace dma::detail {
namespace {

std::error_code shape_error(ShapeError error) noexcept {
  switch (error) {
    case ShapeError::none:
      return {};
    case ShapeError::no_remote_segment:
      return errc::no_remote_segment;
    case ShapeError::lengths_differ:
      return errc::segment_lengths_differ;
    case ShapeError::local_range_overflows:
    case ShapeError::total_overflows:
      return errc::operand_range_overflows;
    case ShapeError::remote_range_overflows:
      return errc::remote_range_overflows;
    case ShapeError::zero_limit:
      return errc::invalid_configuration;
  }
  return errc::invalid_configuration;
}

}  // namespace

SegmentedTransfer* Segmenter::take() {
  if (free_ != nullptr) return std::exchange(free_, free_->next_free);
  blocks_.push_back(std::make_unique<SegmentedTransfer>());
  return blocks_.back().get();
}

std::error_code Segmenter::plan(Operation& op, Describe describe_buffer, void* host, std::string& detail) {
  SegmentedTransfer& s = *take();
  s.next_free = nullptr;
  state(op).segments = &s;
  auto refuse = [&](std::error_code ec, std::string text) {
    detail = std::move(text);
    release(op);
    return ec;
  };

  // The local side: the operand's list, or its one buffer.
  s.local.clear();
  if ((op.lists & local_list) != 0) {
    if (s.buffers.size() < 16) s.buffers.resize(16);
    std::size_t count = op.functions->local_buffers(op, s.buffers);
    if (count > s.buffers.size()) {
      s.buffers.resize(count);
      count = op.functions->local_buffers(op, s.buffers);
    }
    for (std::size_t i = 0; i < count && i < s.buffers.size(); ++i)
      s.local.push_back({s.buffers[i].data(), s.buffers[i].size(), nullptr});
  } else {
    s.local.push_back({op.buffer, op.length, nullptr});
  }
  // The remote side: the operand's segments, or the request's one.
  s.remote.clear();
  if ((op.lists & remote_list) != 0) {
    for (const dma::RemoteSegment& segment : op.functions->remote_segments(op))
      s.remote.push_back({segment.remote_address, segment.length, segment.remote_key});
  } else {
    s.remote.push_back({op.request.remote_address, op.length, op.request.remote_key});
  }

  ShapeError error = ShapeError::none;
  s.plan = SegmentPlan::make(s.local, s.remote, limits_, error);
  if (error != ShapeError::none) return refuse(shape_error(error), describe(error, s.local, s.remote, limits_));

  // Each local buffer's descriptor, where the provider needs one.
  s.leases.clear();
  for (std::size_t i = 0; i < s.local.size(); ++i) {
    LocalSegment& segment = s.local[i];
    if (segment.length == 0) continue;
    std::shared_ptr<void> lease;
    std::error_code ec;
    segment.descriptor = describe_buffer(host, op, segment.base, segment.length, lease, ec);
    if (ec) {
      return refuse(
          ec, "registering local buffer " + std::to_string(i) + " of " + std::to_string(segment.length) + " bytes");
    }
    if (lease) s.leases.push_back(std::move(lease));
  }

  s.tracker.start(&op, s.plan.total(), window_);
  s.cursor = {};
  s.filled = false;
  s.redoing = false;
  s.redo_count = 0;
  return {};
}

SegmentStep Segmenter::step(Operation& op) noexcept {
  SegmentedTransfer& s = *state(op).segments;
  SegmentTracker& tracker = s.tracker;
  if (state(op).doom != Doom::none || tracker.failed())
    return tracker.in_flight() == 0 ? SegmentStep::stop : SegmentStep::wait;
  if (tracker.in_flight() >= tracker.window()) return SegmentStep::wait;
  if (s.redo_count != 0) {
    if (!s.filled) {
      s.after = s.plan.fill(s.redo[s.redo_count - 1], s.post);
      s.filled = true;
      s.redoing = true;
    }
    return SegmentStep::post;
  }
  if (tracker.all_posted()) return SegmentStep::wait;
  if (!s.filled) {
    s.after = s.plan.fill(s.cursor, s.post);
    s.filled = true;
  }
  // Immediate data tells the peer the whole write has landed: it rides on the last post, which
  // goes only once every other post has completed (delivered).
  if (op.request.immediate_data && s.plan.finished(s.after) && tracker.in_flight() != 0) return SegmentStep::wait;
  return SegmentStep::post;
}

bool Segmenter::continues(const Operation& op) noexcept {
  const SegmentedTransfer& s = *state(op).segments;
  if (!s.filled || s.redoing || s.plan.finished(s.after) || s.tracker.in_flight() + 1 >= s.tracker.window()) {
    return false;
  }
  // The next one would be the last: with immediate data it waits for this one.
  SegmentPost next;
  return !op.request.immediate_data || !s.plan.finished(s.plan.fill(s.after, next));
}

ssize_t Segmenter::post(fid_ep* endpoint, Operation& op, fi_addr_t peer, bool more,
                        std::uint64_t transmit_flag) noexcept {
  SegmentedTransfer& s = *state(op).segments;
  SegmentSlot* slot = s.tracker.next_slot();
  if (slot == nullptr || !s.filled) return -FI_EAGAIN;  // step() said post: unreachable
  fi_msg_rma msg{};
  msg.msg_iov = s.post.iov.data();
  msg.desc = s.post.desc.data();
  msg.iov_count = s.post.iov_count;
  msg.addr = peer;
  msg.rma_iov = s.post.rma.data();
  msg.rma_iov_count = s.post.rma_count;
  msg.context = slot->as_context();
  const std::uint64_t flags = FI_COMPLETION | (more ? FI_MORE : 0);
  if (op.request.direction == Direction::ToPeer) {
    const bool last = s.plan.finished(s.after);
    std::uint64_t write = write_flags(op.request, transmit_flag);
    if (!last) write &= ~std::uint64_t{FI_REMOTE_CQ_DATA};
    msg.data = last ? op.request.immediate_data.value_or(0) : 0;
    return fi_writemsg(endpoint, &msg, flags | write);
  }
  return fi_readmsg(endpoint, &msg, flags);
}

void Segmenter::posted(Operation& op, std::uint32_t generation) noexcept {
  SegmentedTransfer& s = *state(op).segments;
  SegmentSlot* slot = s.tracker.next_slot();
  if (slot == nullptr) return;
  s.starts[slot->index] = s.redoing ? s.redo[s.redo_count - 1] : s.cursor;
  s.tracker.posted(*slot, s.post.bytes, generation);
  if (s.redoing) {
    --s.redo_count;
    s.redoing = false;
  } else {
    s.cursor = s.after;
  }
  s.filled = false;
}

bool Segmenter::hand_back(Operation& op, SegmentSlot& slot) noexcept {
  SegmentedTransfer& s = *state(op).segments;
  const SegmentCursor start = s.starts[slot.index];
  if (op.request.immediate_data) {
    SegmentPost post;
    if (s.plan.finished(s.plan.fill(start, post))) return false;
  }
  if (s.redo_count == s.redo.size() || !s.tracker.hand_back(slot)) return false;
  s.redo[s.redo_count++] = start;
  s.filled = false;  // the post filled at cursor, if any, is filled again after the redo
  s.redoing = false;
  return true;
}

Outcome Segmenter::outcome(const Operation& op) {
  const SegmentedTransfer& s = *state(op).segments;
  std::optional<std::uint32_t> crc;
  if (!s.tracker.failed() && op.request.want_checksum) crc = checksum(s.local);
  return s.tracker.outcome(crc);
}

void Segmenter::release(Operation& op) noexcept {
  SegmentedTransfer* s = std::exchange(state(op).segments, nullptr);
  if (s == nullptr) return;
  s->leases.clear();
  s->plan = {};
  s->next_free = free_;
  free_ = s;
}

}  // namespace dma::detail
