// dma-connect: what the first transfer to a new peer costs, with and without add_peer()'s warm-up.
// Each trial opens a fresh Target (a new address, so a new connection), optionally awaits
// add_peer(client, advertisement), then times one write (the first), `--steady` more (their
// median is the steady state) and, after a pause of `--idle-ms`, one more: a write on a warm
// connection to a target that went back to waiting on its fd, which is what the first write after
// add_peer meets too. The trials alternate between the two ways, so both see the same machine.
#include <dma/dma.hpp>
#include <dma/version.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int trials = 20;
  int steady = 100;
  std::size_t size = 64;
  std::string config;
  std::string target_wait = "adaptive";
  int idle_ms = 20;
  bool json = false;
};

struct Payload {
  std::vector<std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
};
using Service = dma::asynchronous::FabricService<Payload>;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

struct Trial {
  double warm_up_us = 0;  ///< how long add_peer took (0 without it)
  double first_us = 0;
  double steady_us = 0;  ///< median of the steady writes
  double idle_us = 0;    ///< the write after the pause
};

// A Target with one region, progressed on a thread of its own.
class Peer {
 public:
  Peer(const dma::Configuration& configuration, std::size_t size)
      : thread_(dma::TargetThread::start(configuration)), memory_(size) {
    region_ = thread_->expose(memory_);
  }
  const dma::Advertisement& advertisement() const { return region_.advertisement(); }

 private:
  std::unique_ptr<dma::TargetThread> thread_;
  std::vector<std::byte> memory_;
  dma::Target::Region region_;
};

asio::awaitable<Trial> trial(Service& service, const Options& o, const dma::Configuration& configuration,
                             std::uint64_t client, bool warm) {
  Peer peer(configuration, o.size);
  Trial t;
  if (warm) {
    const auto start = Clock::now();
    co_await service.add_peer(client, peer.advertisement());
    t.warm_up_us = micros(Clock::now() - start);
  }
  std::vector<double> steady;
  for (int i = 0; i <= o.steady + 1; ++i) {
    if (i == o.steady + 1) std::this_thread::sleep_for(std::chrono::milliseconds(o.idle_ms));
    dma::TransferRequest<Payload> request;
    request.client_id = client;
    request.set_peer(peer.advertisement());
    request.direction = dma::Direction::ToPeer;
    request.caller_context.bytes.assign(o.size, std::byte{0x5a});
    const auto start = Clock::now();
    auto [ec, done] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));
    const double took = micros(Clock::now() - start);
    if (ec) throw std::system_error(ec, "write " + std::to_string(i) + ": " + done.outcome.message());
    if (i == 0) {
      t.first_us = took;
    } else if (i == o.steady + 1) {
      t.idle_us = took;
    } else {
      steady.push_back(took);
    }
  }
  service.remove_peer(client);
  t.steady_us = median(steady);
  co_return t;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("What the first write to a new peer costs, with and without add_peer()'s warm-up", "dma-connect");
  app.set_version_flag("--version", "dma-connect (dma-libfabric) " + std::string(dma::version()));
  app.add_option("--trials", o.trials, "trials of each kind, alternating")->check(CLI::Range(1, 10000));
  app.add_option("--steady", o.steady, "writes after the first in each trial")->check(CLI::Range(1, 100000));
  app.add_option("--size", o.size, "bytes per write")->check(CLI::Range(std::size_t{1}, std::size_t{1} << 30));
  app.add_option("--target-wait", o.target_wait, "how the Target waits for its completions")
      ->check(CLI::IsMember({"fd", "adaptive", "busy-poll"}))
      ->capture_default_str();
  app.add_option("--idle-ms", o.idle_ms, "pause before the last write of a trial, ms")
      ->check(CLI::Range(0, 10000))
      ->capture_default_str();
  app.add_option("--config", o.config,
                 "TOML file whose [dma-libfabric] table configures both sides (bound to 127.0.0.1)");
  app.add_flag("--json", o.json, "print JSON instead of a table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  dma::Configuration configuration;
  if (!o.config.empty()) {
    try {
      configuration = dma::Configuration::from_toml(o.config);
    } catch (const dma::ConfigurationError& error) {
      std::fprintf(stderr, "dma-connect: --config: %s\n", error.what());
      return 2;
    }
  }
  configuration.bind = "127.0.0.1";  // loopback only, like the tests
  dma::Configuration target_configuration = configuration;
  target_configuration.wait_mode = dma::from_string<dma::WaitMode>(o.target_wait).value_or(dma::WaitMode::adaptive);
  asio::io_context io;
  Service service(io, configuration);
  std::vector<Trial> cold, warm;
  std::exception_ptr failure;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < o.trials; ++i) {
          const auto client = static_cast<std::uint64_t>(2 * i);
          cold.push_back(co_await trial(service, o, target_configuration, client, false));
          warm.push_back(co_await trial(service, o, target_configuration, client + 1, true));
        }
      },
      [&](std::exception_ptr e) { failure = e; });
  io.run();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "dma-connect: %s\n", error.what());
      return 1;
    }
  }
  auto column = [](const std::vector<Trial>& trials, double Trial::*field) {
    std::vector<double> values;
    for (const auto& t : trials)
      values.push_back(t.*field);
    return values;
  };
  auto maximum = [](std::vector<double> values) { return *std::max_element(values.begin(), values.end()); };
  const double cold_first = median(column(cold, &Trial::first_us));
  const double warm_first = median(column(warm, &Trial::first_us));
  const double steady = median(column(warm, &Trial::steady_us));
  const double warm_up = median(column(warm, &Trial::warm_up_us));
  const double idle = median(column(warm, &Trial::idle_us));
  // Each trial's first write against its own steady state, so slow and fast moments of the machine
  // do not mix; the median over trials.
  auto ratios = [](const std::vector<Trial>& trials) {
    std::vector<double> values;
    for (const auto& t : trials)
      values.push_back(t.steady_us > 0 ? t.first_us / t.steady_us : 0.0);
    return median(values);
  };
  if (o.json) {
    std::printf(
        "{\"trials\": %d, \"size\": %zu, \"first_us\": {\"without_add_peer\": %.1f, \"without_add_peer_max\": %.1f, "
        "\"after_add_peer\": %.1f, \"after_add_peer_max\": %.1f}, \"add_peer_us\": %.1f, \"steady_us\": %.1f, "
        "\"after_idle_us\": %.1f, \"first_over_steady\": {\"without_add_peer\": %.1f, \"after_add_peer\": %.2f}, "
        "\"first_after_add_peer_over_after_idle\": %.2f, \"target_wait\": \"%s\"}\n",
        o.trials, o.size, cold_first, maximum(column(cold, &Trial::first_us)), warm_first,
        maximum(column(warm, &Trial::first_us)), warm_up, steady, idle, ratios(cold), ratios(warm),
        idle > 0 ? warm_first / idle : 0.0, o.target_wait.c_str());
    return 0;
  }
  std::printf("%d trials of each, %zu B writes (medians; max in brackets), µs\n", o.trials, o.size);
  std::printf("first write, no add_peer:     %10.1f  (%.1f)\n", cold_first, maximum(column(cold, &Trial::first_us)));
  std::printf("add_peer (warm-up) took:      %10.1f\n", warm_up);
  std::printf("first write after add_peer:   %10.1f  (%.1f)\n", warm_first, maximum(column(warm, &Trial::first_us)));
  std::printf("steady-state write:           %10.1f\n", steady);
  std::printf("write after %d ms idle:       %10.1f\n", o.idle_ms, idle);
  std::printf("first / steady, no add_peer:  %10.1f  (per trial, median)\n", ratios(cold));
  std::printf("first / steady, after add_peer: %8.2f  (per trial, median)\n", ratios(warm));
  std::printf("first after add_peer / idle:   %9.2f\n", idle > 0 ? warm_first / idle : 0.0);
  return 0;
}
