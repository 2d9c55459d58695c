/// @file
/// PeerAddress: a peer's raw fabric address held inline, so building a TransferRequest for a known
/// peer allocates nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

namespace dma {

/// A peer's raw fabric address (the bytes of Advertisement::address), held inline in the request.
/// Cheap to copy; compares by value.
class PeerAddress {
 public:
  /// Bytes held inline: more than any supported format needs (sockaddr_in6 28, efa 32).
  static constexpr std::size_t capacity = 64;

  /// The empty address (a transfer to it fails with errc::address_length).
  PeerAddress() noexcept = default;
  /// An address longer than `capacity` is kept as "oversized": a transfer to it fails with
  /// errc::address_length, like any other address of the wrong length.
  PeerAddress(std::span<const std::uint8_t> bytes) noexcept { assign(bytes); }  // NOLINT: implicit by design
  /// From Advertisement::address; as the span constructor.
  PeerAddress(const std::vector<std::uint8_t>& bytes) noexcept : PeerAddress(std::span<const std::uint8_t>(bytes)) {}
  /// From literal bytes; as the span constructor.
  PeerAddress(std::initializer_list<std::uint8_t> bytes) noexcept
      : PeerAddress(std::span<const std::uint8_t>(bytes.begin(), bytes.size())) {}

  /// The address bytes.
  const std::uint8_t* data() const noexcept { return bytes_.data(); }
  /// Bytes held; 0 when empty or oversized.
  std::size_t size() const noexcept { return size_; }
  /// No bytes held (also true when oversized).
  bool empty() const noexcept { return size_ == 0; }
  /// The address given was longer than `capacity`; nothing of it is kept.
  bool oversized() const noexcept { return oversized_; }
  /// First byte, for range-for and algorithms.
  const std::uint8_t* begin() const noexcept { return data(); }
  /// One past the last byte.
  const std::uint8_t* end() const noexcept { return data() + size_; }
  /// The bytes as a span.
  std::span<const std::uint8_t> bytes() const noexcept { return {data(), size_}; }
  /// The bytes as a span, so a PeerAddress passes wherever an address span is taken.
  operator std::span<const std::uint8_t>() const noexcept { return bytes(); }  // NOLINT: implicit by design

  /// Same bytes, and both or neither oversized.
  friend bool operator==(const PeerAddress& a, const PeerAddress& b) noexcept {
    return a.oversized_ == b.oversized_ && std::ranges::equal(a.bytes(), b.bytes());
  }

 private:
  void assign(std::span<const std::uint8_t> bytes) noexcept {
    oversized_ = bytes.size() > capacity;
    size_ = static_cast<std::uint8_t>(oversized_ ? 0 : bytes.size());
    std::copy_n(bytes.begin(), size_, bytes_.begin());
  }

  std::array<std::uint8_t, capacity> bytes_{};
  std::uint8_t size_ = 0;  // 1-byte fields: a TransferFields packs its own small ones behind them
  bool oversized_ = false;
};

}  // namespace dma
