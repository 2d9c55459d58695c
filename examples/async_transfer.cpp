// One ToPeer write of 4096 bytes of 0xab with the asynchronous service, awaited in a coroutine.
//   async_transfer <bind> [<address-hex> <rkey> <remote-addr>]   (tcp)
//   async_transfer --efa [<address-hex> <rkey> <remote-addr>]     (efa-direct)
#include "common.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <cstdio>
#include <vector>

struct Operation {
  std::vector<std::uint8_t> payload;
  std::span<const std::uint8_t> source() const { return payload; }
};

asio::awaitable<void> transfer(dma::asynchronous::FabricService<Operation>& service, dma::Advertisement peer) {
  auto request = dma::write_to(peer, /*client_id=*/1, Operation{std::vector<std::uint8_t>(4096, 0xab)});
  request.want_checksum = true;

  // as_tuple: a failure comes back as (ec, completion) instead of an exception, with the
  // provider's detail in completion.outcome.
  auto [ec, done] = co_await service.submit(std::move(request), dma::compat::as_tuple(asio::use_awaitable));

  if (!ec) {
    std::printf("wrote %zu of %zu bytes, crc %s\n", done.outcome->bytes, done.caller_context.payload.size(),
                examples::crc_text(done.outcome->checksum).c_str());
  } else {
    std::printf("transfer failed: %s\n", done.outcome.message().c_str());
  }
}

int main(int argc, char** argv) {
  examples::CommandLine command_line(
      "async_transfer", "One ToPeer write of 4096 bytes of 0xab with the asynchronous service, awaited in a coroutine.",
      "[<bind>] [<address-hex> <rkey> <remote-addr>]");
  if (const auto exit = command_line.parse(argc, argv)) return *exit;
  return examples::run_main([&] {
    const auto arguments = command_line.initiator();
    asio::io_context io;
    dma::asynchronous::FabricService<Operation> service(io, arguments.configuration);
    std::printf("local address: %s\n", dma::encode_hex(service.local_address()).c_str());
    std::fflush(stdout);
    const auto peer = examples::peer_or_prompt(arguments);
    asio::co_spawn(io, transfer(service, peer), asio::detached);
    io.run();
    return 0;
  });
}
