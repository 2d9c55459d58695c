#include "dma/detail/block_pool.hpp"

#include <array>
#include <cstdint>
#include <mutex>

namespace dma::detail {
namespace {

constexpr std::size_t granule = 64;
constexpr std::size_t classes = 16;               // blocks up to 1 KiB
constexpr std::size_t max_free_per_class = 4096;  // bounds what an idle burst leaves behind

struct FreeBlock {
  FreeBlock* next;
};

struct Pool {
  std::mutex mutex;
  std::array<FreeBlock*, classes> free{};
  std::array<std::size_t, classes> count{};
};

// Never destroyed: operations may be freed during static destruction.
Pool& pool() {
  static Pool* instance = new Pool;
  return *instance;
}

std::size_t class_of(std::size_t bytes) noexcept { return (bytes + granule - 1) / granule - 1; }

}  // namespace

void* pool_allocate(std::size_t bytes) {
  const std::size_t c = class_of(bytes);
  if (bytes == 0 || c >= classes) return ::operator new(bytes);
  {
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    if (FreeBlock* block = p.free[c]) {
      p.free[c] = block->next;
      --p.count[c];
      return block;
    }
  }
  return ::operator new((c + 1) * granule);
}

void pool_deallocate(void* block, std::size_t bytes) noexcept {
  if (block == nullptr) return;
  const std::size_t c = class_of(bytes);
  if (bytes == 0 || c >= classes) return ::operator delete(block);
  {
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    if (p.count[c] < max_free_per_class) {
      p.free[c] = new (block) FreeBlock{p.free[c]};
      ++p.count[c];
      return;
    }
  }
  ::operator delete(block);
}

}  // namespace dma::detail
