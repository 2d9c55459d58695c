#include "options.hpp"

#include <dma/version.hpp>

#include <sched.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>

namespace bench {
namespace {

CLI::Validator size_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (parse_size(text)) return {};
        return "not a size: '" + text + "' (a positive number of bytes up to 1G, with an optional K, M or G suffix)";
      },
      "SIZE[K|M|G]");
}

std::optional<int> cpu_number(std::string_view text) {
  int value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0 || value >= CPU_SETSIZE) {
    return std::nullopt;
  }
  return value;
}

CLI::Validator pin_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const auto comma = text.find(',');
        if (comma != std::string::npos && cpu_number(std::string_view(text).substr(0, comma)) &&
            cpu_number(std::string_view(text).substr(comma + 1))) {
          return {};
        }
        return "takes two CPU numbers, initiator,target: '" + text + "'";
      },
      "I,T");
}

template <typename T, typename From>
std::vector<T> converted(const std::vector<std::string>& names, From from) {
  std::vector<T> out;
  for (const auto& name : names) {
    const auto value = from(name);
    if (value && std::find(out.begin(), out.end(), *value) == out.end()) out.push_back(*value);
  }
  return out;
}

}  // namespace

std::variant<Options, int> parse_options(int argc, char** argv) {
  CLI::App app{"dma-bench: dma-libfabric against a plain libfabric loop over tcp on 127.0.0.1", "dma-bench"};
  app.set_version_flag("--version", "dma-bench (dma-libfabric) " + std::string(dma::version()));
  Options o;
  std::vector<std::string> sizes = {"64", "1K", "4K", "64K", "1M", "4M"}, directions = {"write", "read"};
  std::vector<std::string> apis = {"awaitable", "callback"}, waits = {"fd", "adaptive", "busy"};
  std::vector<int> depths = {1, 16, 64};
  std::vector<int> endpoints;
  std::string target = "child", target_wait = "fd", only, pin;
  const auto wait_names = CLI::IsMember({"fd", "adaptive", "busy"});

  app.add_option("--config", o.config,
                 "TOML file whose [dma-libfabric] table configures both sides' endpoints; the options given "
                 "here override it (--bind, --wait, --spin-us, --target-wait)");
  app.add_option("--sizes", sizes, "transfer sizes, comma-separated (K, M, G suffixes)")
      ->delimiter(',')
      ->check(size_validator())
      ->capture_default_str();
  app.add_option("--directions", directions, "write, read")
      ->delimiter(',')
      ->check(CLI::IsMember({"write", "read"}))
      ->capture_default_str();
  app.add_option("--depths", depths, "transfers in flight, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--apis", apis,
                 "awaitable, handler (plain completion handler), callback; raw = a second raw loop on its own "
                 "endpoint, an A/A control of the harness (the raw baseline always runs alongside)")
      ->delimiter(',')
      ->check(CLI::IsMember({"awaitable", "handler", "callback", "raw"}))
      ->capture_default_str();
  app.add_option("--wait", waits, "fd, adaptive, busy")->delimiter(',')->check(wait_names)->capture_default_str();
  app.add_option("--endpoints", endpoints,
                 "endpoints the library's service stripes over, comma-separated, 1 to 16 (default: the "
                 "configuration's, 1); the raw loop always uses one")
      ->delimiter(',')
      ->check(CLI::Range(1, 16));
  app.add_option("--runs", o.runs, "interleaved runs per point (medians are reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--duration", o.duration, "seconds per run")->check(CLI::Range(0.001, 3600.0))->capture_default_str();
  app.add_option("--spin-us", o.spin_us, "adaptive wait: microseconds to poll before arming the fd")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--target", target, "child or inprocess")
      ->check(CLI::IsMember({"child", "inprocess"}))
      ->capture_default_str();
  app.add_option("--bind", o.bind, "loopback address to use")->capture_default_str();
  app.add_option("--target-wait", target_wait,
                 "the target's wait mode: fd, adaptive, busy (a spinning target spares the writer the wake-ups "
                 "loopback charges to its sendmsg)")
      ->check(wait_names)
      ->capture_default_str();
  app.add_option("--only", only, "run one side alone, for profilers (no ratio; library also prints engine counters)")
      ->check(CLI::IsMember({"library", "raw"}));
  app.add_flag("--hugepages", o.hugepages, "back the initiator's buffers with transparent huge pages");
  app.add_flag("--json", o.json, "print JSON instead of a table");
  app.add_option("--pin", pin,
                 "I,T: run the initiator on CPU I and the target on CPU T (both sides of every pair alike), "
                 "which takes the scheduler's placement out of the comparison")
      ->check(pin_validator());
  app.add_option("--serve-cpu", o.serve_cpu, "internal: the target process's CPU")->group("");
  app.add_flag("--serve", o.serve, "internal: run as the target process")->group("");
  app.add_option("--region", o.region, "internal: bytes the target exposes")->group("");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }

  o.sizes = converted<std::size_t>(sizes, [](const std::string& s) { return parse_size(s); });
  o.directions = converted<dma::Direction>(directions, [](const std::string& s) { return direction_from(s); });
  for (const int d : depths) {
    if (std::find(o.depths.begin(), o.depths.end(), d) == o.depths.end()) o.depths.push_back(d);
  }
  o.apis = converted<Api>(apis, [](const std::string& s) { return api_from(s); });
  o.waits = converted<Wait>(waits, [](const std::string& s) { return wait_from(s); });
  for (const int n : endpoints) {
    const auto value = static_cast<std::size_t>(n);
    if (std::find(o.endpoints.begin(), o.endpoints.end(), value) == o.endpoints.end()) o.endpoints.push_back(value);
  }
  o.inprocess_target = target == "inprocess";
  o.target_wait = *wait_from(target_wait);
  if (!only.empty()) o.only = only == "library" ? Only::library : Only::raw;
  if (!o.config.empty()) {
    std::error_code ec;
    std::string message;
    o.configuration = dma::Configuration::from_toml(o.config, dma::Configuration::default_section, ec, message);
    if (ec) {
      std::fprintf(stderr, "--config: %s\nRun with --help for more information.\n", message.c_str());
      return 2;
    }
    const auto& file = o.configuration;
    if (app.count("--bind") == 0 && file.bind) o.bind = *file.bind;
    if (app.count("--wait") == 0) o.waits = {wait_of(file.wait_mode)};
    if (app.count("--target-wait") == 0) o.target_wait = wait_of(file.wait_mode);
    if (app.count("--spin-us") == 0) {
      o.spin_us = std::chrono::duration<double, std::micro>(file.spin_budget).count();
    }
  }
  if (!pin.empty()) {
    const auto comma = pin.find(',');
    o.initiator_cpu = *cpu_number(std::string_view(pin).substr(0, comma));
    o.target_cpu = *cpu_number(std::string_view(pin).substr(comma + 1));
  }
  if (o.endpoints.empty()) o.endpoints = {std::max<std::size_t>(o.configuration.endpoints, 1)};
  if (o.serve) return o;

  auto refuse = [](const std::string& message) {
    std::fprintf(stderr, "%s\nRun with --help for more information.\n", message.c_str());
    return 2;
  };
  if (o.sizes.empty()) return refuse("--sizes: nothing to measure");
  if (o.depths.empty()) return refuse("--depths: nothing to measure");
  if (o.directions.empty()) return refuse("--directions: nothing to measure");
  if (o.apis.empty()) return refuse("--apis: nothing to measure");
  if (o.waits.empty()) return refuse("--wait: nothing to measure");
  const std::size_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  const auto deepest = static_cast<std::size_t>(*std::max_element(o.depths.begin(), o.depths.end()));
  if (largest * deepest > max_span) {
    return refuse("--sizes, --depths: " + size_text(largest) + " x " + std::to_string(deepest) +
                  " in flight needs more than the " + size_text(max_span) + " of buffer dma-bench allows per side");
  }
  return o;
}

}  // namespace bench
