/// @file
/// What a caller submits and what comes back: requests, operands, outcomes, completions.
#pragma once

#include <dma/advertisement.hpp>
#include <dma/peer_address.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace dma {

/// Which way the bytes go.
enum class Direction : std::uint8_t {
  ToPeer,    ///< fi_writemsg: local bytes from Operands::source() into the peer's buffer
  FromPeer,  ///< fi_read: `length` bytes of the peer's buffer into Operands::allocate(length)
};

/// When a write counts as complete (TransferFields::completion). Reads always complete once the
/// bytes are in the local buffer. What each level guarantees depends on the provider, on every
/// libfabric version the library supports (1.17, 2.1, 2.6); EndpointInfo::delivery_confirmed
/// says which holds for an open endpoint:
///
/// | provider   | delivery                                | transmit                          |
/// |------------|-----------------------------------------|-----------------------------------|
/// | tcp        | the peer has the bytes                  | the local buffer may be reused    |
/// | shm        | the peer has the bytes                  | the local buffer may be reused    |
/// | efa-direct | as transmit: the device reports it done | the local buffer may be reused    |
///
/// On efa-direct the provider ignores FI_DELIVERY_COMPLETE; the peer's Target notification (a
/// write with immediate data, TransferFields::immediate_data) is what says the bytes landed there.
enum class CompletionLevel : std::uint8_t {
  /// The peer has the bytes (FI_DELIVERY_COMPLETE): a bad key, a range outside the peer's region
  /// or missing access rights fails this write. Not on efa-direct, which completes every write
  /// as `transmit`: there, have the peer answer after its Target's notification.
  delivery,
  /// The local buffer may be reused (FI_INJECT_COMPLETE on tcp, FI_TRANSMIT_COMPLETE on
  /// efa-direct). Cheaper, but on tcp a write the peer refuses completes successfully; the peer
  /// then closes the connection and the next transfer on it fails with condition::connection_lost.
  transmit,
};

/// What a successful transfer did.
struct TransferDone {
  std::size_t bytes = 0;                  ///< the operand length
  std::optional<std::uint32_t> checksum;  ///< CRC-32C of the local operand, when asked for
};

/// A transfer's result: TransferDone, or an error_code with the provider's detail.
class Outcome {
 public:
  /// A success that moved 0 bytes.
  Outcome() = default;
  /// A success: what the transfer did.
  Outcome(TransferDone done) noexcept : done_(done) {}  // NOLINT: implicit, like a result type
  /// A failure: `error`, with the provider's errno of an error completion (0 when there is none)
  /// and a human-readable detail that message() appends (e.g. fi_cq_strerror's text). Allocates
  /// only when `detail` is not empty.
  Outcome(std::error_code error, int provider_errno = 0, std::string detail = {})
      : error_(error),
        provider_errno_(provider_errno),
        detail_(detail.empty() ? nullptr : std::make_shared<const std::string>(std::move(detail))) {}

  /// True when the transfer succeeded.
  bool ok() const noexcept { return !error_; }
  /// ok(): `if (outcome)` reads as "if it worked".
  explicit operator bool() const noexcept { return ok(); }
  /// The error, or an empty code on success.
  const std::error_code& error() const noexcept { return error_; }
  /// The provider-specific errno of an error completion (0 when none).
  int provider_errno() const noexcept { return provider_errno_; }
  /// The success value; throws std::system_error on an error outcome.
  const TransferDone& value() const {
    if (error_) throw std::system_error(error_, message());
    return done_;
  }
  /// The success value without a check (a default TransferDone on an error outcome).
  const TransferDone& operator*() const noexcept { return done_; }
  /// Member access to the success value without a check: `outcome->bytes`.
  const TransferDone* operator->() const noexcept { return &done_; }
  /// "ok", or the error's message with the provider's detail.
  std::string message() const {
    if (!error_) return "ok";
    return detail_ == nullptr ? error_.message() : error_.message() + ": " + *detail_;
  }

 private:
  TransferDone done_{};
  std::error_code error_{};
  int provider_errno_ = 0;
  std::shared_ptr<const std::string> detail_;  // only errors carry one: a success moves as three words
};

/// A finished transfer: the caller's context handed back, and what happened.
template <typename Context>
struct Completion {
  Context caller_context;  ///< the request's context, moved back to the caller
  Outcome outcome;         ///< success with its TransferDone, or the error
};

/// A span of the caller's memory that may be registered as a whole, [base, end): what a context's
/// `cacheable_span()` returns to let the registration cache register more than the operand (so
/// that neighbouring operands share one fi_mr_reg) and keep it. See Operands::cacheable_span().
struct CacheableSpan {
  std::uintptr_t base = 0;  ///< first byte
  std::uintptr_t end = 0;   ///< one past the last byte

  /// None when base + length overflows.
  static std::optional<CacheableSpan> make(std::uintptr_t base, std::size_t length) noexcept {
    if (length > UINTPTR_MAX - base) return std::nullopt;
    return CacheableSpan{base, base + length};
  }
  /// Whether [start, stop) lies inside the span.
  bool contains(std::uintptr_t start, std::uintptr_t stop) const noexcept { return base <= start && stop <= end; }
  /// Same base and end.
  friend bool operator==(const CacheableSpan&, const CacheableSpan&) = default;
};

/// One remote buffer of a transfer that names several (Operands::remote_segments()): an
/// advertised buffer, or part of one. Addressed like TransferFields::remote_address.
struct RemoteSegment {
  std::uint64_t remote_address = 0;  ///< VA on FI_MR_VIRT_ADDR providers, offset on tcp
  std::size_t length = 0;            ///< bytes of the transfer that land in (or come from) it
  std::uint64_t remote_key = 0;      ///< the advertised rkey of the peer's registration

  /// The `length` bytes of an advertised buffer that start `offset` bytes into it.
  static RemoteSegment of(const Advertisement& peer, std::uint64_t offset, std::size_t length) noexcept {
    return {peer.remote_address + offset, length, peer.remote_key};
  }
};

/// Everything a TransferRequest says besides its context: where the bytes go, which way, and
/// what the caller wants back. The library carries it as one piece from the request to the
/// transfer it becomes.
struct TransferFields {
  // In this order so that the 1-byte fields pack behind the address: a request is copied into
  // its operation, and every 16 bytes less is a load and a store less.
  std::uint64_t client_id = 0;              ///< stable per client; never reused
  PeerAddress peer_address;                 ///< the advertised raw fabric address
  Direction direction = Direction::ToPeer;  ///< write into the peer (default) or read from it
  bool want_checksum = false;               ///< CRC-32C of the local operand in TransferDone
  /// ToPeer only: when the write counts as complete; see CompletionLevel.
  CompletionLevel completion = CompletionLevel::delivery;
  std::uint64_t remote_key = 0;            ///< the advertised rkey of the peer's registration
  std::uint64_t remote_address = 0;        ///< VA on FI_MR_VIRT_ADDR providers, offset on tcp
  std::size_t length = 0;                  ///< FromPeer: bytes to read (ToPeer: the source's size)
  std::optional<std::uint64_t> parent_id;  ///< tracing parent; unused by the library itself
  /// From acceptance to completion; none means Configuration::transfer_deadline, dma::no_deadline
  /// none at all. Past it the transfer fails with errc::timed_out.
  std::optional<std::chrono::nanoseconds> deadline;
  /// ToPeer only: a value the peer's Target receives as a WriteNotification once the bytes have
  /// landed (FI_REMOTE_CQ_DATA). A write striped over several endpoints sends it with its last
  /// 4 KiB, posted only after every other part has completed with delivery completion (whatever
  /// `completion` says), so the notification never comes before any of the bytes; a striped
  /// write that fails sends none. On a FromPeer request the transfer fails with
  /// errc::immediate_data_on_read; a value wider than the provider's cq_data_size fails with
  /// errc::immediate_data_too_wide (tcp carries all 64 bits).
  std::optional<std::uint64_t> immediate_data;
};

/// One transfer: its TransferFields and the caller's context. The context owns (or refers to) the
/// local operand and is handed back, by value, in the Completion; the operand must stay valid and
/// unmodified until then.
template <typename Context>
struct TransferRequest : TransferFields {
  Context caller_context{};  ///< yours: holds the operand, comes back in the Completion

  /// Addresses the request to an advertised buffer, `offset` bytes into it: sets peer_address,
  /// remote_key and remote_address (the advertised address plus offset, whichever addressing mode
  /// the peer's provider uses).
  TransferRequest& set_peer(const Advertisement& peer, std::uint64_t offset = 0) {
    peer_address = peer.address;
    remote_key = peer.remote_key;
    remote_address = peer.remote_address + offset;
    return *this;
  }
};

/// How the library reaches the operand inside a context. The primary template offers the
/// context's members that exist (`source()`, `sources()`, `allocate(n)`, `landing()`,
/// `remote_segments()`, `cacheable_span()`) and nothing for those that do not; specialise it for
/// types you cannot change. Returning an empty optional means "not this time": the transfer fails
/// with the error each member names. Which members there are decides what a context can do:
/// see dma::WriteContext, dma::ReadContext and dma::TransferContext.
template <typename Context, typename = void>
struct Operands {
  /// ToPeer: the bytes to write, from `context.source()` (a contiguous range of 1-byte elements,
  /// or an optional of one). Empty: the transfer fails with errc::no_source. Called once per
  /// transfer, before it is posted (on the service's strand; on the submitting thread for a
  /// service with several endpoints).
  static std::optional<std::span<const std::byte>> source(const Context& context) requires requires(const Context& c) {
    c.source();
  }
  { return to_bytes(context.source()); }
  /// FromPeer: where `length` bytes land, from `context.allocate(length)`. Empty: the transfer
  /// fails with errc::no_landing_buffer; fewer than `length` bytes: errc::landing_buffer_too_small.
  /// Called once per transfer, before it is posted (as source()).
  static std::optional<std::span<std::byte>> allocate(Context& context, std::size_t length) requires
      requires(Context& c, std::size_t n) {
    c.allocate(n);
  }
  { return to_writable_bytes(context.allocate(length)); }
  /// ToPeer, a gather: several buffers written, in order, as one transfer, from
  /// `context.sources()` (a contiguous range of `std::span<const std::byte>`, or an optional of
  /// one). When it gives a list, source() is not asked. The buffers must stay valid and
  /// unmodified until the completion, like the context itself. A gather takes as many posts as
  /// the provider's iov_limit requires, and completes once.
  static std::optional<std::span<const std::span<const std::byte>>> sources(const Context& context) requires
      requires(const Context& c) {
    c.sources();
  }
  { return to_list<const std::byte>(context.sources()); }
  /// FromPeer, a scatter: the buffers `length` bytes land in, in order, from `context.landing()`
  /// (a contiguous range of `std::span<std::byte>`, or an optional of one). When it gives a list,
  /// allocate() is not asked; the buffers must total at least `length`
  /// (errc::landing_buffer_too_small otherwise), and bytes past it are not touched.
  static std::optional<std::span<const std::span<std::byte>>> landing(Context& context) requires requires(Context& c) {
    c.landing();
  }
  { return to_list<std::byte>(context.landing()); }
  /// Several remote segments, from `context.remote_segments()` (a contiguous range of
  /// RemoteSegment, or an optional of one): the transfer's bytes go to (or come from) them in
  /// order, and the request's remote_address and remote_key are not used. They must total the
  /// transfer's length (errc::segment_lengths_differ otherwise); an empty list fails with
  /// errc::no_remote_segment.
  static std::optional<std::span<const RemoteSegment>> remote_segments(const Context& context) requires
      requires(const Context& c) {
    c.remote_segments();
  }
  { return to_segments(context.remote_segments()); }
  /// From `context.cacheable_span()`, asked only where the provider needs local registration and
  /// only on a registration-cache miss. Returning a span is a promise: invalidate() will be called
  /// over it before any of its pages is unmapped, returned to the OS or discarded with madvise.
  /// A span that does not contain the operand is ignored; empty (the default, and a context
  /// without the member) registers just the operand, for this transfer only.
  static std::optional<CacheableSpan> cacheable_span(const Context& context) {
    if constexpr (requires { context.cacheable_span(); }) {
      return context.cacheable_span();
    } else {
      return std::nullopt;
    }
  }

 private:
  template <typename T>
  static std::optional<std::span<const std::byte>> to_bytes(T&& value) {
    if constexpr (requires {
                    value.has_value();
                    *value;
                  }) {
      if (!value) return std::nullopt;
      return to_bytes(*value);
    } else {
      return std::as_bytes(std::span(value));
    }
  }
  template <typename Byte, typename T>
  static std::optional<std::span<const std::span<Byte>>> to_list(T&& value) {
    if constexpr (requires {
                    value.has_value();
                    *value;
                  }) {
      if (!value) return std::nullopt;
      return to_list<Byte>(*value);
    } else {
      return std::span<const std::span<Byte>>(value);
    }
  }
  template <typename T>
  static std::optional<std::span<const RemoteSegment>> to_segments(T&& value) {
    if constexpr (requires {
                    value.has_value();
                    *value;
                  }) {
      if (!value) return std::nullopt;
      return to_segments(*value);
    } else {
      return std::span<const RemoteSegment>(value);
    }
  }
  template <typename T>
  static std::optional<std::span<std::byte>> to_writable_bytes(T&& value) {
    if constexpr (requires {
                    value.has_value();
                    *value;
                  }) {
      if (!value) return std::nullopt;
      return to_writable_bytes(*value);
    } else {
      return std::as_writable_bytes(std::span(value));
    }
  }
};

/// A byte vector is its own operand: source() is the whole vector, allocate(n) resizes it to n
/// (zero-filled) and returns all of it.
template <typename Byte, typename Allocator>
requires(sizeof(Byte) == 1 && std::is_trivially_copyable_v<Byte>) struct Operands<std::vector<Byte, Allocator>> {
  /// The whole vector.
  static std::optional<std::span<const std::byte>> source(const std::vector<Byte, Allocator>& v) {
    return std::as_bytes(std::span(v));
  }
  /// Resizes the vector to `length` (new bytes zero) and returns all of it; allocates when it grows.
  static std::optional<std::span<std::byte>> allocate(std::vector<Byte, Allocator>& v, std::size_t length) {
    v.resize(length);
    return std::as_writable_bytes(std::span(v));
  }
  /// None: a vector may reallocate, so its memory is registered per transfer, never cached.
  static std::optional<CacheableSpan> cacheable_span(const std::vector<Byte, Allocator>&) { return std::nullopt; }
};

/// A context that can be the operand of a write: Operands gives it `source()` or `sources()`.
template <typename Context>
concept WriteContext = requires(const Context& context) {
  Operands<Context>::source(context);
}
|| requires(const Context& context) { Operands<Context>::sources(context); };

/// A context that can receive a read: Operands gives it `allocate(n)` or `landing()`.
template <typename Context>
concept ReadContext = requires(Context& context, std::size_t length) {
  Operands<Context>::allocate(context, length);
}
|| requires(Context& context) { Operands<Context>::landing(context); };

/// What a service's Context must be: an object type, default-constructible and movable (it goes
/// into the request and comes back in the Completion), that supplies an operand for writes
/// (WriteContext), reads (ReadContext) or both. A transfer in a direction its context cannot
/// serve fails with errc::no_source (a write) or errc::no_landing_buffer (a read).
template <typename Context>
concept TransferContext = std::is_object_v<Context> && std::default_initializable<Context> &&
    std::move_constructible<Context> &&(WriteContext<Context> || ReadContext<Context>);

/// A write of context's operand into the advertised buffer `offset` bytes in, for client_id.
template <WriteContext Context>
TransferRequest<Context> write_to(const Advertisement& peer, std::uint64_t client_id, Context context,
                                  std::uint64_t offset = 0) {
  TransferRequest<Context> request;
  request.client_id = client_id;
  request.direction = Direction::ToPeer;
  request.set_peer(peer, offset);
  request.caller_context = std::move(context);
  return request;
}

/// A read of `length` bytes of the advertised buffer, `offset` bytes in, into context's landing
/// buffer, for client_id.
template <ReadContext Context>
TransferRequest<Context> read_from(const Advertisement& peer, std::uint64_t client_id, std::size_t length,
                                   Context context, std::uint64_t offset = 0) {
  TransferRequest<Context> request;
  request.client_id = client_id;
  request.direction = Direction::FromPeer;
  request.length = length;
  request.set_peer(peer, offset);
  request.caller_context = std::move(context);
  return request;
}

}  // namespace dma
