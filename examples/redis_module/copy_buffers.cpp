#include "copy_buffers.hpp"

#include <cstdlib>

namespace dma_module {

CopyBuffers::~CopyBuffers() {
  for (const auto& buffer : drain())
    std::free(buffer.data);
}

CopyBuffers::Buffer CopyBuffers::take(std::size_t length, std::chrono::steady_clock::time_point now) {
  last_taken_ = now;
  if (const auto it = by_size_.lower_bound(length); it != by_size_.end() && it->first - length <= length / 8) {
    const Buffer buffer{it->second.data, it->first};
    by_age_.erase(it->second.age);
    by_size_.erase(it);
    kept_ -= buffer.capacity;
    ++reused_;
    return buffer;
  }
  return {static_cast<std::byte*>(std::malloc(length)), length};
}

std::vector<CopyBuffers::Buffer> CopyBuffers::give(Buffer buffer) {
  std::vector<Buffer> gone;
  if (buffer.data == nullptr) return gone;
  if (buffer.capacity < smallest_kept || buffer.capacity > limit_) {
    gone.push_back(buffer);
    return gone;
  }
  while (kept_ + buffer.capacity > limit_) {
    const auto oldest = by_age_.begin();
    gone.push_back({oldest->second->second.data, oldest->second->first});
    kept_ -= oldest->second->first;
    by_size_.erase(oldest->second);
    by_age_.erase(oldest);
  }
  const std::uint64_t age = gives_++;
  by_age_.emplace(age, by_size_.emplace(buffer.capacity, Kept{buffer.data, age}));
  kept_ += buffer.capacity;
  return gone;
}

std::vector<CopyBuffers::Buffer> CopyBuffers::drain() {
  std::vector<Buffer> buffers;
  buffers.reserve(by_size_.size());
  for (const auto& [capacity, kept] : by_size_)
    buffers.push_back({kept.data, capacity});
  by_size_.clear();
  by_age_.clear();
  kept_ = 0;
  return buffers;
}

}  // namespace dma_module
