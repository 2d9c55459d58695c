#include "segment_plan.hpp"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>

namespace dma::detail {
namespace {

template <typename Segment>
bool wraps(std::uint64_t start, const Segment& segment) noexcept {
  return segment.length > UINT64_MAX - start;
}

// The sum of the lengths, or false when it exceeds SIZE_MAX.
template <typename Segment>
bool add_lengths(std::span<const Segment> side, std::size_t& total) noexcept {
  total = 0;
  for (const Segment& segment : side) {
    if (segment.length > SIZE_MAX - total) return false;
    total += segment.length;
  }
  return true;
}

// How many bytes, up to budget, the entries from (index, offset) cover when at most `limit` of
// them (empty ones do not count) go into one post.
template <typename Segment>
std::size_t reach(std::span<const Segment> side, std::size_t index, std::size_t offset, std::size_t budget,
                  std::size_t limit) noexcept {
  std::size_t covered = 0;
  for (std::size_t used = 0; index < side.size() && used < limit && covered < budget; ++index, offset = 0) {
    const std::size_t left = side[index].length - offset;
    if (left == 0) continue;
    covered += std::min(left, budget - covered);
    ++used;
  }
  return covered;
}

// Hands emit(segment, offset, length) the pieces that make up the next `bytes` bytes from
// (index, offset), and moves the position past them (never left at the end of an entry).
template <typename Segment, typename Emit>
void take(std::span<const Segment> side, std::size_t& index, std::size_t& offset, std::size_t bytes,
          Emit emit) noexcept {
  while (bytes > 0) {
    const Segment& segment = side[index];
    const std::size_t piece = std::min(segment.length - offset, bytes);
    if (piece != 0) emit(segment, offset, piece);
    bytes -= piece;
    offset += piece;
    if (offset == segment.length) {
      ++index;
      offset = 0;
    }
  }
}

}  // namespace

ShapeError SegmentPlan::check(std::span<const LocalSegment> local, std::span<const RemoteSegment> remote,
                              SegmentLimits limits) noexcept {
  if (limits.max_bytes == 0 || limits.iov_limit == 0 || limits.rma_iov_limit == 0) return ShapeError::zero_limit;
  if (remote.empty()) return ShapeError::no_remote_segment;
  for (const LocalSegment& segment : local)
    if (wraps(reinterpret_cast<std::uintptr_t>(segment.base), segment)) return ShapeError::local_range_overflows;
  for (const RemoteSegment& segment : remote)
    if (wraps(segment.address, segment)) return ShapeError::remote_range_overflows;
  std::size_t local_total = 0;
  std::size_t remote_total = 0;
  if (!add_lengths(local, local_total) || !add_lengths(remote, remote_total)) return ShapeError::total_overflows;
  return local_total == remote_total ? ShapeError::none : ShapeError::lengths_differ;
}

SegmentPlan SegmentPlan::make(std::span<const LocalSegment> local, std::span<const RemoteSegment> remote,
                              SegmentLimits limits, ShapeError& error) noexcept {
  error = check(local, remote, limits);
  if (error != ShapeError::none) return {};
  limits.iov_limit = std::min(limits.iov_limit, SegmentPost::capacity);
  limits.rma_iov_limit = std::min(limits.rma_iov_limit, SegmentPost::capacity);
  std::size_t total = 0;
  (void)add_lengths(local, total);
  return SegmentPlan(local, remote, limits, total);
}

SegmentCursor SegmentPlan::fill(const SegmentCursor& at, SegmentPost& post) const noexcept {
  SegmentCursor next = at;
  ++next.posts;
  post.offset = at.done;
  if (total_ == 0) {
    // One empty post, so the peer's key is still checked as for any other transfer.
    post.iov[0] = iovec{local_.empty() ? nullptr : local_[0].base, 0};
    post.desc[0] = local_.empty() ? nullptr : local_[0].descriptor;
    post.rma[0] = fi_rma_iov{remote_[0].address, 0, remote_[0].key};
    post.iov_count = post.rma_count = 1;
    post.bytes = 0;
    return next;
  }
  const std::size_t budget = std::min(limits_.max_bytes, total_ - at.done);
  const std::size_t bytes = std::min(reach(local_, at.local, at.local_offset, budget, limits_.iov_limit),
                                     reach(remote_, at.remote, at.remote_offset, budget, limits_.rma_iov_limit));
  post.iov_count = post.rma_count = 0;
  take(local_, next.local, next.local_offset, bytes, [&](const LocalSegment& s, std::size_t offset, std::size_t n) {
    post.iov[post.iov_count] = iovec{s.base + offset, n};
    post.desc[post.iov_count++] = s.descriptor;
  });
  take(remote_, next.remote, next.remote_offset, bytes, [&](const RemoteSegment& s, std::size_t offset, std::size_t n) {
    post.rma[post.rma_count++] = fi_rma_iov{s.address + offset, n, s.key};
  });
  post.bytes = bytes;
  next.done += bytes;
  return next;
}

std::size_t SegmentPlan::count_posts() const noexcept {
  SegmentPost post;
  SegmentCursor at;
  while (!finished(at))
    at = fill(at, post);
  return at.posts;
}

std::string describe(ShapeError error, std::span<const LocalSegment> local, std::span<const RemoteSegment> remote,
                     SegmentLimits limits) {
  std::size_t local_total = 0;
  std::size_t remote_total = 0;
  const bool local_sums = add_lengths(local, local_total);
  (void)add_lengths(remote, remote_total);
  switch (error) {
    case ShapeError::none:
      return "the shape can be planned";
    case ShapeError::no_remote_segment:
      return "the transfer names no remote segment";
    case ShapeError::lengths_differ:
      return std::to_string(local.size()) + " local buffers total " + std::to_string(local_total) + " bytes, " +
             std::to_string(remote.size()) + " remote segments " + std::to_string(remote_total);
    case ShapeError::local_range_overflows:
      for (std::size_t i = 0; i < local.size(); ++i)
        if (wraps(reinterpret_cast<std::uintptr_t>(local[i].base), local[i]))
          return "local buffer " + std::to_string(i) + " of " + std::to_string(local[i].length) +
                 " bytes wraps around the address space";
      break;
    case ShapeError::remote_range_overflows:
      for (std::size_t i = 0; i < remote.size(); ++i)
        if (wraps(remote[i].address, remote[i]))
          return "remote segment " + std::to_string(i) + " at " + std::to_string(remote[i].address) + " of " +
                 std::to_string(remote[i].length) + " bytes wraps around";
      break;
    case ShapeError::total_overflows:
      return std::string("the ") + (local_sums ? "remote segments'" : "local buffers'") +
             " lengths add up to more than SIZE_MAX";
    case ShapeError::zero_limit:
      return "segment limits must be positive: max_bytes " + std::to_string(limits.max_bytes) + ", iov_limit " +
             std::to_string(limits.iov_limit) + ", rma_iov_limit " + std::to_string(limits.rma_iov_limit);
  }
  return "the shape cannot be planned";
}

std::uint32_t checksum(std::span<const LocalSegment> local) noexcept {
  // ISA-L's crc32_iscsi neither pre- nor post-inverts, so buffers chain through the raw value.
  std::uint32_t crc = 0xFFFFFFFFu;
  for (const LocalSegment& segment : local) {
    auto* data = reinterpret_cast<unsigned char*>(segment.base);
    for (std::size_t left = segment.length; left > 0;) {
      const int chunk = left > static_cast<std::size_t>(INT_MAX) ? INT_MAX : static_cast<int>(left);
      crc = crc32_iscsi(data, chunk, crc);
      data += chunk;
      left -= static_cast<std::size_t>(chunk);
    }
  }
  return crc ^ 0xFFFFFFFFu;
}

}  // namespace dma::detail
