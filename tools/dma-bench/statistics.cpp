#include "statistics.hpp"

#include <algorithm>
#include <cmath>

namespace bench {

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::max(0.0, p) * static_cast<double>(values.size()));
  return values[std::min(values.size() - 1, rank)];
}

std::pair<double, double> median_interval(std::vector<double> values) {
  const std::size_t n = values.size();
  double tail = 0, term = std::pow(0.5, static_cast<double>(n));  // P(X = 0)
  std::size_t k = 0;
  for (std::size_t j = 0; j < n; ++j) {  // tail = P(X <= j)
    tail += term;
    if (tail > 0.025) break;
    k = j + 1;
    term *= static_cast<double>(n - j) / static_cast<double>(j + 1);
  }
  if (k == 0) return {0, 0};
  std::sort(values.begin(), values.end());
  return {values[k - 1], values[n - k]};
}

Medians medians_of(const Point& point, const std::vector<Sample>& runs) {
  std::vector<double> gbps, mops, cpu_i, cpu_t, p50, p99, sleeps, service_p50;
  Medians m;
  for (const auto& s : runs) {
    if (s.seconds <= 0) continue;
    const double bytes = static_cast<double>(s.transfers) * static_cast<double>(point.size);
    gbps.push_back(bytes / s.seconds / 1e9);
    mops.push_back(static_cast<double>(s.transfers) / s.seconds / 1e6);
    const double gib = bytes / static_cast<double>(1u << 30);
    cpu_i.push_back(gib > 0 ? s.cpu_initiator / gib : 0);
    cpu_t.push_back(gib > 0 ? s.cpu_target / gib : 0);
    sleeps.push_back(s.transfers > 0 ? static_cast<double>(s.target_sleeps) / static_cast<double>(s.transfers) : 0);
    p50.push_back(percentile(s.latencies_us, 0.5));
    p99.push_back(percentile(s.latencies_us, 0.99));
    if (s.service_p50_us > 0) service_p50.push_back(s.service_p50_us);
    m.errors += s.errors;
  }
  m.gbps = median(gbps);
  m.mops = median(mops);
  m.cpu_init = median(cpu_i);
  m.cpu_target = median(cpu_t);
  m.target_sleeps = median(sleeps);
  m.p50 = median(p50);
  m.p99 = median(p99);
  m.service_p50 = median(service_p50);
  return m;
}

Row summarise(const Point& point, const std::vector<Sample>& measured, const std::vector<Sample>& raw) {
  Row row{point, medians_of(point, measured), medians_of(point, raw)};
  row.runs = static_cast<int>(std::max(measured.size(), raw.size()));
  row.library_missing = measured.empty();
  row.raw_missing = raw.empty();
  std::vector<double> ratios;
  for (std::size_t i = 0; i < measured.size() && i < raw.size(); ++i) {
    if (measured[i].seconds <= 0 || raw[i].seconds <= 0) continue;
    const double measured_rate = static_cast<double>(measured[i].transfers) / measured[i].seconds;
    const double raw_rate = static_cast<double>(raw[i].transfers) / raw[i].seconds;
    if (raw_rate > 0) ratios.push_back(measured_rate / raw_rate);
  }
  row.ratio = median(ratios);
  std::tie(row.ratio_low, row.ratio_high) = median_interval(ratios);
  return row;
}

}  // namespace bench
