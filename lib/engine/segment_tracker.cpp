#include "segment_tracker.hpp"

#include <algorithm>
#include <utility>

namespace dma::detail {

SegmentTracker::SegmentTracker() noexcept {
  for (std::size_t i = 0; i < max_window; ++i)
    slots_[i].index = static_cast<std::uint8_t>(i);
}

void SegmentTracker::start(void* owner, std::size_t total, std::size_t window) noexcept {
  for (SegmentSlot& slot : slots_) {
    slot.owner = owner;
    slot.in_flight = false;
  }
  owner_ = owner;
  total_ = total;
  window_ = std::clamp<std::size_t>(window, 1, max_window);
  in_flight_ = posts_ = returns_ = bytes_posted_ = bytes_done_ = 0;
  stray_returns_ = 0;
  error_ = {};
  provider_errno_ = 0;
  detail_.clear();
}

SegmentSlot* SegmentTracker::next_slot() noexcept {
  if (failed() || all_posted() || in_flight_ == window_) return nullptr;
  for (std::size_t i = 0; i < window_; ++i)
    if (!slots_[i].in_flight) return &slots_[i];
  return nullptr;
}

void SegmentTracker::posted(SegmentSlot& slot, std::size_t bytes, std::uint32_t generation) noexcept {
  slot.bytes = bytes;
  slot.generation = generation;
  slot.in_flight = true;
  ++in_flight_;
  ++posts_;
  bytes_posted_ += bytes;
}

bool SegmentTracker::take_back(SegmentSlot& slot) noexcept {
  if (slot.index >= window_ || &slots_[slot.index] != &slot || !slot.in_flight) {
    ++stray_returns_;
    return false;
  }
  slot.in_flight = false;
  --in_flight_;
  ++returns_;
  return true;
}

bool SegmentTracker::returned(SegmentSlot& slot) noexcept {
  if (take_back(slot)) bytes_done_ += slot.bytes;
  return finished();
}

bool SegmentTracker::returned(SegmentSlot& slot, std::error_code error, int provider_errno, std::string detail) {
  if (!error) return returned(slot);
  if (take_back(slot)) keep_first(error, provider_errno, std::move(detail));
  return finished();
}

bool SegmentTracker::hand_back(SegmentSlot& slot) noexcept {
  if (failed() || !slot.in_flight || slot.index >= window_ || &slots_[slot.index] != &slot) return false;
  (void)take_back(slot);
  bytes_posted_ -= slot.bytes;
  return true;
}

bool SegmentTracker::fail(std::error_code error, int provider_errno, std::string detail) {
  keep_first(error, provider_errno, std::move(detail));
  return finished();
}

void SegmentTracker::keep_first(std::error_code error, int provider_errno, std::string&& detail) {
  if (failed() || !error) return;
  error_ = error;
  provider_errno_ = provider_errno;
  detail_ = std::move(detail);
}

Outcome SegmentTracker::outcome(std::optional<std::uint32_t> checksum) const {
  if (failed()) return Outcome(error_, provider_errno_, detail_);
  return Outcome(TransferDone{total_, checksum});
}

}  // namespace dma::detail
