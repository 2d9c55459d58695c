// The server's key space: values in storage registered with the fabric service, so a DMA.GET
// writes straight out of the stored bytes with no per-transfer registration. Values are
// immutable once stored: a SET replaces the entry, and a transfer still reading the old value
// keeps it alive through its own copy of the region.
#pragma once

#include <dma/memory_region.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

namespace kv {

/// Uninitialised heap bytes: a value is written in full (by a read or a copy) before it is stored.
class Buffer {
 public:
  explicit Buffer(std::size_t size) : data_(std::make_unique_for_overwrite<std::byte[]>(size)), size_(size) {}
  std::byte* begin() const noexcept { return data_.get(); }
  std::byte* end() const noexcept { return data_.get() + size_; }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_;
};

using Region = dma::MemoryRegion<Buffer>;

struct Value {
  Region region;  ///< empty for a zero-length value
  std::size_t length = 0;
  std::uint32_t crc = 0;  ///< CRC-32C of the bytes, taken when they arrived

  std::span<const std::byte> bytes() const noexcept {
    return length == 0 ? std::span<const std::byte>() : std::span<const std::byte>(region.bytes().first(length));
  }
};

/// A string-keyed map with heterogeneous lookup and a byte budget. Thread-safe.
class Store {
 public:
  explicit Store(std::size_t max_bytes) : max_bytes_(max_bytes) {}

  /// Accounts `n` bytes against the budget ahead of an incoming value; false when they do not fit.
  bool reserve(std::size_t n) {
    std::lock_guard lock(mutex_);
    if (n > max_bytes_ - std::min(reserved_, max_bytes_)) return false;
    reserved_ += n;
    return true;
  }
  /// Returns a reservation whose value was not stored.
  void release(std::size_t n) {
    std::lock_guard lock(mutex_);
    reserved_ -= n;
  }
  /// Stores a value whose length was reserved, releasing the value it replaces.
  void put(std::string_view key, Value value) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      stored_ += value.length;
      map_.emplace(std::string(key), std::move(value));
      return;
    }
    reserved_ -= it->second.length;
    stored_ = stored_ - it->second.length + value.length;
    it->second = std::move(value);
  }
  std::optional<Value> get(std::string_view key) const {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  bool erase(std::string_view key) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    reserved_ -= it->second.length;
    stored_ -= it->second.length;
    map_.erase(it);
    return true;
  }
  void clear() {
    std::lock_guard lock(mutex_);
    for (const auto& [key, value] : map_)
      reserved_ -= value.length;
    stored_ = 0;
    map_.clear();
  }
  std::size_t keys() const {
    std::lock_guard lock(mutex_);
    return map_.size();
  }
  /// Bytes of stored values.
  std::size_t bytes() const {
    std::lock_guard lock(mutex_);
    return stored_;
  }
  std::size_t max_bytes() const noexcept { return max_bytes_; }

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>()(s); }
  };
  const std::size_t max_bytes_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Value, Hash, std::equal_to<>> map_;
  std::size_t reserved_ = 0;  ///< stored values plus values on their way in
  std::size_t stored_ = 0;
};

}  // namespace kv
