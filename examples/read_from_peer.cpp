// One FromPeer read of 4096 bytes with the asynchronous service; run it against `one_target --read`.
//   read_from_peer <bind> [<address-hex> <rkey> <remote-addr>]   (tcp)
//   read_from_peer --efa [<address-hex> <rkey> <remote-addr>]     (efa-direct)
#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <cstdio>
#include <vector>

#include "common.hpp"

asio::awaitable<void> read(dma::asynchronous::FabricService<std::vector<std::uint8_t>>& service,
                           dma::Advertisement peer) {
  // The vector is the landing buffer: allocate(4096) resizes it.
  auto request = dma::read_from(peer, /*client_id=*/1, 4096, std::vector<std::uint8_t>());
  request.want_checksum = true;

  auto [ec, done] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));
  const auto& [bytes, outcome] = done;

  if (!ec) {
    const bool verified = std::all_of(bytes.begin(), bytes.end(), [](std::uint8_t b) { return b == 0xab; });
    std::printf("read %zu bytes, crc %s, payload %s\n", outcome->bytes, examples::crc_text(outcome->checksum).c_str(),
                verified ? "verified" : "IS NOT WHAT THE TARGET SERVED");
  } else {
    std::printf("transfer failed: %s\n", outcome.message().c_str());
  }
}

int main(int argc, char** argv) {
  examples::CommandLine command_line(
      "read_from_peer",
      "One FromPeer read of 4096 bytes with the asynchronous service; run it against `one_target --read`.",
      "[<bind>] [<address-hex> <rkey> <remote-addr>]");
  if (const auto exit = command_line.parse(argc, argv)) return *exit;
  return examples::run_main([&] {
    const auto arguments = command_line.initiator();
    asio::io_context io;
    dma::asynchronous::FabricService<std::vector<std::uint8_t>> service(io, arguments.configuration);
    std::printf("local address: %s\n", dma::encode_hex(service.local_address()).c_str());
    std::fflush(stdout);
    const auto peer = examples::peer_or_prompt(arguments);
    asio::co_spawn(io, read(service, peer), asio::detached);
    io.run();
    return 0;
  });
}
