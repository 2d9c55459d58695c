#include "copy_buffers.hpp"

#include <cstdlib>

namespace dma_module {

CopyBuffers::~CopyBuffers() {
  for (const auto& buffer : drain())
    std::free(buffer.data);
}

CopyBuffers::Buffer CopyBuffers::take(std::size_t length, std::chrono::steady_clock::time_point now) {
  last_taken_ = now;
  if (const auto it = kept_buffers_.lower_bound(length); it != kept_buffers_.end() && it->first - length <= length / 8) {
    const Buffer buffer{it->second, it->first};
    kept_ -= it->first;
    kept_buffers_.erase(it);
    ++reused_;
    return buffer;
  }
  return {static_cast<std::byte*>(std::malloc(length)), length};
}

std::optional<CopyBuffers::Buffer> CopyBuffers::give(Buffer buffer) {
  if (buffer.data == nullptr) return std::nullopt;
  if (kept_ + buffer.capacity > limit_) return buffer;
  kept_buffers_.emplace(buffer.capacity, buffer.data);
  kept_ += buffer.capacity;
  return std::nullopt;
}

std::vector<CopyBuffers::Buffer> CopyBuffers::drain() {
  std::vector<Buffer> buffers;
  buffers.reserve(kept_buffers_.size());
  for (const auto& [capacity, data] : kept_buffers_)
    buffers.push_back({data, capacity});
  kept_buffers_.clear();
  kept_ = 0;
  return buffers;
}

}  // namespace dma_module
