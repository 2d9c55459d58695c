// Threads the main thread hands work to without ever waiting for one of them, and waking them
// once per event-loop iteration at most. A thread pool's queue is a mutex and a condition
// variable: a main thread that posts to it can block behind a worker holding that mutex while the
// kernel has the worker preempted, and each post wakes a worker (a system call and an
// inter-processor interrupt, tens of microseconds on a virtual machine). Here each worker has a
// queue of its own that a job is pushed onto with one compare-and-swap, and the workers never take
// a lock the poster takes. Posting wakes nobody: wake(), called once per event-loop iteration
// (before the server sleeps), wakes the worker that iteration's jobs went to, if it may be asleep,
// and the next iteration's jobs go to the next worker.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dma_module {

class ValueWorkers {
 public:
  using Job = std::function<void()>;

  /// Starts `threads` workers (at least one), named `<name>-NN`; each runs `on_start` first.
  ValueWorkers(std::size_t threads, const char* name, std::function<void()> on_start = {});
  /// join().
  ~ValueWorkers();
  ValueWorkers(const ValueWorkers&) = delete;
  ValueWorkers& operator=(const ValueWorkers&) = delete;

  /// Queues `job` on this iteration's worker without waking it (see wake()). False, and the job
  /// is not run, after join() began. A job that throws is counted in failed() and the worker
  /// goes on. post() and wake() are called by one thread at a time.
  bool post(Job job);

  /// Wakes the worker the jobs posted since the last call went to, if any and if it may be
  /// asleep, and turns to the next worker for the jobs that follow.
  void wake();

  /// Closes to new jobs, lets every worker run the jobs queued before, and joins them. Idempotent.
  void join();

  std::size_t size() const noexcept { return workers_.size(); }
  std::uint64_t ran() const noexcept { return ran_.load(std::memory_order_relaxed); }
  std::uint64_t failed() const noexcept { return failed_.load(std::memory_order_relaxed); }

 private:
  struct Node {
    Node* next = nullptr;
    Job job;  ///< empty: the worker stops here
  };
  struct Worker {
    std::atomic<Node*> head{nullptr};  ///< jobs pushed, newest first
    std::thread thread;
  };

  static bool push(Worker& worker, Node* node);
  void run(Worker& worker);

  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex post_mutex_;  ///< posters and join(), never the workers
  bool closed_ = false;
  std::size_t current_ = 0;  ///< the worker this iteration's jobs go to
  bool posted_ = false;      ///< a job went to it since the last wake()
  bool may_sleep_ = false;   ///< one of them found its queue empty: the worker may be asleep
  std::atomic<std::uint64_t> ran_{0}, failed_{0};
};

}  // namespace dma_module
