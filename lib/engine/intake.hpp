// The engine's intake: what submit() hands over, from any thread, until the strand accepts it.
// Other threads' submissions wait under a mutex, and one strand post takes a whole batch; a
// handler that a pass runs inline resubmits into that pass without the lock (strand only).
#pragma once

#include "operation_state.hpp"

#include <atomic>
#include <mutex>

namespace dma::detail {

class Intake {
 public:
  /// Any thread. True when the caller must post the strand's take (none is scheduled yet).
  bool push(Operation* op) {
    std::lock_guard lock(mutex_);
    waiting_.push_back(op);
    any_waiting_.store(true, std::memory_order_release);
    const bool schedule = !scheduled_;
    scheduled_ = true;
    return schedule;
  }
  /// On the strand, from a handler inside a pass: joins that pass.
  void push_joined(Operation* op) noexcept { joined_.push_back(op); }

  /// On the strand, when the posted take runs: the next push() posts again.
  void taken() {
    std::lock_guard lock(mutex_);
    scheduled_ = false;
  }
  /// On the strand: other threads' submissions so far (no lock when nothing waits).
  OperationQueue take_waiting() {
    OperationQueue batch;
    if (!any_waiting_.load(std::memory_order_acquire)) return batch;
    std::lock_guard lock(mutex_);
    batch.swap(waiting_);
    any_waiting_.store(false, std::memory_order_relaxed);
    return batch;
  }
  /// On the strand: the next resubmission of the running pass, or null.
  Operation* pop_joined() noexcept { return joined_.pop_front(); }
  bool joined_empty() const noexcept { return joined_.empty(); }

 private:
  std::mutex mutex_;
  OperationQueue waiting_;                ///< other threads' submissions (under mutex_)
  std::atomic<bool> any_waiting_{false};  ///< waiting_ is not empty (written under mutex_)
  bool scheduled_ = false;                ///< a take is posted (under mutex_)
  OperationQueue joined_;                 ///< resubmitted inside a pass (strand only)
};

}  // namespace dma::detail
