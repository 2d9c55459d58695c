// A passive peer for the fault tests: exposes a buffer, prints its advertisement and keeps
// driving progress until it is killed (or after 600 s).
//   fault-target [--bind A] [--port P] [--size N]
#include <dma/dma.hpp>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  dma::Configuration configuration;
  configuration.bind = "127.0.0.1";
  std::size_t size = 1 << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--bind") {
      configuration.bind = argv[i + 1];
    } else if (flag == "--port") {
      configuration.port = static_cast<std::uint16_t>(std::strtoul(argv[i + 1], nullptr, 10));
    } else if (flag == "--size") {
      size = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "fault-target: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  try {
    asio::io_context io;
    dma::Target target(io, configuration);
    std::vector<std::byte> buffer(size);
    const auto region = target.expose(buffer);
    std::printf("advertisement: %s\n", region.advertisement().to_string().c_str());
    std::fflush(stdout);
    asio::steady_timer stop(io, std::chrono::seconds(600));
    stop.async_wait([&](std::error_code) { io.stop(); });
    io.run();
  } catch (const std::exception& error) {
    std::printf("error: %s\n", error.what());
    return 1;
  }
  return 0;
}
