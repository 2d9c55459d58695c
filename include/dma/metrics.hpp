/// @file
/// What a service counts: transfers, completion-queue activity, peers, registrations, and the
/// latency of its transfers as a histogram; and the Prometheus text form of all of it.
#pragma once

#include <dma/export.hpp>

#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace dma {

/// A latency distribution in fixed, log-spaced buckets: no allocation, and recording costs a
/// handful of instructions (a bit scan, a shift, an increment), so a service records every
/// transfer. A plain value type: copy it, merge it, ask it for percentiles.
///
/// Buckets: one for everything up to 1024 ns (about 1 µs); then four equal buckets per power of
/// two from 2^10 ns up to 2^37 ns (about 137 s), so a bucket spans at most a quarter of its lower
/// bound; then one for everything above. Each bucket holds the values greater than the previous
/// bucket's upper bound and up to its own, inclusive, which is what Prometheus' `le` means.
///
/// Not thread-safe: one thread records, or the caller serialises. A service keeps its own,
/// thread-safe, copy and hands out snapshots in Metrics::latency.
class DMA_EXPORT LatencyHistogram {
 public:
  /// Values up to 2^min_octave ns share the first bucket.
  static constexpr unsigned min_octave = 10;
  /// Values above 2^max_octave ns share the last bucket.
  static constexpr unsigned max_octave = 37;
  /// log2 of the buckets per power of two.
  static constexpr unsigned sub_bucket_bits = 2;
  /// Buckets per power of two.
  static constexpr unsigned sub_buckets = 1u << sub_bucket_bits;
  /// Every bucket: the first, four per power of two, the last.
  static constexpr std::size_t bucket_count = 2 + std::size_t{max_octave - min_octave} * sub_buckets;

  /// The bucket a value of `nanoseconds` falls in: 0 up to 1024 ns, bucket_count - 1 above
  /// 2^max_octave ns.
  static constexpr std::size_t bucket_index(std::uint64_t nanoseconds) noexcept {
    const std::uint64_t v = nanoseconds - (nanoseconds != 0);  // buckets include their upper bound
    if (v < (std::uint64_t{1} << min_octave)) return 0;
    const unsigned octave = static_cast<unsigned>(std::bit_width(v)) - 1;
    if (octave >= max_octave) return bucket_count - 1;
    const auto sub = static_cast<unsigned>(v >> (octave - sub_bucket_bits)) & (sub_buckets - 1);
    return 1 + std::size_t{octave - min_octave} * sub_buckets + sub;
  }

  /// The largest value, in nanoseconds, that bucket `index` holds (inclusive); the largest
  /// std::uint64_t for the last bucket, which is unbounded.
  static constexpr std::uint64_t upper_bound(std::size_t index) noexcept {
    if (index == 0) return std::uint64_t{1} << min_octave;
    if (index >= bucket_count - 1) return std::numeric_limits<std::uint64_t>::max();
    const auto octave = static_cast<unsigned>(min_octave + (index - 1) / sub_buckets);
    const std::uint64_t sub = (index - 1) % sub_buckets;
    return (std::uint64_t{1} << octave) + ((sub + 1) << (octave - sub_bucket_bits));
  }

  /// A histogram with these bucket counts (bucket(i) == buckets[i]), sum and max, e.g. one that
  /// was stored bucket by bucket.
  static LatencyHistogram from_buckets(const std::array<std::uint64_t, bucket_count>& buckets, std::uint64_t sum,
                                       std::uint64_t max) noexcept {
    LatencyHistogram histogram;
    histogram.buckets_ = buckets;
    histogram.sum_ = sum;
    histogram.max_ = max;
    return histogram;
  }

  /// Records one value.
  void record(std::uint64_t nanoseconds) noexcept {
    ++buckets_[bucket_index(nanoseconds)];
    sum_ = nanoseconds > std::numeric_limits<std::uint64_t>::max() - sum_ ? std::numeric_limits<std::uint64_t>::max()
                                                                          : sum_ + nanoseconds;
    if (nanoseconds > max_) max_ = nanoseconds;
  }
  /// Records one duration; a negative one counts as 0.
  void record(std::chrono::nanoseconds duration) noexcept {
    record(duration.count() < 0 ? std::uint64_t{0} : static_cast<std::uint64_t>(duration.count()));
  }

  /// How many values were recorded.
  std::uint64_t count() const noexcept;
  /// The sum of every value recorded, in nanoseconds; it stops at the largest std::uint64_t
  /// instead of wrapping.
  std::uint64_t sum() const noexcept { return sum_; }
  /// The largest value recorded, in nanoseconds (0 when empty).
  std::uint64_t max() const noexcept { return max_; }
  /// How many values bucket `index` holds (0 for an index past the last bucket).
  std::uint64_t bucket(std::size_t index) const noexcept { return index < bucket_count ? buckets_[index] : 0; }

  /// The value below which `percent` percent of the values lie (0 to 100; clamped), linearly
  /// interpolated inside its bucket and never above max(): off by at most the bucket's width,
  /// a quarter of the value. 0 when empty.
  std::chrono::nanoseconds percentile(double percent) const noexcept;
  /// percentile(50): the median.
  std::chrono::nanoseconds p50() const noexcept { return percentile(50); }
  /// percentile(99).
  std::chrono::nanoseconds p99() const noexcept { return percentile(99); }
  /// percentile(99.9).
  std::chrono::nanoseconds p999() const noexcept { return percentile(99.9); }

  /// Adds every value of `other` (e.g. two services', or two intervals').
  void merge(const LatencyHistogram& other) noexcept;
  /// merge(other).
  LatencyHistogram& operator+=(const LatencyHistogram& other) noexcept {
    merge(other);
    return *this;
  }
  /// Forgets every value.
  void reset() noexcept { *this = LatencyHistogram(); }

  /// Bucket by bucket, plus sum and max.
  friend bool operator==(const LatencyHistogram&, const LatencyHistogram&) noexcept = default;

 private:
  std::array<std::uint64_t, bucket_count> buckets_{};
  std::uint64_t sum_ = 0;
  std::uint64_t max_ = 0;
};

/// What a service counts; read it with FabricService::metrics() or
/// asynchronous::FabricService::metrics(). A snapshot: each field is exact, but fields read while
/// transfers complete may be a few transfers apart. Counters only grow, except the two cache
/// gauges (cache_entries, cache_bytes) and posts_in_flight.
struct Metrics {
  std::uint64_t posted = 0;         ///< posts handed to the provider (a segmented transfer's each count)
  std::uint64_t completed = 0;      ///< transfers completed successfully
  std::uint64_t failed = 0;         ///< transfers completed with an error (including ones never posted)
  std::uint64_t eagain = 0;         ///< posts the provider refused with -FI_EAGAIN
  std::uint64_t cq_reads = 0;       ///< fi_cq_read calls that returned entries
  std::uint64_t fd_wakeups = 0;     ///< wake-ups through the CQ's wait fd
  std::uint64_t spin_hits = 0;      ///< completions found while spinning before arming
  std::uint64_t armed_late = 0;     ///< completions found right after arming the fd
  std::uint64_t backstop_hits = 0;  ///< completions the backstop found after the fd stayed silent an interval (~0)
  std::uint64_t joined_pass = 0;    ///< transfers submitted from inside a reaper pass, posted by that pass
  std::uint64_t timed_out = 0;      ///< transfers that failed at their deadline (errc::timed_out)
  std::uint64_t cancelled = 0;      ///< transfers cancelled through their handler's slot
  std::uint64_t peers_marked_unreachable = 0;  ///< times a peer was marked unreachable (back-off began)
  std::uint64_t reconnects = 0;                ///< fresh address-vector entries for a peer whose connection broke
  std::uint64_t endpoint_replacements = 0;     ///< endpoints replaced to hand back posted transfers
  std::uint64_t reposted = 0;                  ///< posts handed back by a replaced endpoint's close and posted again
  std::uint64_t isolated_retries = 0;          ///< transfers posted again alone after another broke their connection
  std::uint64_t context_less_errors = 0;       ///< CQ entries (errors or successes) without an operation
  std::uint64_t queue_errors = 0;              ///< fi_cq_read failures that name no operation
  std::uint64_t segmented = 0;        ///< transfers split into several posts (too long for one, or with operand lists)
  std::uint64_t registrations = 0;    ///< fi_mr_reg calls for local operands and pinned regions
  std::uint64_t cache_hits = 0;       ///< operands served by a cached registration
  std::uint64_t cache_misses = 0;     ///< operands that found none
  std::uint64_t cache_evictions = 0;  ///< CacheableSpan entries pushed out by the cache limits
  std::size_t cache_entries = 0;      ///< cached registrations in this domain now (a gauge)
  std::size_t cache_bytes = 0;        ///< bytes under cached registrations now, pins included (a gauge)
  std::size_t posts_in_flight = 0;    ///< posts the provider holds now (a gauge)

  /// The latency of each successful transfer, from its acceptance to the completion-queue drain
  /// that found it (see docs/getting-started.md, "Logging and metrics"). Its count() follows
  /// `completed`.
  ///
  /// How a service records it: the engine reads the clock once per intake batch (the acceptance
  /// time of every transfer in that batch, which deadlines count from too) and once per
  /// completion-queue drain (the completion time of every entry that drain reads), and records
  /// the difference for each successful transfer; failed transfers are not recorded. It
  /// therefore leaves out the hop from submit() to the service's strand and the completion
  /// handler's dispatch (and the CRC of want_checksum), and adds no clock read per transfer.
  LatencyHistogram latency;
};

/// Adds other's counters, gauges and latency histogram to m: the metrics of several services (or
/// endpoints) as one.
DMA_EXPORT Metrics& operator+=(Metrics& m, const Metrics& other) noexcept;

/// The metrics in Prometheus' text exposition format (version 0.0.4): each counter as
/// `<prefix><field>_total` (e.g. `dma_posted_total`), the two cache gauges as
/// `<prefix>cache_entries`, `<prefix>cache_bytes` and `<prefix>posts_in_flight`, and `latency` as the histogram
/// `<prefix>transfer_latency_seconds` (`_bucket{le="..."}` for every bucket, cumulative, then
/// `_sum` and `_count`). Every metric has its `# HELP` and `# TYPE` line. Serve it as
/// `text/plain; version=0.0.4`. For several services on one page, give each its own prefix.
/// Throws std::invalid_argument when `prefix` is not a valid start of a metric name
/// (`[a-zA-Z_:][a-zA-Z0-9_:]*`; empty is allowed).
DMA_EXPORT std::string to_prometheus(const Metrics& metrics, std::string_view prefix = "dma_");

}  // namespace dma
