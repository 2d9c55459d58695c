#include "stripe.hpp"

#include "rails.hpp"

#include <dma/detail/block_pool.hpp>

#include <algorithm>
#include <new>
#include <utility>

namespace dma::detail {

StripePlan::StripePlan(std::size_t size, std::size_t parts_in, bool notify_in) noexcept
    : parts(parts_in), notify(notify_in) {
  const std::size_t tail = notify ? std::min(page, size) : 0;
  const std::size_t body = size - tail;
  std::size_t piece = (body + parts - 1) / parts;
  if (piece > page) piece = (piece + page - 1) / page * page;
  for (std::size_t k = 0; k < parts; ++k) {
    const std::size_t offset = std::min(k * piece, body);
    pieces[k] = {offset, std::min(piece, body - offset)};
  }
  if (notify) notifier = {body, tail};
}

/// One part: a transfer of its own over a piece of the caller's operand, completing into the join.
struct StripeJoin::PartOp final : Operation {
  PartOp(StripeJoin* j, const TransferFields& fields, std::span<std::byte> piece) noexcept
      : Operation(&table, fields), join(j), bytes(piece) {}

  static PartOp* make(StripeJoin* join, const TransferFields& fields, std::span<std::byte> piece) {
    return new (pool_allocate(sizeof(PartOp))) PartOp(join, fields, piece);
  }
  static void free(PartOp* op) noexcept {
    op->~PartOp();
    pool_deallocate(op, sizeof(PartOp));
  }

  static errc resolve(Operation& base) {
    auto& op = static_cast<PartOp&>(base);
    op.buffer = op.bytes.data();
    op.length = op.bytes.size();
    op.lists = 0;
    return {};
  }
  // The part is freed before the join hears of it: the join may finish and free everything.
  static void complete(Operation* base, Outcome&& outcome) {
    auto* op = static_cast<PartOp*>(base);
    StripeJoin* join = op->join;
    free(op);
    join->part_done(std::move(outcome));
  }
  static void destroy(Operation* base) {
    auto* op = static_cast<PartOp*>(base);
    StripeJoin* join = op->join;
    free(op);
    join->part_destroyed();
  }
  static std::optional<CacheableSpan> cacheable_span(const Operation& base) {
    return static_cast<const PartOp&>(base).join->cacheable_;
  }
  static std::size_t local_buffers(Operation&, std::span<std::span<std::byte>>) { return 0; }
  static std::span<const RemoteSegment> remote_segments(const Operation&) { return {}; }

  static constexpr OperationFunctions table{&resolve,        &complete,      &destroy,
                                            &cacheable_span, &local_buffers, &remote_segments};

  StripeJoin* join;
  std::span<std::byte> bytes;
};

StripeJoin::StripeJoin(std::shared_ptr<Rails> rails, Operation* caller) noexcept
    : rails_(std::move(rails)), caller_(caller), sequence_(caller->sequence) {}

void StripeJoin::start(const std::shared_ptr<Rails>& rails, Operation* caller, std::span<std::byte> operand,
                       std::size_t parts) {
  const TransferFields& fields = caller->request;
  // A read with immediate data is refused at acceptance, on the one part that carries it.
  const bool notify = fields.immediate_data.has_value() && fields.direction == Direction::ToPeer && !operand.empty();
  const StripePlan plan(operand.size(), parts, notify);
  const std::size_t carrier = notify ? parts : parts - 1;  // the one part with the value
  const std::size_t count = parts + (notify ? 1 : 0);

  // Everything is allocated before anything is submitted: a failure leaves nothing behind.
  auto* join = new (pool_allocate(sizeof(StripeJoin))) StripeJoin(rails, caller);
  std::size_t made = 0;
  try {
    if (!operand.empty()) join->cacheable_ = caller->functions->cacheable_span(*caller);
    for (; made < count; ++made) {
      const bool is_notifier = made == parts;
      const StripePlan::Piece piece = is_notifier ? plan.notifier : plan.pieces[made];
      TransferFields part = fields;
      part.want_checksum = false;  // the caller's operation computes one over the whole
      part.remote_address = fields.remote_address + piece.offset;
      part.length = piece.length;
      if (made != carrier) part.immediate_data.reset();                            // the peer hears one
      if (notify && made != carrier) part.completion = CompletionLevel::delivery;  // landed before it goes
      PartOp* op = PartOp::make(join, part, operand.subspan(piece.offset, piece.length));
      op->sequence = rails->next_sequence();
      join->parts_[made] = {is_notifier ? parts - 1 : made, op, op->sequence};
    }
  } catch (...) {
    for (std::size_t k = 0; k < made; ++k)
      PartOp::free(static_cast<PartOp*>(join->parts_[k].op));
    join->~StripeJoin();
    pool_deallocate(join, sizeof(StripeJoin));
    throw;
  }
  join->bytes_ = operand.size();
  join->count_ = count;
  join->remaining_.store(count, std::memory_order_relaxed);
  if (notify) join->notifier_ = join->parts_[parts].op;
  std::array<Operation*, max_endpoints> posted{};
  for (std::size_t k = 0; k < parts; ++k)
    posted[k] = join->parts_[k].op;
  rails->enter(*join);
  for (std::size_t k = 0; k < parts; ++k)
    rails->rail(k).submit(posted[k]);  // the last may finish the join: nothing touches it after
}

std::size_t StripeJoin::parts(std::array<Part, max_endpoints + 1>& out) const noexcept {
  std::copy_n(parts_.begin(), count_, out.begin());
  return count_;
}

void StripeJoin::part_done(Outcome&& outcome) {
  if (!outcome.ok()) {
    std::lock_guard lock(mutex_);
    if (!failed_) {
      failed_ = true;
      first_error_ = std::move(outcome);
    }
  }
  counted();
}

void StripeJoin::part_destroyed() {
  {
    std::lock_guard lock(mutex_);
    destroyed_ = true;
  }
  counted();
}

void StripeJoin::counted() {
  const std::size_t left = remaining_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  if (left == 0) return finish();
  if (left == 1 && notifier_ != nullptr) release_notifier();
}

// Every other part is back (the acq_rel count makes their errors visible here): the notifier goes
// out if they all succeeded; otherwise the write failed, no notification may claim its bytes
// landed, and the notifier is freed unposted.
void StripeJoin::release_notifier() {
  Operation* op = std::exchange(notifier_, nullptr);
  bool go = false;
  {
    std::lock_guard lock(mutex_);
    go = !failed_ && !destroyed_;
  }
  if (go) return rails_->rail(parts_[count_ - 1].rail).submit(op);
  PartOp::free(static_cast<PartOp*>(op));
  if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) finish();
}

// The last part is back: the caller's completion, once (the caller's operation adds the CRC it
// asked for). The join is freed first, so the caller's handler may submit again at once.
void StripeJoin::finish() {
  std::shared_ptr<Rails> rails = std::move(rails_);
  rails->leave(*this);
  Operation* caller = caller_;
  const bool destroyed = destroyed_;
  Outcome outcome = failed_ ? std::move(first_error_) : Outcome(TransferDone{bytes_, std::nullopt});
  this->~StripeJoin();
  pool_deallocate(this, sizeof(StripeJoin));
  if (destroyed) return caller->functions->destroy(caller);
  caller->functions->complete(caller, std::move(outcome));
}

}  // namespace dma::detail
