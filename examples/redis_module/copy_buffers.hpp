// The buffers DMA.GET copies are taken into, kept for reuse once their writes end. Memory the
// process maps afresh costs a page fault per page the first time the copy writes it, on the main
// thread; a buffer that comes back is mapped already. On this project's virtual machine a fresh
// 16 MiB copy took 16 to 25 ms, most of it faulting, where a copy into mapped memory takes a few.
// Main thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace dma_module {

class CopyBuffers {
 public:
  struct Buffer {
    std::byte* data = nullptr;
    std::size_t capacity = 0;
  };

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
  /// Keeps `buffer` if the bytes kept stay within the limit; otherwise hands it back, for the
  /// caller to free (std::free).
  std::optional<Buffer> give(Buffer buffer);
  /// Hands back everything kept, for the caller to free.
  std::vector<Buffer> drain();

  std::uint64_t kept_bytes() const noexcept { return kept_; }
  std::uint64_t reused() const noexcept { return reused_; }
  /// When a buffer was last taken.
  std::chrono::steady_clock::time_point last_taken() const noexcept { return last_taken_; }

 private:
  std::uint64_t limit_;
  std::multimap<std::size_t, std::byte*> kept_buffers_;  ///< by capacity
  std::uint64_t kept_ = 0;
  std::uint64_t reused_ = 0;
  std::chrono::steady_clock::time_point last_taken_{};
};

}  // namespace dma_module
