// The main demo: a Target and an asynchronous FabricService in one process over tcp on 127.0.0.1.
// Writes at least 1 GiB into the target and reads at least 1 GiB back, verifying every byte.
//   loopback [--config FILE] [<bind>] [<mebibytes-each-way>]      (--help, --version)
#include <dma/dma.hpp>
#include <dma/version.hpp>

#include <CLI/CLI.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr std::size_t chunk = std::size_t{1} << 20;  // one transfer
constexpr std::size_t region_size = 64 * chunk;      // the target's exposed buffer
constexpr int depth = 16;                            // transfers in flight

// The context of one transfer: a slice of a buffer the demo owns.
struct Slice {
  std::span<std::byte> bytes;
  std::span<const std::byte> source() const { return bytes; }
  std::span<std::byte> allocate(std::size_t) const { return bytes; }
};

void fill(std::span<std::byte> bytes, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
}

struct Totals {
  std::size_t bytes = 0;
  std::size_t transfers = 0;
  std::size_t errors = 0;
  std::size_t mismatches = 0;
  double seconds = 0;
};

// Moves one region's worth in `depth` parallel lanes, each awaiting its own transfers.
asio::awaitable<void> lane(dma::asynchronous::FabricService<Slice>& service, const dma::Advertisement& peer,
                           dma::Direction direction, std::span<std::byte> local, int first, Totals& totals) {
  for (std::size_t index = static_cast<std::size_t>(first); index < region_size / chunk; index += depth) {
    dma::TransferRequest<Slice> request;
    request.client_id = 1;
    request.peer_address = peer.address;
    request.remote_key = peer.remote_key;
    request.remote_address = peer.remote_address + index * chunk;
    request.direction = direction;
    request.length = chunk;
    request.caller_context = Slice{local.subspan(index * chunk, chunk)};
    auto [ec, done] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));
    const auto& outcome = done.outcome;
    ++totals.transfers;
    if (!ec) {
      totals.bytes += outcome->bytes;
    } else {
      if (totals.errors++ == 0) std::fprintf(stderr, "transfer failed: %s\n", outcome.message().c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "The loopback demo: a Target and an asynchronous FabricService in one process, writing and reading "
      "back at least 1 GiB each way over tcp, every byte verified.",
      "loopback");
  app.set_version_flag("--version", "loopback (dma-libfabric) " + std::string(dma::version()));
  std::string bind = "127.0.0.1";
  std::size_t mebibytes = 1024;
  std::string config;
  app.add_option("--config", config,
                 "TOML file whose [dma-libfabric] table configures both sides; <bind> overrides its bind");
  app.add_option("bind", bind, "the address both sides bind to (default: the file's, else 127.0.0.1)")
      ->capture_default_str();
  app.add_option("mebibytes", mebibytes, "MiB to move each way (rounded up to whole 64 MiB rounds)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  const std::size_t rounds = (mebibytes * chunk + region_size - 1) / region_size;

  dma::Configuration configuration;
  if (!config.empty()) {
    try {
      configuration = dma::Configuration::from_toml(config);
    } catch (const dma::ConfigurationError& error) {
      std::fprintf(stderr, "loopback: --config: %s\n", error.what());
      return 2;
    }
  }
  if (app.count("bind") != 0 || !configuration.bind) configuration.bind = bind;

  try {
    // The target runs on its own thread, as a separate peer would.
    auto target_thread = dma::TargetThread::start(configuration);
    dma::Target& target = target_thread->target();

    std::vector<std::byte> remote(region_size);
    auto region = target.expose(remote);
    std::vector<std::byte> local(region_size);
    std::vector<std::byte> expected(region_size);

    asio::io_context io;
    dma::asynchronous::FabricService<Slice> service(io, configuration);
    std::printf("target %s, service %s, %zu MiB each way in %zu KiB transfers, %d in flight\n",
                dma::encode_hex(target.local_address()).c_str(), dma::encode_hex(service.local_address()).c_str(),
                rounds * region_size / chunk, chunk / 1024, depth);

    Totals writes, reads;
    // Only the transfers are timed: filling and checking the buffers between rounds is not.
    auto run = [&](dma::Direction direction, Totals& totals) {
      for (std::size_t r = 0; r < rounds; ++r) {
        // Writes: the local pattern must land in the target. Reads: the target's pattern must land here.
        std::span<std::byte> source = direction == dma::Direction::ToPeer ? std::span(local) : std::span(remote);
        fill(source, r * 2 + (direction == dma::Direction::ToPeer ? 0 : 1));
        std::memcpy(expected.data(), source.data(), region_size);
        std::memset(direction == dma::Direction::ToPeer ? remote.data() : local.data(), 0, region_size);
        for (int i = 0; i < depth; ++i) {
          asio::co_spawn(io, lane(service, region.advertisement(), direction, local, i, totals), asio::detached);
        }
        io.restart();
        const auto start = std::chrono::steady_clock::now();
        io.run();  // returns when every lane has finished
        totals.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const auto& landed = direction == dma::Direction::ToPeer ? remote : local;
        if (std::memcmp(landed.data(), expected.data(), region_size) != 0) ++totals.mismatches;
      }
    };
    run(dma::Direction::ToPeer, writes);
    run(dma::Direction::FromPeer, reads);

    target_thread->pause();

    auto report = [](const char* what, const Totals& t) {
      std::printf("%-6s %8.2f GB/s %10.0f transfers/s  %zu transfers, %zu bytes, errors: %zu, mismatched rounds: %zu\n",
                  what, static_cast<double>(t.bytes) / t.seconds / 1e9, static_cast<double>(t.transfers) / t.seconds,
                  t.transfers, t.bytes, t.errors, t.mismatches);
    };
    report("write", writes);
    report("read", reads);
    const std::size_t errors = writes.errors + reads.errors + writes.mismatches + reads.mismatches;
    std::printf("errors: %zu\n", errors);
    return errors == 0 ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return 1;
  }
}
