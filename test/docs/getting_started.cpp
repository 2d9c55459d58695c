#include <dma/dma.hpp>  // before any Asio header (see "clang 14")

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <exception>
#include <vector>

using Bytes = std::vector<std::uint8_t>;
using Service = dma::asynchronous::FabricService<Bytes>;

// Writes 4 KiB of 0xab into the peer's buffer, then reads it back with a checksum.
asio::awaitable<bool> write_then_read(Service& service, dma::Advertisement peer) {
  // as_tuple: a failure comes back as (ec, completion) instead of a thrown std::system_error.
  auto write = dma::write_to(peer, /*client_id=*/1, Bytes(4096, 0xab));
  auto [write_error, written] = co_await service.submit(std::move(write), dma::compat::as_tuple(asio::use_awaitable));
  std::printf("write: %s, %zu bytes\n", written.outcome.message().c_str(), written.outcome->bytes);
  if (write_error) co_return false;

  auto read = dma::read_from(peer, /*client_id=*/1, 4096, Bytes());
  read.want_checksum = true;
  auto [read_error, landed] = co_await service.submit(std::move(read), dma::compat::as_tuple(asio::use_awaitable));
  if (read_error) {
    std::printf("read failed: %s\n", landed.outcome.message().c_str());
    co_return false;
  }
  const Bytes& bytes = landed.caller_context;
  std::printf("read %zu bytes (first 0x%02x), crc 0x%08x\n", bytes.size(), bytes[0], *landed.outcome->checksum);
  co_return true;
}

int main() {
  dma::Configuration configuration;
  configuration.bind = "127.0.0.1";  // tcp on this machine

  // The peer. Normally another process; here a Target progressed by a thread of its own.
  auto target = dma::TargetThread::start(configuration);
  std::vector<std::byte> buffer(1 << 20);
  dma::Target::Region region = target->expose(buffer);
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
  return ok ? 0 : 1;
}
