// dma-bench's statistics: medians over runs, latency percentiles, a distribution-free interval
// for the median, and the summary row of one point. Pure functions, unit-tested.
#pragma once

#include "types.hpp"

#include <cstdint>
#include <utility>
#include <vector>

namespace bench {

/// The middle value (the upper one of an even count); 0 for none.
double median(std::vector<double> values);

/// The value at rank floor(p * n) of the sorted values (clamped to the last); 0 for none.
double percentile(std::vector<double> values, double p);

/// A distribution-free 95 % confidence interval for the median of independent values: the k-th
/// smallest and k-th largest, with k the largest rank such that P(Binomial(n, 1/2) < k) <= 2.5 %.
/// Below 6 values no such k exists and {0, 0} comes back.
std::pair<double, double> median_interval(std::vector<double> values);

/// The medians of one side's runs at a point (CPU is seconds per GiB moved).
struct Medians {
  double gbps = 0, mops = 0, cpu_init = 0, cpu_target = 0, p50 = 0, p99 = 0;
  double service_p50 = 0;    ///< the service's histogram (Metrics::latency) p50, microseconds; 0 for the raw loop
  double target_sleeps = 0;  ///< per transfer
  std::uint64_t errors = 0;  ///< summed over the runs
};

Medians medians_of(const Point& point, const std::vector<Sample>& runs);

struct Row {
  Point point;
  Medians lib, raw;                      ///< the measured side (library or A/A control) and the raw loop beside it
  double ratio = 0;                      ///< median of the per-pair transfer-rate ratios measured / raw
  double ratio_low = 0, ratio_high = 0;  ///< its 95 % confidence interval (0, 0: fewer than 6 pairs)
  int runs = 0;
  bool library_missing = false, raw_missing = false;  ///< --only, or interrupted: a side did not run
};

/// One point's row. Run i of `measured` ran next to run i of `raw`, so each pair's ratio cancels
/// most drift; the row's ratio is their median.
Row summarise(const Point& point, const std::vector<Sample>& measured, const std::vector<Sample>& raw);

}  // namespace bench
