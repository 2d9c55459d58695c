// dma-bench's statistics and size parsing: medians, percentiles, the median's interval, rows.
#include "../../tools/dma-bench/statistics.hpp"
#include "../catch.hpp"

#include <vector>

namespace {

bench::Sample run_of(double seconds, std::uint64_t transfers, std::vector<double> latencies = {}) {
  bench::Sample s;
  s.seconds = seconds;
  s.transfers = transfers;
  s.latencies_us = std::move(latencies);
  return s;
}

}  // namespace

TEST_CASE("the median of an odd count is the middle value, of an even count the upper middle", "[bench]") {
  CHECK(bench::median({}) == 0);
  CHECK(bench::median({5}) == 5);
  CHECK(bench::median({3, 1, 2}) == 2);
  CHECK(bench::median({4, 1, 3, 2}) == 3);
}

TEST_CASE("a percentile is the value at rank floor(p n) of the sorted values", "[bench]") {
  std::vector<double> values;
  for (int i = 100; i >= 1; --i)
    values.push_back(i);
  CHECK(bench::percentile(values, 0.5) == 51);
  CHECK(bench::percentile(values, 0.99) == 100);
  CHECK(bench::percentile(values, 1.0) == 100);  // clamped to the last
  CHECK(bench::percentile(values, 0.0) == 1);
  CHECK(bench::percentile({}, 0.5) == 0);
}

TEST_CASE("the median's 95 % interval needs 6 values and widens to the binomial ranks", "[bench]") {
  CHECK(bench::median_interval({1, 2, 3, 4, 5}) == std::pair<double, double>{0, 0});
  // n = 6: P(X = 0) = 1/64 <= 2.5 %, P(X <= 1) = 7/64 > 2.5 %: k = 1, the extremes.
  CHECK(bench::median_interval({6, 1, 5, 2, 4, 3}) == std::pair<double, double>{1, 6});
  // n = 41: P(X <= 13) = 1.2 %, P(X <= 14) = 2.8 %: k = 14, the 14th smallest and largest.
  std::vector<double> values;
  for (int i = 1; i <= 41; ++i)
    values.push_back(i);
  CHECK(bench::median_interval(values) == std::pair<double, double>{14, 28});
}

TEST_CASE("medians_of turns runs into GB/s, transfers/s, CPU per GiB and latency percentiles", "[bench]") {
  bench::Point point;
  point.size = 1 << 20;
  std::vector<bench::Sample> runs = {run_of(1.0, 1000, {10, 20, 30}), run_of(2.0, 1000, {40}), run_of(1.0, 3000, {5})};
  runs[0].cpu_initiator = 0.5;
  runs[0].errors = 1;
  runs[2].errors = 2;
  const auto m = bench::medians_of(point, runs);
  CHECK(m.gbps == Approx(1000.0 * (1 << 20) / 1e9));  // rates 1000, 500, 3000: median 1000
  CHECK(m.mops == Approx(1000.0 / 1e6));
  CHECK(m.p50 == 20);                                         // per-run p50s 20, 40, 5
  CHECK(m.errors == 3);                                       // summed, not a median
  CHECK(m.cpu_init == Approx(0.0));                           // 0.5 / ~0.98 GiB, 0, 0: median 0
  CHECK(bench::medians_of(point, {run_of(0, 0)}).gbps == 0);  // a run that never ran is skipped
}

TEST_CASE("a row's ratio is the median of the interleaved pairs' rate ratios", "[bench]") {
  bench::Point point;
  point.size = 64;
  const std::vector<bench::Sample> library = {run_of(1, 90), run_of(1, 80), run_of(1, 100)};
  const std::vector<bench::Sample> raw = {run_of(1, 100), run_of(1, 100), run_of(2, 100)};
  const auto row = bench::summarise(point, library, raw);
  CHECK(row.ratio == Approx(0.9));  // pairs 0.9, 0.8, 2.0
  CHECK(row.runs == 3);
  CHECK(row.ratio_high == 0);  // fewer than 6 pairs: no interval
  CHECK_FALSE(row.library_missing);

  const auto alone = bench::summarise(point, {}, raw);  // --only raw
  CHECK(alone.library_missing);
  CHECK(alone.ratio == 0);
}

TEST_CASE("sizes take B, K, M and G suffixes and refuse zero, junk and more than 1 GiB", "[bench]") {
  CHECK(bench::parse_size("64") == 64u);
  CHECK(bench::parse_size("64B") == 64u);
  CHECK(bench::parse_size("4K") == 4096u);
  CHECK(bench::parse_size("4KiB") == 4096u);
  CHECK(bench::parse_size("1M") == std::size_t{1} << 20);
  CHECK(bench::parse_size("1G") == std::size_t{1} << 30);
  CHECK_FALSE(bench::parse_size("0"));
  CHECK_FALSE(bench::parse_size("2G"));
  CHECK_FALSE(bench::parse_size("x"));
  CHECK_FALSE(bench::parse_size("4Q"));
  CHECK_FALSE(bench::parse_size("-4"));
  CHECK_FALSE(bench::parse_size(""));
  CHECK(bench::size_text(4096) == "4K");
  CHECK(bench::size_text(100) == "100");
}
