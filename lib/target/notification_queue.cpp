#include "notification_queue.hpp"

#include <stdexcept>

namespace dma::detail {

NotificationQueue::NotificationQueue(std::size_t capacity) : capacity_(capacity) {
  if (capacity == 0) throw std::invalid_argument("a notification queue needs a capacity of at least 1");
  entries_ = std::make_unique<Entry[]>(capacity);
}

bool NotificationQueue::push(const Notification& n) noexcept {
  if (size_ == capacity_) {
    ++lost_at_tail_;
    ++overflows_;
    return false;
  }
  std::size_t tail = head_ + size_;
  if (tail >= capacity_) tail -= capacity_;
  entries_[tail] = Entry{n, lost_at_tail_};
  lost_at_tail_ = 0;
  ++size_;
  return true;
}

NotificationQueue::Popped NotificationQueue::pop(Notification& out, std::uint64_t& lost) noexcept {
  if (size_ == 0) {
    if (lost_at_tail_ == 0) return Popped::nothing;
    lost = lost_at_tail_;
    lost_at_tail_ = 0;
    return Popped::lost;
  }
  Entry& entry = entries_[head_];
  if (entry.lost_before != 0) {
    lost = entry.lost_before;
    entry.lost_before = 0;
    return Popped::lost;
  }
  out = entry.notification;
  if (++head_ == capacity_) head_ = 0;
  --size_;
  return Popped::notification;
}

}  // namespace dma::detail
