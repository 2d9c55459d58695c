#include "dma/detail/block_pool.hpp"

#include <array>
#include <cstdint>
#include <mutex>

namespace dma::detail {
namespace {

constexpr std::size_t granule = 64;
constexpr std::size_t classes = 16;               // blocks up to 1 KiB
constexpr std::size_t max_free_per_class = 4096;  // bounds what an idle burst leaves behind
constexpr std::size_t cache_limit = 64;           // per thread and class, in front of the shared lists
constexpr std::size_t refill = 16;                // blocks a thread takes from the shared list at once
constexpr std::size_t growth = 16;                // blocks allocated beyond the one asked for, when there are none

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

// Each thread keeps a few blocks per class of its own, so that a thread that allocates and frees
// (an io_context thread resubmitting from its completion handlers) takes no lock. Trivially
// destructible and constant-initialised: usable at any point of the thread's life, including
// after `Flusher` below has handed its blocks back at thread exit (then `retired` is set).
struct Cache {
  std::array<FreeBlock*, classes> free;
  std::array<std::size_t, classes> count;
  bool armed;    ///< this thread's Flusher exists
  bool retired;  ///< this thread's Flusher has run
};
// initial-exec: a direct %fs-relative access rather than a __tls_get_addr call per use, which is
// what a shared library gets by default.
__attribute__((tls_model("initial-exec"))) thread_local Cache cache{};

// Under p.mutex: block onto the shared list of class c, or back to the system past the bound.
void give_back(Pool& p, std::size_t c, FreeBlock* block) noexcept {
  if (p.count[c] < max_free_per_class) {
    block->next = p.free[c];
    p.free[c] = block;
    ++p.count[c];
    return;
  }
  ::operator delete(block);
}

void flush(Cache& local) noexcept {
  Pool& p = pool();
  std::lock_guard lock(p.mutex);
  for (std::size_t c = 0; c < classes; ++c) {
    while (FreeBlock* block = local.free[c]) {
      local.free[c] = block->next;
      give_back(p, c, block);
    }
    local.count[c] = 0;
  }
}

// Constructed on a thread's first cached free; at thread exit it returns the thread's blocks.
struct Flusher {
  Flusher() noexcept = default;
  Flusher(const Flusher&) = delete;
  Flusher& operator=(const Flusher&) = delete;
  ~Flusher() {
    flush(cache);
    cache.retired = true;
  }
};
thread_local Flusher flusher;

// Constructs this thread's Flusher on first use (an access through its TLS wrapper), once.
void arm(Cache& local) noexcept {
  if (local.armed) return;
  (void)&flusher;
  local.armed = true;
}

}  // namespace

void* pool_allocate(std::size_t bytes) {
  const std::size_t c = class_of(bytes);
  if (bytes == 0 || c >= classes) return ::operator new(bytes);
  Cache& local = cache;
  if (FreeBlock* block = local.free[c]) {
    local.free[c] = block->next;
    --local.count[c];
    return block;
  }
  {
    Pool& p = pool();
    std::lock_guard lock(p.mutex);
    if (FreeBlock* block = p.free[c]) {
      p.free[c] = block->next;
      --p.count[c];
      // Take a few more along while the lock is held (not after thread exit: nobody would return them).
      for (std::size_t n = 0; n < refill && !local.retired && p.free[c] != nullptr; ++n) {
        FreeBlock* extra = p.free[c];
        p.free[c] = extra->next;
        --p.count[c];
        extra->next = local.free[c];
        local.free[c] = extra;
        ++local.count[c];
      }
      if (local.free[c] != nullptr) arm(local);  // make sure they go back at thread exit
      return block;
    }
  }
  // The pool is at a new high-water mark: take a few blocks more than asked for, so that the
  // jitter of a steady load (one more poll or completion in flight now and then) finds a block
  // instead of going to the system again.
  void* block = ::operator new((c + 1) * granule);
  if (!local.retired) {
    for (std::size_t n = 0; n < growth && local.count[c] < cache_limit; ++n) {
      void* more = ::operator new((c + 1) * granule, std::nothrow);
      if (more == nullptr) break;  // the one asked for is there; the rest can wait
      local.free[c] = new (more) FreeBlock{local.free[c]};
      ++local.count[c];
    }
    arm(local);
  }
  return block;
}

void pool_deallocate(void* block, std::size_t bytes) noexcept {
  if (block == nullptr) return;
  const std::size_t c = class_of(bytes);
  if (bytes == 0 || c >= classes) return ::operator delete(block);
  Cache& local = cache;
  auto* freed = new (block) FreeBlock{nullptr};
  if (!local.retired && local.count[c] < cache_limit) {
    arm(local);
    freed->next = local.free[c];
    local.free[c] = freed;
    ++local.count[c];
    return;
  }
  // The cache is full (a thread that frees what others allocate): half of it goes to the shared list.
  Pool& p = pool();
  std::lock_guard lock(p.mutex);
  give_back(p, c, freed);
  for (std::size_t n = 0; n < cache_limit / 2 && local.free[c] != nullptr; ++n) {
    FreeBlock* moved = local.free[c];
    local.free[c] = moved->next;
    --local.count[c];
    give_back(p, c, moved);
  }
}

}  // namespace dma::detail
