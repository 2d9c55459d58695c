/// @file
/// `MemoryRegion<S>`: caller storage registered once, so operands inside it skip per-transfer
/// registration; and invalidate(), the promise behind Operands::cacheable_span().
#pragma once

#include <dma/export.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

namespace dma {

/// Retires every cached registration overlapping [start, end), in every domain, at once: no later
/// operand binds to them. Each MR is closed when the last in-flight transfer using it completes.
/// Call it before unmapping, freeing to the OS, or madvise-discarding memory you promised through
/// Operands::cacheable_span(). Any thread; harmless over ranges that were never registered.
DMA_EXPORT void invalidate(std::uintptr_t start, std::uintptr_t end) noexcept;

/// Storage registered by FabricService::register_region. Copies share the region. When the last
/// copy goes, the registration is retired at once (invalidate over its range) and closed when the
/// last in-flight transfer using it ends; the storage is freed after that close, so dropping the
/// last copy while a transfer from it is in flight neither crashes nor closes it early. Keep a copy
/// in the context of each transfer whose operand lives in the region all the same: on providers
/// that need no registration (tcp) nothing else keeps the storage alive.
template <typename S>
class MemoryRegion {
 public:
  MemoryRegion() = default;

  /// The storage. Writing into it while a transfer reads it is the caller's race to avoid.
  S& storage() const noexcept { return *shared_->storage; }
  /// The registered bytes, [base(), base() + length()).
  std::span<std::byte> bytes() const noexcept {
    return {reinterpret_cast<std::byte*>(shared_->base), shared_->end - shared_->base};
  }
  /// Address of the first registered byte.
  std::uintptr_t base() const noexcept { return shared_->base; }
  /// Registered bytes.
  std::size_t length() const noexcept { return shared_->end - shared_->base; }
  /// Live copies of this region.
  long holders() const noexcept { return shared_.use_count(); }
  /// False for a default-constructed region (every other member then must not be called).
  explicit operator bool() const noexcept { return shared_ != nullptr; }

  /// Boxes storage; used by the services' register_region.
  static MemoryRegion adopt(std::shared_ptr<S> storage, std::uintptr_t base, std::uintptr_t end) {
    MemoryRegion region;
    region.shared_ = std::make_shared<Shared>(std::move(storage), base, end);
    return region;
  }

 private:
  struct Shared {
    Shared(std::shared_ptr<S> s, std::uintptr_t b, std::uintptr_t e) : storage(std::move(s)), base(b), end(e) {}
    ~Shared() { invalidate(base, end); }  // then `storage` goes, unless a registration still holds it
    Shared(const Shared&) = delete;
    Shared& operator=(const Shared&) = delete;
    std::shared_ptr<S> storage;
    std::uintptr_t base;
    std::uintptr_t end;
  };
  std::shared_ptr<Shared> shared_;
};

namespace detail {

/// The bytes of a contiguous storage type (std::vector, std::array, std::string, ...).
template <typename S>
std::span<const std::byte> storage_bytes(const S& storage) {
  return std::as_bytes(std::span(storage));
}

}  // namespace detail
}  // namespace dma
