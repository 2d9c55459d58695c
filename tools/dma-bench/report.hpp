// dma-bench's output: the environment that shaped the numbers, the table, the JSON document, and
// the progress line on stderr.
#pragma once

#include "options.hpp"
#include "statistics.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace bench {

/// What shapes the numbers besides the library. Over loopback the kernel's congestion control
/// sets the level (cubic runs 1 MiB writes ~1.7x faster than bbr).
struct Environment {
  std::string dma_libfabric, libfabric, provider, kernel, congestion_control;
  unsigned cpus = 0;
};

Environment environment(const std::string& provider);
/// "libfabric 1.17, provider tcp;ofi_rxm, tcp_congestion_control cubic, kernel 6.1.0, 2 CPUs"
std::string environment_line(const Environment& environment);

void print_table(const std::vector<Row>& rows, bool child_target);

/// The version of print_json's document shape; bumped when a field changes meaning or goes away.
inline constexpr int json_schema_version = 2;

/// {"schema_version", "dma_libfabric", "complete", "environment", "parameters", "units", "rows"}.
void print_json(const std::vector<Row>& rows, const Environment& environment, const Options& options, bool complete);

/// The progress line on stderr: at most once a second, with the time left estimated from the runs
/// so far; rewritten in place on a terminal, one line each otherwise.
class Progress {
 public:
  /// `units` is the sweep's whole work in run-lengths (a warm-up counts a quarter per side).
  Progress(double units, double seconds_per_unit);
  void update(std::size_t point, std::size_t points, const Point& at, double units_done);
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  double units_, seconds_per_unit_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
  bool terminal_;
  bool shown_ = false;
};

}  // namespace bench
