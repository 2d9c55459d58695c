// A process-wide pool of operation-sized blocks, with a small per-thread cache in front (no lock
// when a thread frees what it allocates). The default allocator for operation state: unlike
// Asio's thread-local recycling, a block freed on the engine's thread can be reused by a submission
// from any other thread, so steady-state transfers allocate nothing whoever submits them.
#pragma once

#include <dma/export.hpp>

#include <cstddef>
#include <new>

namespace dma::detail {

/// Blocks up to max_block bytes are pooled (free lists per 64-byte size class, bounded); larger ones
/// go to operator new.
DMA_EXPORT void* pool_allocate(std::size_t bytes);
DMA_EXPORT void pool_deallocate(void* block, std::size_t bytes) noexcept;

template <typename T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() noexcept = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}  // NOLINT: allocator conversion
  T* allocate(std::size_t n) { return static_cast<T*>(pool_allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { pool_deallocate(p, n * sizeof(T)); }
  template <typename U>
  friend bool operator==(const PoolAllocator&, const PoolAllocator<U>&) noexcept {
    return true;
  }
};

}  // namespace dma::detail
