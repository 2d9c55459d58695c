// PeerAddress: a peer's raw fabric address held inline, so building a TransferRequest for a known
// peer allocates nothing.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

namespace dma {

class PeerAddress {
 public:
  /// Bytes held inline: more than any supported format needs (sockaddr_in6 28, efa 32).
  static constexpr std::size_t capacity = 64;

  PeerAddress() noexcept = default;
  /// An address longer than `capacity` is kept as "oversized": a transfer to it fails with
  /// errc::address_length, like any other address of the wrong length.
  PeerAddress(std::span<const std::uint8_t> bytes) noexcept { assign(bytes); }  // NOLINT: implicit by design
  PeerAddress(const std::vector<std::uint8_t>& bytes) noexcept : PeerAddress(std::span<const std::uint8_t>(bytes)) {}
  PeerAddress(std::initializer_list<std::uint8_t> bytes) noexcept
      : PeerAddress(std::span<const std::uint8_t>(bytes.begin(), bytes.size())) {}

  const std::uint8_t* data() const noexcept { return bytes_.data(); }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  bool oversized() const noexcept { return oversized_; }
  const std::uint8_t* begin() const noexcept { return data(); }
  const std::uint8_t* end() const noexcept { return data() + size_; }
  std::span<const std::uint8_t> bytes() const noexcept { return {data(), size_}; }
  operator std::span<const std::uint8_t>() const noexcept { return bytes(); }  // NOLINT: implicit by design

  friend bool operator==(const PeerAddress& a, const PeerAddress& b) noexcept {
    return a.oversized_ == b.oversized_ && std::ranges::equal(a.bytes(), b.bytes());
  }

 private:
  void assign(std::span<const std::uint8_t> bytes) noexcept {
    oversized_ = bytes.size() > capacity;
    size_ = oversized_ ? 0 : bytes.size();
    std::copy_n(bytes.begin(), size_, bytes_.begin());
  }

  std::array<std::uint8_t, capacity> bytes_{};
  std::size_t size_ = 0;
  bool oversized_ = false;
};

}  // namespace dma
