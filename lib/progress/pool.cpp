#include "dma/pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstdio>

namespace dma {

Pool::Pool(std::size_t threads) : size_(std::max<std::size_t>(threads, 1)) {
  workers_.reserve(size_);
  try {
    for (std::size_t index = 0; index < size_; ++index)
      workers_.emplace_back([this, index] { work(index); });
  } catch (...) {
    join();
    throw;
  }
}

Pool::~Pool() { join(); }

void Pool::join() {
  const std::lock_guard join_lock(join_mutex_);
  {
    const std::lock_guard lock(submit_mutex_);
    if (closed_) return;
    closed_ = true;
  }
  // Releases the work count the thread_pool holds from construction: the workers' attach() calls
  // return once the queue is empty and no job is running.
  pool_.wait();
  for (auto& worker : workers_)
    worker.join();
}

void Pool::work(std::size_t index) {
  // Named here, by the thread itself, before it takes any job: each worker gets exactly one name.
  char name[16];  // the kernel's limit, including the terminator
  std::snprintf(name, sizeof name, "f-pool-%02zu", index);
  pthread_setname_np(pthread_self(), name);
  pool_.attach();
}

}  // namespace dma
