#include <dma/dma.hpp>  // before any Asio header (see "clang 14")

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

using Bytes = std::vector<std::uint8_t>;
using Service = dma::asynchronous::FabricService<Bytes>;

// Writes 4 KiB of 0xab into the peer's buffer, then reads it back with a checksum.
asio::awaitable<bool> write_then_read(Service& service, dma::Advertisement peer) {
  dma::TransferRequest<Bytes> write;
  write.client_id = 1;
  write.set_peer(peer);
  write.direction = dma::Direction::ToPeer;
  write.caller_context = Bytes(4096, 0xab);
  auto [sent, written] = co_await service.submit(std::move(write));
  std::printf("write: %s, %zu bytes\n", written.message().c_str(), written->bytes);
  if (!written) co_return false;

  dma::TransferRequest<Bytes> read;
  read.client_id = 1;
  read.set_peer(peer);
  read.direction = dma::Direction::FromPeer;
  read.length = 4096;
  read.want_checksum = true;
  auto [landed, outcome] = co_await service.submit(std::move(read));
  if (!outcome) {
    std::printf("read failed: %s\n", outcome.message().c_str());
    co_return false;
  }
  std::printf("read %zu bytes (first 0x%02x), crc 0x%08x\n", landed.size(), landed[0], *outcome->checksum);
  co_return true;
}

int main() {
  dma::Configuration configuration;
  configuration.bind = "127.0.0.1";  // tcp on this machine

  // The peer. Normally another process; here a Target progressed by its own thread.
  asio::io_context target_io;
  dma::Target target(target_io, configuration);
  std::vector<std::byte> buffer(1 << 20);
  dma::Target::Region region = target.expose(buffer);
  std::thread target_thread([&] { target_io.run(); });
  const std::string text = region.advertisement().to_string();  // what travels over your channel

  // The server.
  const dma::Advertisement peer = dma::Advertisement::parse(text);
  asio::io_context io;
  Service service(io, configuration);
  bool ok = false;
  asio::co_spawn(io, write_then_read(service, peer), [&](std::exception_ptr error, bool result) {
    if (error) std::rethrow_exception(error);
    ok = result;
  });
  io.run();

  target_io.stop();
  target_thread.join();
  return ok ? 0 : 1;
}
