// The server's key space: values in storage registered with the fabric service, so a DMA.GET
// writes straight out of the stored bytes with no per-transfer registration. Values are
// immutable once stored: a SET replaces the entry, and a transfer or a reply still using the old
// value keeps it alive through its own copy of the region.
#pragma once

#include <dma/memory_region.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace kv {

/// Bytes charged against a limit the operator set. Thread-safe.
class Budget {
 public:
  explicit Budget(std::size_t limit) : limit_(limit) {}
  /// Charges n bytes; false (and nothing charged) when they do not fit.
  bool try_charge(std::size_t n) noexcept {
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > limit_ - std::min(used, limit_)) return false;
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    return true;
  }
  /// Charges n bytes even past the limit (for bytes that are already there).
  void charge(std::size_t n) noexcept { used_.fetch_add(n, std::memory_order_relaxed); }
  void release(std::size_t n) noexcept { used_.fetch_sub(n, std::memory_order_relaxed); }
  std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  std::size_t limit() const noexcept { return limit_; }

 private:
  const std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

/// A value's storage, charged to the value budget (`--max-memory`) from its allocation until it is
/// freed: stored, on its way in, or replaced but still held by a reply or a transfer.
class Buffer {
 public:
  /// `zeroed`: the storage a transfer fills, so that bytes a short or lying transfer did not write
  /// read as zeros, never as a former value (calloc: fresh pages come zeroed from the kernel, reused
  /// ones are cleared). Otherwise the caller overwrites every byte before anyone reads one.
  enum class Fill { zeroed, overwritten };

  /// Empty when the budget has no room for size bytes (size > 0) or the allocation fails.
  static std::optional<Buffer> allocate(std::shared_ptr<Budget> budget, std::size_t size, Fill fill) {
    if (!budget->try_charge(size)) return std::nullopt;
    void* memory = fill == Fill::zeroed ? std::calloc(size, 1) : std::malloc(size);
    if (memory == nullptr) {
      budget->release(size);
      return std::nullopt;
    }
    return Buffer(static_cast<std::byte*>(memory), size, std::move(budget));
  }
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&& other) noexcept {
    reset();
    data_ = std::move(other.data_);
    size_ = other.size_;
    budget_ = std::move(other.budget_);
    return *this;
  }
  ~Buffer() { reset(); }

  std::byte* begin() const noexcept { return data_.get(); }
  std::byte* end() const noexcept { return data_.get() + size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  Buffer(std::byte* data, std::size_t size, std::shared_ptr<Budget> budget)
      : data_(data), size_(size), budget_(std::move(budget)) {}
  void reset() noexcept {
    if (data_) budget_->release(size_);
    data_.reset();
  }

  std::unique_ptr<std::byte, Free> data_;
  std::size_t size_;
  std::shared_ptr<Budget> budget_;
};

using Region = dma::MemoryRegion<Buffer>;

/// A value's storage where the provider needs no registration of local buffers (tcp, shm): the
/// bytes in one allocation with their reference count and their charge to the value budget
/// (`--max-memory`), freed with the last copy. One allocation per value, as redis-server's
/// embedded strings: a Buffer in a Region takes three (the bytes, the storage's box, the
/// region's), and its release walks the registration cache.
class Bytes {
 public:
  Bytes() noexcept = default;
  /// Empty when the budget has no room for size bytes (size > 0) or the allocation fails.
  static std::optional<Bytes> allocate(const std::shared_ptr<Budget>& budget, std::size_t size, Buffer::Fill fill) {
    if (!budget->try_charge(size)) return std::nullopt;
    const std::size_t total = sizeof(Block) + size;
    void* memory = fill == Buffer::Fill::zeroed ? std::calloc(total, 1) : std::malloc(total);
    if (memory == nullptr) {
      budget->release(size);
      return std::nullopt;
    }
    Bytes bytes;
    bytes.block_ = new (memory) Block{{1}, budget, size};
    return bytes;
  }
  Bytes(const Bytes& other) noexcept : block_(other.block_) {
    if (block_ != nullptr) block_->references.fetch_add(1, std::memory_order_relaxed);
  }
  Bytes(Bytes&& other) noexcept : block_(std::exchange(other.block_, nullptr)) {}
  Bytes& operator=(Bytes other) noexcept {
    std::swap(block_, other.block_);
    return *this;
  }
  ~Bytes() {
    if (block_ == nullptr || block_->references.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    block_->budget->release(block_->size);
    block_->~Block();
    std::free(block_);
  }

  /// The bytes; writable only by the one who allocated them, before anyone else reads them.
  std::span<std::byte> span() const noexcept {
    return block_ == nullptr ? std::span<std::byte>()
                             : std::span<std::byte>(reinterpret_cast<std::byte*>(block_ + 1), block_->size);
  }

 private:
  struct alignas(16) Block {
    std::atomic<std::uint32_t> references;
    std::shared_ptr<Budget> budget;  ///< kept alive by its values: a reply may outlive the server's own
    std::size_t size;
  };
  Block* block_ = nullptr;
};

/// A stored value (or one on its way in): its bytes in a Region where the provider needs local
/// registration (efa), else in Bytes.
struct Value {
  Region region;  ///< registered storage, or empty
  Bytes storage;  ///< unregistered storage, or empty
  std::size_t length = 0;
  std::uint32_t crc = 0;  ///< CRC-32C of the bytes, taken when they arrived

  /// The value's bytes (writable by the one who allocated them, before the value is stored).
  std::span<std::byte> writable() const noexcept {
    if (length == 0) return {};
    return region ? region.bytes().first(length) : storage.span().first(length);
  }
  std::span<const std::byte> bytes() const noexcept { return writable(); }
};

/// A string-keyed map with heterogeneous lookup. Thread-safe. Its values' memory is charged to
/// their Buffers' budget, not here.
class Store {
 public:
  /// Stores a value, releasing the value it replaces (its memory goes with the last holder).
  void put(std::string_view key, Value value) {
    std::lock_guard lock(mutex_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      stored_ += value.length;
      map_.emplace(std::string(key), std::move(value));
      return;
    }
    stored_ = stored_ - it->second.length + value.length;
    std::swap(it->second, value);  // the old value is dropped outside the map's slot
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
    stored_ -= it->second.length;
    map_.erase(it);
    return true;
  }
  void clear() {
    std::lock_guard lock(mutex_);
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

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>()(s); }
  };
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Value, Hash, std::equal_to<>> map_;
  std::size_t stored_ = 0;
};

}  // namespace kv
