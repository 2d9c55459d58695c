// The target's queue of write notifications (writes that carried immediate data): a bounded ring
// filled by progress, emptied by waiters. Its storage is allocated once, at construction; a full
// queue drops what arrives and counts it, and the loss is reported in its place in the order: the
// waiter that would have seen the first dropped notification gets "lost" instead, then the ones
// that arrived after. Not thread-safe: the target calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace dma::detail {

/// One completion a peer's write with immediate data produced on the target's CQ.
struct Notification {
  std::uint64_t data = 0;   ///< the 64-bit value the writer sent (fi_cq_data_entry::data)
  std::size_t length = 0;   ///< fi_cq_data_entry::len: 0 where the provider does not report it (tcp)
  std::uint64_t flags = 0;  ///< fi_cq_data_entry::flags (FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA)
};

class NotificationQueue {
 public:
  /// What pop() found.
  enum class Popped : std::uint8_t {
    nothing,       ///< the queue is empty and nothing was lost
    notification,  ///< `out` holds the oldest notification
    lost,          ///< `lost` notifications were dropped here because the queue was full
  };

  /// A queue of at most `capacity` notifications (at least 1): allocates its storage now, never later.
  explicit NotificationQueue(std::size_t capacity);

  /// Appends n, or drops and counts it when the queue is full. False when dropped.
  bool push(const Notification& n) noexcept;
  /// Takes the oldest notification, or the loss that comes before it.
  Popped pop(Notification& out, std::uint64_t& lost) noexcept;

  /// Whether pop() has something for a waiter (a notification or a loss).
  bool ready() const noexcept { return size_ != 0 || lost_at_tail_ != 0; }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return capacity_; }
  /// Notifications dropped since construction.
  std::uint64_t overflows() const noexcept { return overflows_; }

 private:
  struct Entry {
    Notification notification;
    std::uint64_t lost_before = 0;  // dropped between the previous entry and this one
  };

  std::unique_ptr<Entry[]> entries_;
  std::size_t capacity_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
  std::uint64_t lost_at_tail_ = 0;  // dropped after the newest entry; goes to the next one pushed
  std::uint64_t overflows_ = 0;
};

}  // namespace dma::detail
