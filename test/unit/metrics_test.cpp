// LatencyHistogram's buckets and percentiles, the engine's recorder, and the Prometheus text.
#include "latency_recorder.hpp"

#include <dma/metrics.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "../catch.hpp"
#include "../source_root.hpp"

using namespace std::chrono_literals;
using dma::LatencyHistogram;

namespace {

// |actual - expected| <= tolerance * expected
bool near(std::chrono::nanoseconds actual, std::chrono::nanoseconds expected, double tolerance) {
  const double difference = static_cast<double>(actual.count() - expected.count());
  return (difference < 0 ? -difference : difference) <= tolerance * static_cast<double>(expected.count());
}

}  // namespace

TEST_CASE("histogram buckets run from 1 µs to past 100 s, four per power of two", "[metrics]") {
  STATIC_REQUIRE(LatencyHistogram::bucket_count == 110);
  CHECK(LatencyHistogram::upper_bound(0) == 1024);
  CHECK(LatencyHistogram::upper_bound(1) == 1280);
  CHECK(LatencyHistogram::upper_bound(4) == 2048);
  CHECK(LatencyHistogram::upper_bound(LatencyHistogram::bucket_count - 2) == std::uint64_t{1} << 37);
  CHECK(LatencyHistogram::upper_bound(LatencyHistogram::bucket_count - 2) > 100'000'000'000u);
  CHECK(LatencyHistogram::upper_bound(LatencyHistogram::bucket_count - 1) == UINT64_MAX);
  // Every bucket holds its upper bound and the next one starts right above it.
  for (std::size_t i = 0; i + 1 < LatencyHistogram::bucket_count; ++i) {
    INFO("bucket " << i);
    const std::uint64_t upper = LatencyHistogram::upper_bound(i);
    CHECK(LatencyHistogram::bucket_index(upper) == i);
    CHECK(LatencyHistogram::bucket_index(upper + 1) == i + 1);
    if (i > 0) CHECK(upper - LatencyHistogram::upper_bound(i - 1) <= LatencyHistogram::upper_bound(i - 1) / 4);
  }
}

TEST_CASE("the edge values 0 and the largest land in the first and last buckets", "[metrics]") {
  LatencyHistogram histogram;
  CHECK(histogram.count() == 0);
  CHECK(histogram.p50() == 0ns);
  CHECK(histogram.p99() == 0ns);

  histogram.record(0);
  CHECK(histogram.bucket(0) == 1);
  CHECK(histogram.p50() == 0ns);  // never above the largest value recorded
  histogram.record(-5ns);         // a clock that went backwards counts as 0
  CHECK(histogram.bucket(0) == 2);

  histogram.record(UINT64_MAX);
  histogram.record(UINT64_MAX);
  CHECK(histogram.bucket(LatencyHistogram::bucket_count - 1) == 2);
  CHECK(histogram.count() == 4);
  CHECK(histogram.sum() == UINT64_MAX);  // saturates instead of wrapping
  CHECK(histogram.max() == UINT64_MAX);
  CHECK(histogram.percentile(100) == std::chrono::nanoseconds::max());
  CHECK(histogram.percentile(25) <= 1024ns);                   // inside the first bucket
  CHECK(histogram.percentile(-1) == histogram.percentile(0));  // clamped to 0
  CHECK(histogram.percentile(1e9) == histogram.percentile(100));
  CHECK(histogram.bucket(LatencyHistogram::bucket_count) == 0);  // past the end
}

TEST_CASE("percentiles of a uniform distribution are within 1 %", "[metrics]") {
  LatencyHistogram histogram;
  for (std::uint64_t us = 1; us <= 100'000; ++us)  // 1 µs to 100 ms, evenly
    histogram.record(std::chrono::microseconds(us));
  CHECK(histogram.count() == 100'000);
  CHECK(histogram.sum() == 100'000ull * 100'001ull / 2 * 1000);
  CHECK(histogram.max() == 100'000'000u);
  CHECK(near(histogram.p50(), 50ms, 0.01));
  CHECK(near(histogram.percentile(90), 90ms, 0.01));
  CHECK(near(histogram.p99(), 99ms, 0.01));
  CHECK(near(histogram.p999(), 99900us, 0.01));
  CHECK(histogram.percentile(100) == 100ms);  // exactly the largest
  CHECK(histogram.percentile(0) <= 2us);
}

TEST_CASE("percentiles of two clusters fall within a bucket's width of them", "[metrics]") {
  LatencyHistogram histogram;
  for (int i = 0; i < 900; ++i)
    histogram.record(10us);
  for (int i = 0; i < 100; ++i)
    histogram.record(3ms);
  CHECK(near(histogram.p50(), 10us, 0.25));
  CHECK(near(histogram.percentile(90), 10us, 0.25));
  CHECK(near(histogram.percentile(91), 3ms, 0.25));
  CHECK(histogram.p99() <= 3ms);
  CHECK(near(histogram.p99(), 3ms, 0.25));
}

TEST_CASE("merging two histograms equals recording both into one", "[metrics]") {
  LatencyHistogram a, b, both;
  for (std::uint64_t v = 1; v < 5'000'000; v = v * 3 + 7) {
    a.record(v);
    both.record(v);
    b.record(v * 5);
    both.record(v * 5);
  }
  LatencyHistogram merged = a;
  merged += b;
  CHECK(merged == both);
  CHECK(merged.count() == a.count() + b.count());
  CHECK(merged.max() == b.max());
  merged.reset();
  CHECK(merged == LatencyHistogram());
}

TEST_CASE("the engine's recorder hands out snapshots equal to a plain histogram", "[metrics]") {
  dma::detail::LatencyRecorder recorder;
  LatencyHistogram expected;
  const auto accepted = std::chrono::steady_clock::now();
  for (const std::chrono::nanoseconds elapsed : {0ns, 800ns, 5000ns, 5000ns, 70000000ns, 3000000000ns}) {
    recorder.record(accepted, accepted + elapsed);
    expected.record(elapsed);
  }
  recorder.record(accepted, accepted - 1us);  // never negative
  expected.record(0);
  CHECK(recorder.snapshot() == expected);
}

namespace {

dma::Metrics sample_metrics() {
  dma::Metrics m;
  m.posted = 1000;
  m.completed = 990;
  m.failed = 12;
  m.eagain = 3;
  m.cq_reads = 400;
  m.fd_wakeups = 120;
  m.timed_out = 2;
  m.cancelled = 1;
  m.peers_marked_unreachable = 1;
  m.registrations = 4;
  m.cache_hits = 15;
  m.cache_misses = 1;
  m.cache_entries = 1;
  m.cache_bytes = 4096;
  for (int i = 0; i < 980; ++i)
    m.latency.record(std::chrono::microseconds(20 + i % 10));
  for (int i = 0; i < 10; ++i)
    m.latency.record(std::chrono::milliseconds(2));
  return m;
}

}  // namespace

// DMA_UPDATE_GOLDEN=1 rewrites test/unit/metrics.prom from the current output (then review the diff).
TEST_CASE("metrics render as Prometheus text", "[metrics]") {
  const std::string text = dma::to_prometheus(sample_metrics());
  const std::string path = test::source_root() + "/test/unit/metrics.prom";
  if (std::getenv("DMA_UPDATE_GOLDEN") != nullptr) std::ofstream(path) << text;
  std::ifstream golden(path);
  REQUIRE(golden);
  std::stringstream expected;
  expected << golden.rdbuf();
  CHECK(text == expected.str());
}

TEST_CASE("the Prometheus histogram is cumulative and ends at its count", "[metrics]") {
  const auto metrics = sample_metrics();
  const std::string text = dma::to_prometheus(metrics, "app_dma_");
  std::istringstream lines(text);
  std::uint64_t previous = 0, buckets = 0, infinite = 0, count = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind('#', 0) == 0) continue;
    CHECK(line.rfind("app_dma_", 0) == 0);
    const auto value = std::stoull(line.substr(line.rfind(' ') + 1));
    if (line.find("_bucket{") != std::string::npos) {
      CHECK(value >= previous);
      previous = value;
      ++buckets;
      if (line.find("le=\"+Inf\"") != std::string::npos) infinite = value;
    } else if (line.rfind("app_dma_transfer_latency_seconds_count ", 0) == 0) {
      count = value;
    }
  }
  CHECK(buckets == LatencyHistogram::bucket_count);
  CHECK(infinite == metrics.latency.count());
  CHECK(count == metrics.latency.count());
}

TEST_CASE("a prefix that no metric name may start with is refused", "[metrics]") {
  CHECK_THROWS_AS(dma::to_prometheus(dma::Metrics{}, "9dma_"), std::invalid_argument);
  CHECK_THROWS_AS(dma::to_prometheus(dma::Metrics{}, "dma-"), std::invalid_argument);
  CHECK_NOTHROW(dma::to_prometheus(dma::Metrics{}, ""));
  CHECK_NOTHROW(dma::to_prometheus(dma::Metrics{}, "service:a_"));
}

TEST_CASE("adding metrics adds every counter, gauge and the histogram", "[metrics]") {
  const dma::Metrics one = sample_metrics();
  dma::Metrics two = one;
  two += one;
  CHECK(two.posted == 2 * one.posted);
  CHECK(two.cache_bytes == 2 * one.cache_bytes);
  CHECK(two.latency.count() == 2 * one.latency.count());
  // Every line of the exposition doubles: no field is left out.
  std::istringstream a(dma::to_prometheus(one)), b(dma::to_prometheus(two));
  for (std::string x, y; std::getline(a, x) && std::getline(b, y);) {
    if (x.rfind('#', 0) == 0 || x.find("_bucket{") != std::string::npos) continue;
    const auto space = x.rfind(' ');
    CAPTURE(x, y);
    CHECK(std::stod(y.substr(space + 1)) == Approx(2 * std::stod(x.substr(space + 1))));
  }
}
