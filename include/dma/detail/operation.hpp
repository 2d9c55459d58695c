// One transfer's state, as the engine sees it. The typed part (context, handler) lives in a class
// derived in asynchronous.hpp; the engine reaches it through the function pointers below, so no
// lookup table and no virtual call stands between a CQ entry and its completion.
#pragma once

#include <dma/error.hpp>
#include <dma/transfer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>
#include <type_traits>
#include <vector>

namespace dma::detail {

struct Operation;
struct Peer;               // lib/peer_table.hpp: the address entry a transfer goes to
struct SegmentedTransfer;  // lib/segmenter.hpp: the posts of a transfer that takes several

/// The head of every context the engine hands libfabric, so a CQ entry tells what it returns:
/// an Operation posted whole, or one post (a SegmentSlot) of a segmented transfer.
struct PostContext {
  /// Provider scratch (FI_CONTEXT2 on efa-direct), the size and alignment of libfabric's
  /// fi_context2 (lib/ checks): first, so the pointer libfabric hands back in a CQ entry is the
  /// context itself.
  alignas(void*) std::byte provider_context[8 * sizeof(void*)]{};
  bool segment = false;  ///< a SegmentSlot (lib/segment_tracker.hpp), not an Operation

  static const PostContext& of(const void* context) noexcept { return *static_cast<const PostContext*>(context); }
};

static_assert(std::is_standard_layout_v<PostContext>);

/// What resolve() found besides one contiguous operand (Operation::lists).
enum OperandLists : std::uint8_t {
  local_list = 1,   ///< several local buffers: Operands::sources() or Operands::landing()
  remote_list = 2,  ///< several remote segments: Operands::remote_segments()
};

/// Why a posted operation is to be handed back before the provider returns it by itself.
enum class Doom : std::uint8_t { none, deadline, cancelled, shutdown };

struct OperationFunctions {
  /// Resolves the local operand from the caller's context (on the engine's strand); errc{} when
  /// it is usable.
  dma::errc (*resolve)(Operation& op);
  /// Frees the operation, then hands the Completion to the handler's executor.
  void (*complete)(Operation* op, Outcome&& outcome);
  /// Frees the operation without invoking anything (the execution context is going away).
  void (*destroy)(Operation* op);
  /// The caller's cacheable span, asked only on a registration-cache miss.
  std::optional<CacheableSpan> (*cacheable_span)(const Operation& op);
  /// Copies up to out.size() of the local buffers (Operands::sources() or landing(), the last
  /// one cut at the transfer's length) into out and returns how many there are; asked only
  /// when resolve() set OperandLists::local_list.
  std::size_t (*local_buffers)(Operation& op, std::span<std::span<std::byte>> out);
  /// Operands::remote_segments(); asked only when resolve() set OperandLists::remote_list.
  std::span<const dma::RemoteSegment> (*remote_segments)(const Operation& op);
};

struct Operation {
  Operation() noexcept = default;
  Operation(const OperationFunctions* table, const TransferFields& fields) noexcept
      : functions(table), request(fields) {}

  /// Must stay the first member: the pointer libfabric hands back in a CQ entry is the
  /// operation itself.
  PostContext head;
  const OperationFunctions* functions = nullptr;
  Operation* next = nullptr;

  TransferFields request;  ///< as submitted

  // Filled in on the strand.
  std::byte* buffer = nullptr;  ///< the operand; null when it is a list (OperandLists::local_list)
  std::size_t length = 0;       ///< the transfer's: a write's source size, a read's requested length
  void* descriptor = nullptr;
  SegmentedTransfer* segments = nullptr;  ///< its posts, when it takes several (from prepare to completion)
  std::uint8_t lists = 0;                 ///< OperandLists bits, from resolve()
  std::shared_ptr<void> lease;            ///< the local registration in use, when the provider needs FI_MR_LOCAL
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point accepted{};  ///< the intake reading it was accepted at
  Peer* peer = nullptr;                              ///< its address entry, from acceptance to completion
  Operation* older = nullptr;                        ///< the engine's list of accepted operations, in acceptance order
  Operation* newer = nullptr;
  std::uint32_t generation = 0;  ///< the endpoint it was posted on
  bool posted = false;           ///< handed to the provider (otherwise queued)
  /// Queued again after an endpoint closed under it for another transfer's sake (lib/reclaimer.hpp).
  bool reposted = false;
  /// Failed with a broken connection it may not have broken: posted again alone to tell (lib/poster.hpp).
  bool suspect = false;
  Doom doom = Doom::none;
  std::uint64_t sequence = 0;  ///< tells a recycled address from the operation a canceller saw

  static Operation* from_context(void* context) noexcept { return static_cast<Operation*>(context); }
  void* as_context() noexcept { return this; }
};

static_assert(std::is_standard_layout_v<Operation>, "PostContext must be at offset 0 of Operation");

/// An intrusive FIFO of operations: no allocation to queue or dequeue.
class OperationQueue {
 public:
  bool empty() const noexcept { return head_ == nullptr; }
  std::size_t size() const noexcept { return size_; }
  Operation* front() const noexcept { return head_; }
  void push_back(Operation* op) noexcept {
    op->next = nullptr;
    if (tail_ != nullptr) {
      tail_->next = op;
    } else {
      head_ = op;
    }
    tail_ = op;
    ++size_;
  }
  void push_front(Operation* op) noexcept {
    op->next = head_;
    head_ = op;
    if (tail_ == nullptr) tail_ = op;
    ++size_;
  }
  Operation* pop_front() noexcept {
    Operation* op = head_;
    if (op == nullptr) return nullptr;
    head_ = op->next;
    if (head_ == nullptr) tail_ = nullptr;
    op->next = nullptr;
    --size_;
    return op;
  }
  /// Unlinks op if it is queued; O(n), only for cancellation.
  bool remove(Operation* op) noexcept {
    Operation* previous = nullptr;
    for (Operation* it = head_; it != nullptr; previous = it, it = it->next) {
      if (it != op) continue;
      (previous != nullptr ? previous->next : head_) = it->next;
      if (tail_ == it) tail_ = previous;
      it->next = nullptr;
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
    op->older = newest_;
    op->newer = nullptr;
    (newest_ != nullptr ? newest_->newer : oldest_) = op;
    newest_ = op;
    ++size_;
  }
  void unlink(Operation* op) noexcept {
    (op->older != nullptr ? op->older->newer : oldest_) = op->newer;
    (op->newer != nullptr ? op->newer->older : newest_) = op->older;
    op->older = op->newer = nullptr;
    --size_;
  }
  /// Whether op (compared by address before anything is read through it) is in the list.
  bool contains(const Operation* op) const noexcept {
    for (const Operation* it = oldest_; it != nullptr; it = it->newer)
      if (it == op) return true;
    return false;
  }

 private:
  Operation* oldest_ = nullptr;
  Operation* newest_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace dma::detail
