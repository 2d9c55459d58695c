// Striping: one transfer split across a service's endpoints, each part a transfer of its own on
// its own endpoint, joined into the caller's one completion. The parts are ordinary transfers:
// each has the endpoint's credits, the request's deadline and its own errors. The join keeps the
// first error; the caller's operation completes once, after every part came back. A striped
// write with immediate data sends its notification on one more part, the write's last page,
// posted only once every other part has completed with delivery completion: parts on different
// endpoints travel on different connections, so nothing else orders them before the Target's
// completion entry. Joins and parts come from the library's block pool, so a steady stream of
// striped transfers allocates nothing.
#pragma once

#include <dma/detail/operation.hpp>
#include <dma/transfer.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

namespace dma::detail {

class Rails;

/// The most endpoints one service opens (Configuration::endpoints).
inline constexpr std::size_t max_endpoints = 16;

/// Where each part of a striped transfer goes: pieces of whole 4 KiB pages where there are
/// enough, the last one shorter; with a notifier, the operand's last page (at most) apart.
struct StripePlan {
  static constexpr std::size_t page = 4096;
  struct Piece {
    std::size_t offset = 0;
    std::size_t length = 0;
  };
  /// Plans `parts` pieces of an operand of `size` bytes, and the notifier's when `notify`.
  StripePlan(std::size_t size, std::size_t parts, bool notify) noexcept;
  std::array<Piece, max_endpoints> pieces{};  ///< piece k goes to endpoint k
  std::size_t parts = 0;
  bool notify = false;
  Piece notifier{};  ///< on the last endpoint, after every piece completed
};

/// The caller's transfer while its parts are out.
class StripeJoin {
 public:
  /// Splits caller (resolved, a contiguous operand of operand.size() bytes; empty for a warm-up)
  /// into `parts` transfers, one per endpoint of rails, and submits them. caller completes once,
  /// when all are back.
  static void start(const std::shared_ptr<Rails>& rails, Operation* caller, std::span<std::byte> operand,
                    std::size_t parts);

  /// Whether this join is the one a canceller of (caller, sequence) saw.
  bool is(const Operation* caller, std::uint64_t sequence) const noexcept {
    return caller_ == caller && sequence_ == sequence;
  }
  /// One part, for a cancellation: the endpoint it went to, the operation, its sequence.
  struct Part {
    std::size_t rail = 0;
    Operation* op = nullptr;
    std::uint64_t sequence = 0;
  };
  /// Copies the parts a cancellation cancels into out, and returns how many.
  std::size_t parts(std::array<Part, max_endpoints + 1>& out) const noexcept;

  StripeJoin* older = nullptr;  ///< Rails's list of the stripes out
  StripeJoin* newer = nullptr;

  StripeJoin(std::shared_ptr<Rails> rails, Operation* caller) noexcept;

 private:
  struct PartOp;

  void part_done(Outcome&& outcome);
  void part_destroyed();
  void release_notifier();
  void counted();
  void finish();

  std::shared_ptr<Rails> rails_;
  Operation* caller_;
  std::uint64_t sequence_;
  std::optional<CacheableSpan> cacheable_;  ///< the caller's, so parts share its registration
  std::atomic<std::size_t> remaining_{0};
  std::mutex mutex_;
  bool failed_ = false;
  bool destroyed_ = false;  ///< a part was freed unrun: the execution context is going away
  Outcome first_error_;
  std::size_t bytes_ = 0;
  std::array<Part, max_endpoints + 1> parts_{};  ///< one per endpoint, and the notifier last
  std::size_t count_ = 0;
  Operation* notifier_ = nullptr;  ///< the part with the immediate data, until it is submitted
};

}  // namespace dma::detail
