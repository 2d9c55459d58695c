// The engine's state of one transfer, kept in its Operation's engine_state bytes: the public
// Operation holds only what the header templates touch, so the engine's bookkeeping can change
// without changing the layout user binaries were compiled against.
//
// Its lifetime is the engine's hold on the operation: begin_state() when Engine::submit takes it
// (the intake links it through `next` from then on), and end_state() on its one way out, which
// complete() and destroy() below are. An operation never submitted has no state, and nothing reads
// it: a canceller compares its address with the accepted ones before it reads anything.
#pragma once

#include <dma/detail/operation.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

namespace dma::detail {

struct Peer;               // lib/engine/peer_table.hpp: the address entry a transfer goes to
struct SegmentedTransfer;  // lib/engine/segmenter.hpp: the posts of a transfer that takes several

/// Why a posted operation is to be handed back before the provider returns it by itself.
enum class Doom : std::uint8_t { none, deadline, cancelled, shutdown };

struct OperationState {
  Operation* next = nullptr;  ///< OperationQueue's link: the intake, then its peer's queue
  void* descriptor = nullptr;
  SegmentedTransfer* segments = nullptr;  ///< its posts, when it takes several (from prepare to completion)
  std::shared_ptr<void> lease;            ///< the local registration in use, when the provider needs FI_MR_LOCAL
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point accepted{};  ///< the intake reading it was accepted at
  Peer* peer = nullptr;                              ///< its address entry, from acceptance to completion
  Operation* older = nullptr;                        ///< the engine's list of accepted operations, in acceptance order
  Operation* newer = nullptr;
  std::uint32_t generation = 0;  ///< the endpoint it was posted on
  bool posted = false;           ///< handed to the provider (otherwise queued)
  /// Queued again after an endpoint closed under it for another transfer's sake (lib/engine/reclaimer.hpp).
  bool reposted = false;
  /// Failed with a broken connection it may not have broken: posted again alone to tell (lib/engine/poster.hpp).
  bool suspect = false;
  Doom doom = Doom::none;
};

static_assert(sizeof(OperationState) <= sizeof(Operation::engine_state),
              "the engine's state outgrew Operation::engine_state: grow both together, an ABI change");
static_assert(alignof(OperationState) <= alignof(std::max_align_t) &&
              offsetof(Operation, engine_state) % alignof(std::max_align_t) == 0);

/// op's state; between begin_state(op) and end_state(op) only.
inline OperationState& state(Operation& op) noexcept {
  return *std::launder(reinterpret_cast<OperationState*>(op.engine_state));
}
inline const OperationState& state(const Operation& op) noexcept {
  return *std::launder(reinterpret_cast<const OperationState*>(op.engine_state));
}

/// The engine takes op: its state begins, fresh.
inline OperationState& begin_state(Operation& op) noexcept { return *::new (op.engine_state) OperationState(); }
/// op leaves the engine: its state ends (what it held was given back before).
inline void end_state(Operation& op) noexcept { state(op).~OperationState(); }

/// op's one way out with its outcome: its state ends, then its handler is completed.
inline void complete(Operation* op, Outcome&& outcome) {
  end_state(*op);
  op->functions->complete(op, std::move(outcome));
}
/// op's one way out when nothing may run any more (the execution context is going away).
inline void destroy(Operation* op) noexcept {
  end_state(*op);
  op->functions->destroy(op);
}

/// An intrusive FIFO of operations: no allocation to queue or dequeue.
class OperationQueue {
 public:
  bool empty() const noexcept { return head_ == nullptr; }
  std::size_t size() const noexcept { return size_; }
  Operation* front() const noexcept { return head_; }
  void push_back(Operation* op) noexcept {
    state(*op).next = nullptr;
    if (tail_ != nullptr) {
      state(*tail_).next = op;
    } else {
      head_ = op;
    }
    tail_ = op;
    ++size_;
  }
  void push_front(Operation* op) noexcept {
    state(*op).next = head_;
    head_ = op;
    if (tail_ == nullptr) tail_ = op;
    ++size_;
  }
  Operation* pop_front() noexcept {
    Operation* op = head_;
    if (op == nullptr) return nullptr;
    head_ = std::exchange(state(*op).next, nullptr);
    if (head_ == nullptr) tail_ = nullptr;
    --size_;
    return op;
  }
  /// Unlinks op if it is queued; O(n), only for cancellation.
  bool remove(Operation* op) noexcept {
    Operation* previous = nullptr;
    for (Operation* it = head_; it != nullptr; previous = it, it = state(*it).next) {
      if (it != op) continue;
      (previous != nullptr ? state(*previous).next : head_) = state(*it).next;
      if (tail_ == it) tail_ = previous;
      state(*it).next = nullptr;
      --size_;
      return true;
    }
    return false;
  }
  /// Unlinks every queued operation for which pred holds and hands each to sink, in order; one pass.
  template <typename Pred, typename Sink>
  void remove_if(Pred pred, Sink sink) {
    OperationQueue kept;
    while (Operation* op = pop_front()) {
      if (pred(*op)) {
        sink(op);
      } else {
        kept.push_back(op);
      }
    }
    swap(kept);
  }
  void swap(OperationQueue& other) noexcept {
    std::swap(head_, other.head_);
    std::swap(tail_, other.tail_);
    std::swap(size_, other.size_);
  }

 private:
  Operation* head_ = nullptr;
  Operation* tail_ = nullptr;
  std::size_t size_ = 0;
};

/// Every accepted operation, queued or posted, oldest first: an intrusive doubly-linked list, so
/// linking and unlinking cost a few stores and no allocation.
class OutstandingList {
 public:
  bool empty() const noexcept { return oldest_ == nullptr; }
  std::size_t size() const noexcept { return size_; }
  Operation* oldest() const noexcept { return oldest_; }
  void push_back(Operation* op) noexcept {
    OperationState& s = state(*op);
    s.older = newest_;
    s.newer = nullptr;
    (newest_ != nullptr ? state(*newest_).newer : oldest_) = op;
    newest_ = op;
    ++size_;
  }
  void unlink(Operation* op) noexcept {
    OperationState& s = state(*op);
    (s.older != nullptr ? state(*s.older).newer : oldest_) = s.newer;
    (s.newer != nullptr ? state(*s.newer).older : newest_) = s.older;
    s.older = s.newer = nullptr;
    --size_;
  }
  /// Whether op (compared by address before anything is read through it) is in the list.
  bool contains(const Operation* op) const noexcept {
    for (const Operation* it = oldest_; it != nullptr; it = state(*it).newer)
      if (it == op) return true;
    return false;
  }

 private:
  Operation* oldest_ = nullptr;
  Operation* newest_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dma::detail
