// A metrics counter with a single writer (a strand, or a mutex holder) and readers anywhere.
#pragma once

#include <atomic>
#include <cstdint>

namespace dma::detail {

/// Written by one thread at a time, read from anywhere: a relaxed load and store, no locked
/// instruction on the hot path.
class Counter {
 public:
  void add(std::uint64_t n = 1) noexcept {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  std::uint64_t get() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

}  // namespace dma::detail
