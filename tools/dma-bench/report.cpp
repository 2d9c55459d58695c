#include "report.hpp"

#include <dma/dma.hpp>
#include <dma/version.hpp>

#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

namespace bench {
namespace {

std::string first_line(const char* path) {
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) return "?";
  char buffer[256] = {};
  const bool ok = std::fgets(buffer, sizeof buffer, file) != nullptr;
  std::fclose(file);
  std::string text = ok ? buffer : "?";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
    text.pop_back();
  return text;
}

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + '"';
}

std::string clock_text(double seconds) {
  const auto s = static_cast<long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%02ld:%02ld", s / 60, s % 60);
  }
  return text;
}

}  // namespace

Environment environment(const std::string& provider) {
  Environment e;
  e.dma_libfabric = std::string(dma::version());
  e.libfabric = dma::fabric_version();
  e.provider = provider;
  utsname name{};
  e.kernel = uname(&name) == 0 ? name.release : "?";
  e.congestion_control = first_line("/proc/sys/net/ipv4/tcp_congestion_control");
  e.cpus = std::thread::hardware_concurrency();
  return e;
}

std::string environment_line(const Environment& e) {
  return "libfabric " + e.libfabric + ", provider " + e.provider + ", tcp_congestion_control " + e.congestion_control +
         ", kernel " + e.kernel + ", " + std::to_string(e.cpus) + " CPUs";
}

void print_table(const std::vector<Row>& rows, bool child_target) {
  std::printf("%-9s %-5s %6s %5s %-8s %3s %9s %9s %9s %9s %9s %9s %9s %8s %9s %9s %8s %8s %12s\n", "api", "dir", "size",
              "depth", "wait", "ep", "GB/s", "Mxfer/s", "cpu-i/GiB", child_target ? "cpu-t/GiB" : "", "p50 us",
              "p99 us", "svc p50", "t-sleeps", "raw GB/s", "raw cpu-i", "raw t-sl", "lib/raw", "95% CI");
  for (const auto& r : rows) {
    char p50[16] = "-", p99[16] = "-", cpu_t[16] = "", service_p50[16] = "-";
    if (r.lib.service_p50 > 0) std::snprintf(service_p50, sizeof service_p50, "%.1f", r.lib.service_p50);
    if (r.point.depth == 1 && !r.library_missing) {
      std::snprintf(p50, sizeof p50, "%.1f", r.lib.p50);
      std::snprintf(p99, sizeof p99, "%.1f", r.lib.p99);
    }
    if (child_target) std::snprintf(cpu_t, sizeof cpu_t, "%.3f", r.lib.cpu_target);
    char raw_gbps[16] = "-", raw_cpu[16] = "-", ratio_text[16] = "-", gbps[16] = "-", mops[16] = "-", cpu_i[16] = "-";
    char sleeps[16] = "-", raw_sleeps[16] = "-";
    if (!r.raw_missing) {
      std::snprintf(raw_gbps, sizeof raw_gbps, "%.3f", r.raw.gbps);
      std::snprintf(raw_cpu, sizeof raw_cpu, "%.3f", r.raw.cpu_init);
      std::snprintf(raw_sleeps, sizeof raw_sleeps, "%.3f", r.raw.target_sleeps);
    }
    if (!r.library_missing) {
      std::snprintf(gbps, sizeof gbps, "%.3f", r.lib.gbps);
      std::snprintf(mops, sizeof mops, "%.4f", r.lib.mops);
      std::snprintf(cpu_i, sizeof cpu_i, "%.3f", r.lib.cpu_init);
      std::snprintf(sleeps, sizeof sleeps, "%.3f", r.lib.target_sleeps);
    }
    char interval[32] = "-";
    if (!r.raw_missing && !r.library_missing) {
      std::snprintf(ratio_text, sizeof ratio_text, "%.3f", r.ratio);
      if (r.ratio_high > 0) std::snprintf(interval, sizeof interval, "%.3f-%.3f", r.ratio_low, r.ratio_high);
    }
    if (r.library_missing || !child_target) cpu_t[0] = '\0';
    std::printf("%-9s %-5s %6s %5d %-8s %3zu %9s %9s %9s %9s %9s %9s %9s %8s %9s %9s %8s %8s %12s%s\n",
                std::string(to_string(r.point.api)).c_str(), std::string(to_string(r.point.direction)).c_str(),
                size_text(r.point.size).c_str(), r.point.depth, std::string(to_string(r.point.wait)).c_str(),
                r.point.endpoints, gbps, mops, cpu_i, cpu_t, p50, p99, service_p50, sleeps, raw_gbps, raw_cpu,
                raw_sleeps, ratio_text, interval, r.lib.errors != 0 ? "  ERRORS" : "");
  }
}

void print_json(const std::vector<Row>& rows, const Environment& e, const Options& o, bool complete) {
  std::printf("{\n  \"schema_version\": %d,\n  \"dma_libfabric\": %s,\n  \"complete\": %s,\n", json_schema_version,
              quoted(e.dma_libfabric).c_str(), complete ? "true" : "false");
  std::printf(
      "  \"environment\": {\"libfabric\": %s, \"provider\": %s, \"kernel\": %s, \"cpus\": %u, "
      "\"tcp_congestion_control\": %s},\n",
      quoted(e.libfabric).c_str(), quoted(e.provider).c_str(), quoted(e.kernel).c_str(), e.cpus,
      quoted(e.congestion_control).c_str());
  std::printf(
      "  \"parameters\": {\"runs\": %d, \"duration_s\": %.6g, \"spin_us\": %.6g, \"target\": %s, "
      "\"target_wait\": %s, \"bind\": %s, \"config\": %s, \"hugepages\": %s, \"pin\": ",
      o.runs, o.duration, o.spin_us, o.inprocess_target ? "\"inprocess\"" : "\"child\"",
      quoted(std::string(to_string(o.target_wait))).c_str(), quoted(o.bind).c_str(),
      o.config.empty() ? "null" : quoted(o.config).c_str(), o.hugepages ? "true" : "false");
  if (o.initiator_cpu >= 0) {
    std::printf("[%d, %d]},\n", o.initiator_cpu, o.target_cpu);
  } else {
    std::printf("null},\n");
  }
  std::printf(
      "  \"units\": {\"size\": \"bytes\", \"gbps\": \"1e9 bytes/s\", \"mtransfers_per_s\": \"1e6 transfers/s\", "
      "\"cpu_initiator_s_per_gib\": \"CPU s per GiB moved\", \"cpu_target_s_per_gib\": \"CPU s per GiB moved\", "
      "\"target_sleeps_per_transfer\": \"voluntary context switches of the target's progress thread per transfer\", "
      "\"p50_us\": \"microseconds\", \"p99_us\": \"microseconds\", "
      "\"service_p50_us\": \"microseconds, the service's Metrics::latency histogram over the run\", "
      "\"ratio\": \"measured / raw transfer rate, median over interleaved pairs\", "
      "\"ratio_ci95\": \"distribution-free 95 %% interval of that median (null below 6 pairs)\"},\n");
  std::printf("  \"rows\": [\n");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    char interval[48] = "null";
    if (r.ratio_high > 0) std::snprintf(interval, sizeof interval, "[%.4f, %.4f]", r.ratio_low, r.ratio_high);
    std::printf(
        "    {\"api\": \"%s\", \"direction\": \"%s\", \"size\": %zu, \"depth\": %d, \"wait\": \"%s\", \"endpoints\": "
        "%zu, \"runs\": %d, "
        "\"gbps\": %.6f, \"mtransfers_per_s\": %.6f, \"cpu_initiator_s_per_gib\": %.6f, "
        "\"cpu_target_s_per_gib\": %.6f, \"target_sleeps_per_transfer\": %.4f, \"p50_us\": %.3f, "
        "\"p99_us\": %.3f, \"service_p50_us\": %.3f, \"raw_gbps\": %.6f, \"raw_mtransfers_per_s\": %.6f, "
        "\"raw_p50_us\": %.3f, "
        "\"raw_cpu_initiator_s_per_gib\": %.6f, \"raw_cpu_target_s_per_gib\": %.6f, "
        "\"raw_target_sleeps_per_transfer\": %.4f, \"ratio\": %.4f, \"ratio_ci95\": %s, \"errors\": %llu}%s\n",
        std::string(to_string(r.point.api)).c_str(), std::string(to_string(r.point.direction)).c_str(), r.point.size,
        r.point.depth, std::string(to_string(r.point.wait)).c_str(), r.point.endpoints, r.runs, r.lib.gbps, r.lib.mops,
        r.lib.cpu_init, r.lib.cpu_target, r.lib.target_sleeps, r.lib.p50, r.lib.p99, r.lib.service_p50, r.raw.gbps,
        r.raw.mops, r.raw.p50, r.raw.cpu_init, r.raw.cpu_target, r.raw.target_sleeps, r.ratio, interval,
        static_cast<unsigned long long>(r.lib.errors), i + 1 < rows.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
  std::fflush(stdout);
}

Progress::Progress(double units, double seconds_per_unit)
    : units_(units), seconds_per_unit_(seconds_per_unit), terminal_(isatty(STDERR_FILENO) != 0) {}

void Progress::update(std::size_t point, std::size_t points, const Point& at, double units_done) {
  const auto now = Clock::now();
  if (shown_ && now - last_ < std::chrono::seconds(1)) return;
  if (!shown_ && now - start_ < std::chrono::seconds(1)) return;
  last_ = now;
  shown_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double left =
      units_done > 0 ? elapsed / units_done * (units_ - units_done) : (units_ - units_done) * seconds_per_unit_;
  std::fprintf(stderr, "%sdma-bench: point %zu/%zu %s %s %s d%d %s, %s elapsed, ETA %s%s", terminal_ ? "\r" : "",
               point + 1, points, std::string(to_string(at.api)).c_str(), std::string(to_string(at.direction)).c_str(),
               size_text(at.size).c_str(), at.depth, std::string(to_string(at.wait)).c_str(),
               clock_text(elapsed).c_str(), clock_text(left).c_str(), terminal_ ? "\033[K" : "\n");
}

void Progress::finish() {
  if (shown_ && terminal_) std::fprintf(stderr, "\r\033[K");
}

}  // namespace bench
