#include "dma/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <system_error>

namespace dma {

std::uint64_t LatencyHistogram::count() const noexcept {
  std::uint64_t total = 0;
  for (const std::uint64_t n : buckets_)
    total += n;
  return total;
}

std::chrono::nanoseconds LatencyHistogram::percentile(double percent) const noexcept {
  const std::uint64_t total = count();
  if (total == 0) return std::chrono::nanoseconds(0);
  if (!(percent > 0)) percent = 0;  // NaN too
  percent = std::min(percent, 100.0);
  // The rank of the value asked for, 1-based: the smallest with at least `percent` % at or below it.
  const auto rank =
      std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::ceil(percent / 100.0 * static_cast<double>(total))));
  std::uint64_t before = 0;
  for (std::size_t i = 0; i < bucket_count; ++i) {
    const std::uint64_t in = buckets_[i];
    if (before + in < rank) {
      before += in;
      continue;
    }
    const double lower = i == 0 ? 0.0 : static_cast<double>(upper_bound(i - 1));
    const double upper = i == bucket_count - 1 ? static_cast<double>(max_) : static_cast<double>(upper_bound(i));
    const double fraction = static_cast<double>(rank - before) / static_cast<double>(in);
    const double value = std::min(lower + fraction * (upper - lower), static_cast<double>(max_));
    // max_ fits std::uint64_t; a duration holds up to 2^63 - 1 ns.
    const double limit = static_cast<double>(std::chrono::nanoseconds::max().count());
    return std::chrono::nanoseconds(value >= limit ? std::chrono::nanoseconds::max().count()
                                                   : static_cast<std::int64_t>(std::llround(value)));
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>(std::min<std::uint64_t>(max_, INT64_MAX)));
}

void LatencyHistogram::merge(const LatencyHistogram& other) noexcept {
  for (std::size_t i = 0; i < bucket_count; ++i)
    buckets_[i] += other.buckets_[i];
  sum_ = other.sum_ > std::numeric_limits<std::uint64_t>::max() - sum_ ? std::numeric_limits<std::uint64_t>::max()
                                                                       : sum_ + other.sum_;
  max_ = std::max(max_, other.max_);
}

namespace {

bool valid_prefix(std::string_view prefix) noexcept {
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    const char c = prefix[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// The shortest text that reads back as the same double (Prometheus parses Go floats).
void append_number(std::string& out, double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  out.append(text, result.ptr);
}

void append_number(std::string& out, std::uint64_t value) {
  char text[24];
  const auto result = std::to_chars(text, text + sizeof text, value);
  out.append(text, result.ptr);
}

void append_header(std::string& out, std::string_view prefix, std::string_view name, std::string_view type,
                   std::string_view help) {
  out.append("# HELP ").append(prefix).append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(prefix).append(name).append(" ").append(type).append("\n");
}

void append_sample(std::string& out, std::string_view prefix, std::string_view name, std::uint64_t value) {
  out.append(prefix).append(name).append(" ");
  append_number(out, value);
  out.append("\n");
}

struct Counter {
  std::string_view name;
  std::uint64_t Metrics::*field;
  std::string_view help;
};

constexpr Counter counters[] = {
    {"posted_total", &Metrics::posted, "Posts handed to the provider; each post of a segmented transfer counts."},
    {"completed_total", &Metrics::completed, "Transfers completed successfully."},
    {"failed_total", &Metrics::failed, "Transfers completed with an error, including ones never posted."},
    {"eagain_total", &Metrics::eagain, "Posts the provider refused with -FI_EAGAIN."},
    {"cq_reads_total", &Metrics::cq_reads, "fi_cq_read calls that returned entries."},
    {"fd_wakeups_total", &Metrics::fd_wakeups, "Wake-ups through the completion queue's wait fd."},
    {"spin_hits_total", &Metrics::spin_hits, "Completions found while polling before arming the wait fd."},
    {"armed_late_total", &Metrics::armed_late, "Completions found right after arming the wait fd."},
    {"backstop_hits_total", &Metrics::backstop_hits,
     "Completions only the backstop timer found, the wait fd silent for an interval."},
    {"joined_pass_total", &Metrics::joined_pass,
     "Transfers submitted from inside a reaper pass and posted by that pass."},
    {"timed_out_total", &Metrics::timed_out, "Transfers that failed at their deadline."},
    {"cancelled_total", &Metrics::cancelled, "Transfers cancelled through their handler's cancellation slot."},
    {"peers_marked_unreachable_total", &Metrics::peers_marked_unreachable,
     "Times a peer was marked unreachable and its back-off began."},
    {"reconnects_total", &Metrics::reconnects, "Fresh address-vector entries for a peer whose connection broke."},
    {"endpoint_replacements_total", &Metrics::endpoint_replacements,
     "Endpoints replaced to hand back posted transfers."},
    {"reposted_total", &Metrics::reposted,
     "Posts handed back by a replaced endpoint's close, for another transfer's sake, and posted again."},
    {"isolated_retries_total", &Metrics::isolated_retries,
     "Transfers posted again alone after a connection that another transfer may have broken."},
    {"context_less_errors_total", &Metrics::context_less_errors,
     "Completion queue error entries without an operation."},
    {"queue_errors_total", &Metrics::queue_errors, "Completion queue reads that failed without naming an operation."},
    {"segmented_total", &Metrics::segmented, "Transfers split into several posts."},
    {"registrations_total", &Metrics::registrations, "fi_mr_reg calls for local operands and pinned regions."},
    {"cache_hits_total", &Metrics::cache_hits, "Operands served by a cached registration."},
    {"cache_misses_total", &Metrics::cache_misses, "Operands that found no cached registration."},
    {"cache_evictions_total", &Metrics::cache_evictions, "Cached registrations pushed out by the cache limits."},
};

void append_latency(std::string& out, std::string_view prefix, const LatencyHistogram& latency) {
  const std::string name = std::string(prefix) + "transfer_latency_seconds";
  append_header(out, "", name, "histogram",
                "Latency of successful transfers, from acceptance to the completion queue drain that found them.");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i + 1 < LatencyHistogram::bucket_count; ++i) {
    cumulative += latency.bucket(i);
    out.append(name).append("_bucket{le=\"");
    append_number(out, static_cast<double>(LatencyHistogram::upper_bound(i)) / 1e9);
    out.append("\"} ");
    append_number(out, cumulative);
    out.append("\n");
  }
  cumulative += latency.bucket(LatencyHistogram::bucket_count - 1);
  out.append(name).append("_bucket{le=\"+Inf\"} ");
  append_number(out, cumulative);
  out.append("\n").append(name).append("_sum ");
  append_number(out, static_cast<double>(latency.sum()) / 1e9);
  out.append("\n").append(name).append("_count ");
  append_number(out, cumulative);
  out.append("\n");
}

}  // namespace

Metrics& operator+=(Metrics& m, const Metrics& other) noexcept {
  for (const Counter& c : counters)
    m.*(c.field) += other.*(c.field);
  m.cache_entries += other.cache_entries;
  m.cache_bytes += other.cache_bytes;
  m.posts_in_flight += other.posts_in_flight;
  m.latency += other.latency;
  return m;
}

std::string to_prometheus(const Metrics& metrics, std::string_view prefix) {
  if (!valid_prefix(prefix)) {
    throw std::invalid_argument("to_prometheus: '" + std::string(prefix) +
                                "' is not a metric name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
  std::string out;
  out.reserve(std::size_t{16} * 1024);
  for (const Counter& counter : counters) {
    append_header(out, prefix, counter.name, "counter", counter.help);
    append_sample(out, prefix, counter.name, metrics.*counter.field);
  }
  append_header(out, prefix, "cache_entries", "gauge", "Cached registrations in this domain now.");
  append_sample(out, prefix, "cache_entries", metrics.cache_entries);
  append_header(out, prefix, "cache_bytes", "gauge", "Bytes under cached registrations in this domain now.");
  append_sample(out, prefix, "cache_bytes", metrics.cache_bytes);
  append_header(out, prefix, "posts_in_flight", "gauge", "Posts the provider holds now.");
  append_sample(out, prefix, "posts_in_flight", metrics.posts_in_flight);
  append_latency(out, prefix, metrics.latency);
  return out;
}

}  // namespace dma
