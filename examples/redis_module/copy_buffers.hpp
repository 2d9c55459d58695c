// The buffers DMA.GET copies are taken into, kept for reuse once their writes end. Memory the
// process maps afresh costs a page fault per page the first time the copy writes it, on the main
// thread; a buffer that comes back is mapped already. On this project's virtual machine a fresh
// 16 MiB copy took 16 to 25 ms, most of it faulting, where a copy into mapped memory takes about 2.
// Buffers under 128 KiB are not kept: the C library's heap reuses those without a fault. Main
// thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace dma_module {

class CopyBuffers {
 public:
  struct Buffer {
    std::byte* data = nullptr;
    std::size_t capacity = 0;
  };
  /// The smallest buffer kept.
  static constexpr std::size_t smallest_kept = 128 << 10;

  /// Keeps at most `limit` bytes of buffers (0: keeps none).
  explicit CopyBuffers(std::uint64_t limit) : limit_(limit) {}
  /// Frees what it keeps.
  ~CopyBuffers();
  CopyBuffers(const CopyBuffers&) = delete;
  CopyBuffers& operator=(const CopyBuffers&) = delete;

  /// A kept buffer of `length` bytes or more (at most an eighth more, so a small value does not
  /// take a large buffer), or else a new one of `length` bytes from std::malloc; data is null when
  /// that fails. `now` is when it is taken (see last_taken()).
  Buffer take(std::size_t length, std::chrono::steady_clock::time_point now);
  /// Keeps `buffer`, letting the buffers kept longest go if the bytes kept would pass the limit;
  /// returns what is let go (`buffer` itself when it is not kept), for the caller to free
  /// (std::free).
  std::vector<Buffer> give(Buffer buffer);
  /// Hands back everything kept, for the caller to free.
  std::vector<Buffer> drain();

  std::uint64_t kept_bytes() const noexcept { return kept_; }
  std::uint64_t reused() const noexcept { return reused_; }
  /// When a buffer was last taken.
  std::chrono::steady_clock::time_point last_taken() const noexcept { return last_taken_; }

 private:
  struct Kept {
    std::byte* data = nullptr;
    std::uint64_t age = 0;  ///< when it was given, in gives
  };
  using BySize = std::multimap<std::size_t, Kept>;

  std::uint64_t limit_;
  BySize by_size_;
  std::map<std::uint64_t, BySize::iterator> by_age_;
  std::uint64_t gives_ = 0;
  std::uint64_t kept_ = 0;
  std::uint64_t reused_ = 0;
  std::chrono::steady_clock::time_point last_taken_{};
};

}  // namespace dma_module
