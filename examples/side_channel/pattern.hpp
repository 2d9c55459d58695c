// The deterministic values the client writes and checks: a fixed pseudo-random byte stream, read
// from an offset that depends on a seed. A value is identified by (seed, length), so a reader can
// compare every byte it received without having kept a copy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

namespace kv {

/// Distinct starting offsets into the stream.
inline constexpr std::size_t pattern_offsets = 4096;

class Pattern {
 public:
  /// Room for values up to max_length bytes.
  explicit Pattern(std::size_t max_length) : stream_(max_length + pattern_offsets + 8) {
    std::uint64_t x = 0x2545f4914f6cdd1dull;
    for (std::size_t i = 0; i + 8 <= stream_.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(stream_.data() + i, &x, 8);
    }
  }
  std::size_t max_length() const noexcept { return stream_.size() - pattern_offsets - 8; }
  /// The value for (seed, length); length must not exceed max_length().
  std::span<const std::byte> value(std::uint64_t seed, std::size_t length) const noexcept {
    return std::span<const std::byte>(stream_).subspan(seed % pattern_offsets, length);
  }

 private:
  std::vector<std::byte> stream_;
};

/// FNV-1a of a key: the seed `set --size` uses, so `get` can recognise the value.
inline std::uint64_t seed_of(std::string_view key) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : key)
    h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace kv
