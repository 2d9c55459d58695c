// The engine's own LatencyHistogram: written on the strand only, read from any thread, so every
// bucket is an atomic written with a relaxed load and store (no locked instruction), like the
// engine's counters.
//
// The recording contract (Metrics::latency): the engine reads the clock once per intake batch,
// which is every accepted transfer's acceptance time (Operation::accepted, the same reading its
// deadline counts from), and once per completion-queue drain; for each successful completion in
// that drain it records drain time minus acceptance time. No clock read per transfer.
#pragma once

#include "dma/metrics.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace dma::detail {

class LatencyRecorder {
 public:
  /// Strand only.
  void record(std::chrono::steady_clock::time_point accepted, std::chrono::steady_clock::time_point drained) noexcept {
    const std::int64_t elapsed = std::chrono::nanoseconds(drained - accepted).count();
    const std::uint64_t ns = elapsed > 0 ? static_cast<std::uint64_t>(elapsed) : 0;
    std::atomic<std::uint64_t>& bucket = buckets_[LatencyHistogram::bucket_index(ns)];
    bucket.store(bucket.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);  // never 2^64 transfers
    const std::uint64_t old = sum_.load(std::memory_order_relaxed);
    const std::uint64_t sum = old + ns;
    sum_.store(sum < old ? UINT64_MAX : sum, std::memory_order_relaxed);  // stops instead of wrapping
    if (ns > max_.load(std::memory_order_relaxed)) max_.store(ns, std::memory_order_relaxed);
  }

  /// Any thread: every bucket as of some moment during the call.
  LatencyHistogram snapshot() const noexcept {
    std::array<std::uint64_t, LatencyHistogram::bucket_count> buckets{};
    for (std::size_t i = 0; i < buckets.size(); ++i)
      buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    return LatencyHistogram::from_buckets(buckets, sum_.load(std::memory_order_relaxed),
                                          max_.load(std::memory_order_relaxed));
  }

 private:
  std::array<std::atomic<std::uint64_t>, LatencyHistogram::bucket_count> buckets_{};
  std::atomic<std::uint64_t> sum_{0};
  std::atomic<std::uint64_t> max_{0};
};

}  // namespace dma::detail
