// dma-footprint: resident memory per Target, per service and per peer, and the write rate against
// the number of peers. Targets for the peer sweep live in child processes (this program with
// --serve), so the service's process holds only the service.
#include "../common/child_process.hpp"
#include "../common/resident_memory.hpp"

#include <dma/dma.hpp>
#include <dma/version.hpp>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr double mib = 1024.0 * 1024.0;
constexpr std::size_t region_size = 4096;

struct Options {
  std::size_t targets = 5;
  std::vector<std::size_t> peers = {1, 10, 100};
  std::size_t targets_per_process = 100;
  double duration = 1.0;
  std::size_t depth = 64;
  std::size_t size = 64;
  std::string provider = "tcp";
  bool slim = true;
  bool json = false;
  std::size_t serve = 0;  // internal: host this many Targets and print their advertisements
  std::string config;     // --config FILE, loaded into `base`
  dma::Configuration base;
};

// The --config file's configuration, with the provider and the loopback bind the tool measures.
dma::Configuration configuration_for(const Options& o) {
  dma::Configuration configuration = o.base;
  configuration.providers = {dma::from_string<dma::Provider>(o.provider).value_or(dma::Provider::tcp)};
  configuration.bind = "127.0.0.1";
  return configuration;
}

double to_mib(std::size_t after, std::size_t before) {
  return after > before ? static_cast<double>(after - before) / mib : 0.0;
}

// The child: `count` Targets on one io_context thread. Prints "rss <before> <after>" (bytes, its
// own), then one advertisement per line, then runs until its input closes.
int serve(const Options& o) {
  const auto configuration = configuration_for(o);
  asio::io_context io;
  std::vector<std::unique_ptr<dma::Target>> targets;
  std::vector<std::vector<std::byte>> memory(o.serve, std::vector<std::byte>(region_size));
  std::vector<dma::Target::Region> regions;
  (void)dma::discover_domains(configuration);  // libfabric's initialisation is not a Target's cost
  const std::size_t before = dma::tools::trimmed_resident_bytes();
  for (std::size_t i = 0; i < o.serve; ++i) {
    targets.push_back(std::make_unique<dma::Target>(io, configuration));
    regions.push_back(targets.back()->expose(memory[i]));
  }
  std::printf("rss %zu %zu\n", before, dma::tools::trimmed_resident_bytes());
  for (const auto& region : regions)
    std::printf("%s\n", region.advertisement().to_string().c_str());
  std::fflush(stdout);
  std::thread progress([&] {
    auto guard = asio::make_work_guard(io);
    io.run_for(std::chrono::hours(1));
  });
  char line[16];
  while (std::fgets(line, sizeof line, stdin) != nullptr) {
  }
  io.stop();
  progress.join();
  return 0;
}

struct Source {
  std::span<const std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t) { return {}; }
};
using Service = dma::asynchronous::FabricService<Source>;

// Keeps `depth` writes in flight, round robin over the first `peers` advertisements, until `until`.
class Writer {
 public:
  Writer(Service& service, const std::vector<dma::Advertisement>& peers, std::span<const std::byte> bytes)
      : service_(service), peers_(peers), bytes_(bytes) {}

  // Writes once to each of peers [first, last), one at a time: each opens its connection.
  bool connect(asio::io_context& io, std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) {
      bool done = false, ok = false;
      service_.submit(request(i), [&](std::error_code, dma::Completion<Source> completion) {
        done = true;
        ok = completion.outcome.ok();
        if (!ok) std::cerr << "dma-footprint: write to peer " << i << ": " << completion.outcome.message() << "\n";
      });
      io.restart();
      const auto bound = Clock::now() + std::chrono::seconds(30);
      while (!done && Clock::now() < bound)
        io.run_one_for(std::chrono::milliseconds(100));
      if (!ok) return false;
    }
    return true;
  }

  // Transfers per second over [0, peers) with `depth` in flight for `duration`; -1 on a failure.
  double rate(asio::io_context& io, std::size_t peers, std::size_t depth, std::chrono::nanoseconds duration) {
    active_ = peers;
    next_ = 0;
    completed_ = 0;
    failed_ = false;
    in_flight_ = 0;
    const auto start = Clock::now();
    until_ = start + duration;
    for (std::size_t i = 0; i < depth; ++i)
      issue();
    io.restart();
    const auto bound = until_ + std::chrono::seconds(30);
    while (in_flight_ > 0 && Clock::now() < bound)
      io.run_one_for(std::chrono::milliseconds(100));
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return failed_ || in_flight_ > 0 ? -1.0 : static_cast<double>(completed_) / seconds;
  }

 private:
  dma::TransferRequest<Source> request(std::size_t peer) const {
    dma::TransferRequest<Source> r;
    r.client_id = peer + 1;
    r.set_peer(peers_[peer]);
    r.direction = dma::Direction::ToPeer;
    r.caller_context = Source{bytes_};
    return r;
  }

  void issue() {
    ++in_flight_;
    service_.submit(request(next_), [this](std::error_code, dma::Completion<Source> completion) {
      --in_flight_;
      if (!completion.outcome.ok()) {
        failed_ = true;
        return;
      }
      ++completed_;
      if (!failed_ && Clock::now() < until_) issue();
    });
    next_ = (next_ + 1) % active_;
  }

  Service& service_;
  const std::vector<dma::Advertisement>& peers_;
  std::span<const std::byte> bytes_;
  std::size_t active_ = 1;
  std::size_t next_ = 0;
  std::size_t in_flight_ = 0;
  std::size_t completed_ = 0;
  bool failed_ = false;
  Clock::time_point until_{};
};

struct PeerPoint {
  std::size_t peers = 0;
  double service_mib = 0;   // the service's growth over its idle size, once connected
  double loaded_mib = 0;    // the same after the rate run: rings the provider cycles through are touched
  double per_peer_kib = 0;  // the growth since the previous point, per added peer
  double rate = 0;          // transfers per second
};

struct Report {
  double baseline_mib = 0;
  double libfabric_mib = 0;          // fi_getinfo: libfabric's and its providers' initialisation
  double idle_service_mib = 0;       // one service, no peer
  double target_mib = 0;             // per Target, in this process
  double child_target_mib = 0;       // per Target, in the child processes
  double target_connection_kib = 0;  // what a Target grows by when its first initiator connects and writes
  std::vector<PeerPoint> points;
};

void print_text(const Report& r, const Options& o) {
  std::printf("dma-footprint (dma-libfabric %s, libfabric %s, %s, slim buffers %s)\n",
              std::string(dma::version()).c_str(), dma::fabric_version().c_str(), o.provider.c_str(),
              o.slim ? "on" : "off");
  std::printf("process baseline            %8.1f MiB\n", r.baseline_mib);
  std::printf("libfabric initialised       %8.1f MiB\n", r.libfabric_mib);
  std::printf("idle service                %8.1f MiB\n", r.idle_service_mib);
  std::printf("per Target (%zu, in-process) %8.2f MiB\n", o.targets, r.target_mib);
  if (!r.points.empty()) {
    std::printf("per Target (child process)  %8.2f MiB\n", r.child_target_mib);
    std::printf("a Target's first connection %8.1f KiB\n", r.target_connection_kib);
    std::printf("\n%8s %14s %14s %14s %14s\n", "peers", "service MiB", "KiB/peer", "writes/s", "MiB after");
    for (const auto& p : r.points)
      std::printf("%8zu %14.2f %14.1f %14.0f %14.2f\n", p.peers, p.service_mib, p.per_peer_kib, p.rate, p.loaded_mib);
    std::printf("(%zu B writes, %zu in flight, round robin over the peers, %.2f s per point)\n", o.size, o.depth,
                o.duration);
  }
}

void print_json(const Report& r, const Options& o) {
  std::printf("{\n  \"dma_libfabric\": \"%s\",\n  \"libfabric\": \"%s\",\n  \"provider\": \"%s\",\n",
              std::string(dma::version()).c_str(), dma::fabric_version().c_str(), o.provider.c_str());
  std::printf("  \"slim_buffers\": %s,\n  \"size\": %zu,\n  \"depth\": %zu,\n  \"duration\": %.3f,\n",
              o.slim ? "true" : "false", o.size, o.depth, o.duration);
  std::printf("  \"baseline_mib\": %.2f,\n  \"libfabric_mib\": %.2f,\n  \"idle_service_mib\": %.2f,\n", r.baseline_mib,
              r.libfabric_mib, r.idle_service_mib);
  std::printf("  \"target_mib\": %.3f,\n  \"child_target_mib\": %.3f,\n  \"target_first_connection_kib\": %.1f,\n",
              r.target_mib, r.child_target_mib, r.target_connection_kib);
  std::printf("  \"points\": [");
  for (std::size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    std::printf(
        "%s\n    {\"peers\": %zu, \"service_mib\": %.3f, \"per_peer_kib\": %.1f, \"rate\": %.0f, "
        "\"loaded_service_mib\": %.3f}",
        i == 0 ? "" : ",", p.peers, p.service_mib, p.per_peer_kib, p.rate, p.loaded_mib);
  }
  std::printf("\n  ]\n}\n");
}

// Targets in this process: their cost per Target, measured with libfabric already initialised.
double in_process_targets(const Options& o, const dma::Configuration& configuration) {
  asio::io_context io;
  std::vector<std::unique_ptr<dma::Target>> targets;
  std::vector<std::vector<std::byte>> memory(o.targets, std::vector<std::byte>(region_size));
  std::vector<dma::Target::Region> regions;
  const std::size_t before = dma::tools::trimmed_resident_bytes();
  for (std::size_t i = 0; i < o.targets; ++i) {
    targets.push_back(std::make_unique<dma::Target>(io, configuration));
    regions.push_back(targets.back()->expose(memory[i]));
  }
  return to_mib(dma::tools::trimmed_resident_bytes(), before) / static_cast<double>(o.targets);
}

struct Children {
  std::vector<std::unique_ptr<dma::tools::ChildProcess>> processes;
  std::vector<std::size_t> resident_after_targets;
  std::vector<dma::Advertisement> advertisements;
  double per_target_mib = 0;
};

Children start_children(const std::string& self, const Options& o, std::size_t peers) {
  Children c;
  std::size_t before_total = 0, after_total = 0;
  for (std::size_t hosted = 0; hosted < peers; hosted += o.targets_per_process) {
    const std::size_t count = std::min(o.targets_per_process, peers - hosted);
    std::vector<std::string> arguments = {self, "--serve", std::to_string(count), "--provider", o.provider};
    if (!o.slim) arguments.push_back("--no-slim");
    if (!o.config.empty()) arguments.insert(arguments.end(), {"--config", o.config});
    auto child = std::make_unique<dma::tools::ChildProcess>(std::move(arguments));
    std::size_t before = 0, after = 0;
    const std::string header = child->line(std::chrono::seconds(120));
    if (std::sscanf(header.c_str(), "rss %zu %zu", &before, &after) != 2) {
      throw std::runtime_error("a target process did not start: \"" + header + "\"");
    }
    before_total += before;
    after_total += after;
    c.resident_after_targets.push_back(after);
    for (std::size_t i = 0; i < count; ++i)
      c.advertisements.push_back(dma::Advertisement::parse(child->line()));
    c.processes.push_back(std::move(child));
  }
  c.per_target_mib = to_mib(after_total, before_total) / static_cast<double>(peers);
  return c;
}

int run(const Options& o, const std::string& self) {
  const auto configuration = configuration_for(o);
  Report r;
  const std::size_t baseline = dma::tools::trimmed_resident_bytes();
  r.baseline_mib = static_cast<double>(baseline) / mib;
  (void)dma::discover_domains(configuration);
  const std::size_t initialised = dma::tools::trimmed_resident_bytes();
  r.libfabric_mib = to_mib(initialised, baseline);

  asio::io_context io;
  Service service(io, configuration);
  const std::size_t idle = dma::tools::trimmed_resident_bytes();
  r.idle_service_mib = to_mib(idle, initialised);
  r.target_mib = in_process_targets(o, configuration);

  const std::size_t most = o.peers.empty() ? 0 : o.peers.back();
  if (most > 0) {
    Children children = start_children(self, o, most);
    std::vector<std::byte> bytes(o.size, std::byte{0x5a});
    Writer writer(service, children.advertisements, bytes);
    r.child_target_mib = children.per_target_mib;
    const std::size_t service_idle = dma::tools::trimmed_resident_bytes();
    std::size_t connected = 0;
    std::size_t previous = service_idle;
    for (const std::size_t peers : o.peers) {
      if (!writer.connect(io, connected, peers)) return 1;
      const std::size_t now = dma::tools::trimmed_resident_bytes();
      PeerPoint p;
      p.peers = peers;
      p.service_mib = to_mib(now, service_idle);
      p.per_peer_kib = to_mib(now, previous) * 1024.0 / static_cast<double>(peers - connected);
      previous = now;
      connected = peers;
      p.rate =
          writer.rate(io, peers, o.depth,
                      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(o.duration)));
      if (p.rate < 0) {
        std::cerr << "dma-footprint: a write failed at " << peers << " peers\n";
        return 1;
      }
      p.loaded_mib = to_mib(dma::tools::trimmed_resident_bytes(), service_idle);
      r.points.push_back(p);
    }
    std::size_t grown = 0, accepted = 0;
    for (std::size_t i = 0; i < children.processes.size(); ++i) {
      const std::size_t now = dma::tools::resident_bytes(children.processes[i]->pid());
      grown += now > children.resident_after_targets[i] ? now - children.resident_after_targets[i] : 0;
      accepted += std::min(o.targets_per_process, most - i * o.targets_per_process);
    }
    r.target_connection_kib = static_cast<double>(grown) / 1024.0 / static_cast<double>(accepted);
    for (auto& child : children.processes) {
      child->close_input();
      if (child->wait(std::chrono::seconds(10)) != 0) child->kill_now();
    }
  }
  if (o.json) {
    print_json(r, o);
  } else {
    print_text(r, o);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dma-footprint: resident memory per Target, per service and per peer, and the write rate against "
      "the number of peers (tcp on 127.0.0.1; the peers' Targets in child processes)",
      "dma-footprint"};
  app.set_version_flag("--version", "dma-footprint (dma-libfabric) " + std::string(dma::version()));
  Options o;
  bool no_slim = false;
  app.add_option("--targets", o.targets, "Targets opened in this process to measure one's cost")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--peers", o.peers, "peer counts to measure, ascending, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--targets-per-process", o.targets_per_process, "Targets each child process hosts")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--duration", o.duration, "seconds of writes per peer count")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  app.add_option("--depth", o.depth, "writes in flight")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--size", o.size, "bytes per write")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--provider", o.provider, "tcp or shm (shm reaches at most 256 peers per endpoint)")
      ->check(CLI::IsMember({"tcp", "shm"}))
      ->capture_default_str();
  app.add_flag("--no-slim", no_slim, "turn the slim provider buffers off (dma::ProcessSettings)");
  app.add_option("--config", o.config,
                 "TOML file whose [dma-libfabric] table configures the endpoints; --provider and the 127.0.0.1 "
                 "bind override it");
  app.add_flag("--json", o.json, "print JSON instead of text");
  app.add_option("--serve", o.serve, "internal: host this many Targets")->group("");
  try {
    app.parse(argc, argv);
    if (!std::is_sorted(o.peers.begin(), o.peers.end())) throw CLI::ValidationError("--peers", "must ascend");
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);
    return code == 0 ? 0 : 2;
  }
  if (!o.config.empty()) {
    try {
      o.base = dma::Configuration::from_toml(o.config);
    } catch (const dma::ConfigurationError& error) {
      std::cerr << "dma-footprint: --config: " << error.what() << "\n";
      return 2;
    }
  }
  o.slim = !no_slim;
  if (!dma::set_process_settings(dma::ProcessSettings{.slim_buffers = o.slim})) return 2;
  try {
    if (o.serve > 0) return serve(o);
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    return run(o, n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string(argv[0]));
  } catch (const std::exception& error) {
    std::cerr << "dma-footprint: " << error.what() << "\n";
    return 1;
  }
}
