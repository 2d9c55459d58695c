/// @file
/// dma::Pool: a fixed set of worker threads named f-pool-NN for work that must not stall a fabric
/// worker's post/reap loop (CRC-32C of checksummed transfers and their completion hooks).
#pragma once

#include <dma/config.hpp>
#include <dma/export.hpp>

#include <asio/post.hpp>
#include <asio/thread_pool.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace dma {

/// A fixed pool of worker threads named `f-pool-00`, `f-pool-01`, … (numbering starts at 00 in
/// every pool), built over `asio::thread_pool`. Share one pool across services and keep it alive
/// longer than they are. All members are safe to call from any thread, except that join() and the
/// destructor must not run on one of the pool's own workers.
class Pool {
 public:
  /// The executor of the underlying `asio::thread_pool`, for `asio::post` and `asio::bind_executor`.
  using executor_type = asio::thread_pool::executor_type;

  /// Starts `max(threads, 1)` workers. If a thread cannot be started, the workers already running
  /// are joined and the `std::system_error` from `std::thread` propagates.
  DMA_EXPORT explicit Pool(std::size_t threads);

  /// Runs every job already submitted, then joins the workers (see join()).
  DMA_EXPORT ~Pool();

  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  /// The number of workers, `max(threads, 1)`; unchanged by join().
  std::size_t size() const noexcept { return size_; }

  /// The pool's executor. Work posted through it runs on a worker like a submitted job, but is not
  /// guarded: if it throws, Asio terminates the process. After join() it never runs; it is
  /// destroyed with the pool.
  executor_type get_executor() noexcept { return pool_.get_executor(); }

  /// Queues `job` to run once on some worker. An exception thrown by the job is caught and counted
  /// in failed_jobs(); the worker goes on with the next job. After join() (or while it is under
  /// way) the job is not run: it is destroyed by the caller, counted in dropped_jobs(), and submit
  /// returns false.
  template <typename Job>
  bool submit(Job&& job) {
    static_assert(std::is_invocable_v<std::decay_t<Job>&>, "a job is called with no arguments");
    // Under the lock so that join() cannot close the pool between the check and the post.
    const std::lock_guard lock(submit_mutex_);
    if (closed_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    asio::post(pool_, [this, job = std::forward<Job>(job)]() mutable {
      try {
        job();
      } catch (...) {
        failed_.fetch_add(1, std::memory_order_relaxed);
      }
    });
    return true;
  }

  /// Jobs submitted with submit() that threw.
  std::uint64_t failed_jobs() const noexcept { return failed_.load(std::memory_order_relaxed); }

  /// Jobs submitted with submit() after join() had begun, and therefore never run.
  std::uint64_t dropped_jobs() const noexcept { return dropped_.load(std::memory_order_relaxed); }

  /// Closes the pool to new jobs, waits until every job already submitted has run, then joins the
  /// workers. Idempotent; a second caller waits for the first to finish. The destructor calls it.
  DMA_EXPORT void join();

 private:
  void work(std::size_t index);

  std::size_t size_;
  asio::thread_pool pool_{0};  // no threads of its own: ours attach() so that each is named once
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;
  bool closed_ = false;  // guarded by submit_mutex_
  std::mutex join_mutex_;
  std::atomic<std::uint64_t> failed_{0};
  std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace dma
