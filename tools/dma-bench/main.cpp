// dma-bench: the library against a plain libfabric loop, side by side, over tcp on 127.0.0.1.
//
// Sweeps transfer size, direction, depth, API (awaitable, handler, callback, and raw as an A/A
// control) and wait mode (fd, adaptive, busy). Every point is measured interleaved with the raw
// loop at the same size, direction, depth and wait mode (A, B, B, A, ...), and reported as medians
// with the ratio. The target is a child process (`dma-bench --serve`) unless --target inprocess.
// Ctrl-C stops after the run in progress and reports what was measured so far.
//
// Parts: options (command line), target (child or in-process peer), setup (shared buffers and
// requests), library (the library's APIs), raw (the plain loop), statistics, report.
#include "library.hpp"
#include "options.hpp"
#include "raw.hpp"
#include "report.hpp"
#include "statistics.hpp"
#include "target.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <variant>
#include <vector>

namespace {

using namespace bench;

std::atomic<bool> interrupted{false};

void on_interrupt(int) { interrupted = true; }

// The first SIGINT or SIGTERM ends the sweep after the run in progress; a second one (the
// handler resets itself) ends the process at once.
void install_interrupt_handler() {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a dead target shows up as a failed write, not a dead benchmark
}

std::vector<Point> points_of(const Options& o) {
  std::vector<Point> points;
  for (const auto direction : o.directions) {
    for (const auto size : o.sizes) {
      for (const int depth : o.depths) {
        for (const auto wait : o.waits) {
          for (const auto endpoints : o.endpoints) {
            for (const auto api : o.apis)
              points.push_back({api, direction, size, depth, wait, endpoints});
          }
        }
      }
    }
  }
  return points;
}

std::string self_path() {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw std::runtime_error("cannot find this program's path in /proc/self/exe");
  return std::string(self, static_cast<std::size_t>(n));
}

struct Sweep {
  std::vector<Row> rows;
  bool complete = true;
  std::uint64_t library_total = 0, raw_total = 0;
};

int run(const Options& options) {
  const std::size_t largest = *std::max_element(options.sizes.begin(), options.sizes.end());
  const int deepest = *std::max_element(options.depths.begin(), options.depths.end());
  const std::size_t span = largest * static_cast<std::size_t>(deepest);

  std::unique_ptr<Target> target;
  if (options.inprocess_target) {
    target = std::make_unique<InProcessTarget>(options.configuration, options.bind, span, options.target_wait,
                                               options.target_cpu);
  } else {
    target = std::make_unique<ChildTarget>(self_path(), options.config, options.bind, span, options.target_wait,
                                           options.target_cpu);
  }
  pin_to(options.initiator_cpu);  // after the target started: its process or thread pins itself
  LocalBuffer local(span, options.hugepages);
  Setup setup{options.configuration,
              target->advertisement(),
              std::chrono::nanoseconds(static_cast<std::int64_t>(options.spin_us * 1000)),
              options.bind,
              local.bytes(),
              options.duration,
              deepest};
  Library library(setup);
  Raw raw(setup);
  std::unique_ptr<Raw> control;  // --apis raw: the baseline against itself

  const auto points = points_of(options);
  const auto env = environment(raw.provider(points.front().wait));
  std::fprintf(stderr, "environment: %s\n", environment_line(env).c_str());

  const bool run_measured = options.only != Only::raw, run_raw = options.only != Only::library;
  const double sides = (run_measured ? 1.0 : 0.0) + (run_raw ? 1.0 : 0.0);
  const double units_per_point = sides * (0.25 + options.runs);
  Progress progress(units_per_point * static_cast<double>(points.size()), options.duration);
  double units_done = 0;
  Sweep sweep;

  for (std::size_t i = 0; i < points.size() && !interrupted; ++i) {
    const auto& point = points[i];
    if (point.api == Api::raw && !control) control = std::make_unique<Raw>(setup);
    if (point.api != Api::raw) library.prepare(point);
    auto measured = [&] { return point.api == Api::raw ? control->run(point) : library.run(point); };
    {  // warm-up, discarded: connections, page faults, caches
      setup.duration = options.duration / 4;
      if (run_measured) sweep.library_total += measured().transfers;
      if (run_raw) sweep.raw_total += raw.run(point).transfers;
      setup.duration = options.duration;
      units_done += sides * 0.25;
    }
    // getrusage of this process and of the child around each run (the in-process target's CPU
    // shows up in the initiator's).
    auto timed = [&](auto&& body) {
      const double cpu0 = cpu_seconds();
      const TargetUsage target0 = target->usage();
      Sample s = body();
      s.cpu_initiator = cpu_seconds() - cpu0;
      const TargetUsage target1 = target->usage();
      s.cpu_target = target1.cpu - target0.cpu;
      s.target_sleeps = target1.sleeps - target0.sleeps;
      return s;
    };
    std::vector<Sample> measured_samples, raw_samples;
    auto one = [&](bool library_side) {
      if (interrupted) return;
      if (library_side && run_measured) {
        measured_samples.push_back(timed(measured));
        sweep.library_total += measured_samples.back().transfers;
        units_done += 1;
      } else if (!library_side && run_raw) {
        raw_samples.push_back(timed([&] { return raw.run(point); }));
        sweep.raw_total += raw_samples.back().transfers;
        units_done += 1;
      }
      progress.update(i, points.size(), point, units_done);
    };
    for (int r = 0; r < options.runs && !interrupted; ++r) {  // A B, B A, A B, ...: whichever goes second has no edge
      one(r % 2 == 0);
      one(r % 2 != 0);
    }
    if (!measured_samples.empty() || !raw_samples.empty()) {
      sweep.rows.push_back(summarise(point, measured_samples, raw_samples));
    }
  }
  progress.finish();
  sweep.complete = !interrupted;

  // For instruction counts (valgrind --tool=callgrind --toggle-collect=...): divide by these.
  std::fprintf(stderr, "transfers run: library %llu, raw %llu\n", static_cast<unsigned long long>(sweep.library_total),
               static_cast<unsigned long long>(sweep.raw_total));
  if (options.only == Only::library) library.print_metrics();
  if (options.json) {
    print_json(sweep.rows, env, options, sweep.complete);
  } else {
    print_table(sweep.rows, target->is_child());
  }
  std::uint64_t errors = 0;
  for (const auto& row : sweep.rows)
    errors += row.lib.errors;
  if (!sweep.complete) {
    std::fprintf(stderr, "dma-bench: interrupted; reported %zu of %zu points (the last one may have fewer runs)\n",
                 sweep.rows.size(), points.size());
    return 130;
  }
  if (errors != 0) {  // a benchmark whose transfers failed measured nothing
    std::fprintf(stderr, "dma-bench: %llu transfers failed\n", static_cast<unsigned long long>(errors));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto parsed = parse_options(argc, argv);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  const Options& options = std::get<Options>(parsed);
  try {
    // Named threads, so that profilers tell the two processes (and their threads) apart.
    prctl(PR_SET_NAME, options.serve ? "bench-target" : "bench-initiator");
    if (options.serve)
      return serve(options.configuration, options.bind, options.region, options.target_wait, options.serve_cpu);
    install_interrupt_handler();
    return run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "dma-bench: %s\n", error.what());
    return 1;
  }
}
