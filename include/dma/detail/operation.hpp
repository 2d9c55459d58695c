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
#include <optional>
#include <span>
#include <system_error>
#include <type_traits>
#include <vector>

namespace dma::detail {

struct Operation;

/// The head of every context the engine hands libfabric, so a CQ entry tells what it returns:
/// an Operation posted whole, or one post (a SegmentSlot) of a segmented transfer.
struct PostContext {
  /// Provider scratch (FI_CONTEXT2 on efa-direct), the size and alignment of libfabric's
  /// fi_context2 (lib/ checks): first, so the pointer libfabric hands back in a CQ entry is the
  /// context itself.
  alignas(void*) std::byte provider_context[8 * sizeof(void*)]{};
  bool segment = false;  ///< a SegmentSlot (lib/engine/segment_tracker.hpp), not an Operation

  static const PostContext& of(const void* context) noexcept { return *static_cast<const PostContext*>(context); }
};

static_assert(std::is_standard_layout_v<PostContext>);

/// What resolve() found besides one contiguous operand (Operation::lists).
enum OperandLists : std::uint8_t {
  local_list = 1,   ///< several local buffers: Operands::sources() or Operands::landing()
  remote_list = 2,  ///< several remote segments: Operands::remote_segments()
};

struct OperationFunctions {
  /// Resolves the local operand from the caller's context (on the engine's strand), or takes what
  /// a service with several endpoints resolved in submit(); errc{} when it is usable.
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

struct Operation {  // NOLINT(cppcoreguidelines-pro-type-member-init): engine_state, below
  // engine_state is raw storage the engine constructs its state into: nothing to initialise.
  Operation() noexcept = default;  // NOLINT(cppcoreguidelines-pro-type-member-init)
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  Operation(const OperationFunctions* table, const TransferFields& fields) noexcept
      : functions(table), request(fields) {}
  // engine_state may hold objects the engine constructed in place: bytes are no copy of them.
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

  /// Must stay the first member: the pointer libfabric hands back in a CQ entry is the
  /// operation itself.
  PostContext head;
  const OperationFunctions* functions = nullptr;

  TransferFields request;  ///< as submitted

  // Filled in by functions->resolve: on the strand, or in submit() with several endpoints.
  std::byte* buffer = nullptr;  ///< the operand; null when it is a list (OperandLists::local_list)
  std::size_t length = 0;       ///< the transfer's: a write's source size, a read's requested length
  std::uint8_t lists = 0;       ///< OperandLists bits, from resolve()
  std::uint64_t sequence = 0;   ///< tells a recycled address from the operation a canceller saw
  /// Resolved already, in submit() of a service with several endpoints: functions->resolve
  /// returns early_error instead of asking the context again.
  bool resolved_early = false;
  dma::errc early_error{};

  /// The engine's own state of the transfer (its queues, peer, deadline, registration, posts),
  /// opaque here so that the engine can change without changing this layout: begun when the
  /// engine takes the operation, ended before it completes or destroys it (lib/engine/operation_state.hpp).
  alignas(std::max_align_t) std::byte engine_state[128];

  static Operation* from_context(void* context) noexcept { return static_cast<Operation*>(context); }
  void* as_context() noexcept { return this; }
};

static_assert(std::is_standard_layout_v<Operation>, "PostContext must be at offset 0 of Operation");

}  // namespace dma::detail
